r"""``token``: single-draft speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Algorithm (one draft ``x ~ q``; what :func:`verify` does, step by step)
----------------------------------------------------------------------
1. Draw ``u_accept ~ U[0, 1)``. Accept (output ``x``) iff ``u_accept * q(x) < p(x)``, i.e.
   with probability :math:`\min(1, p(x)/q(x))` (written without a division so that
   ``q(x)`` near underflow is handled exactly).
2. Otherwise draw ``u_resid ~ U[0, 1)`` and output the inverse-CDF draw (token order
   ``0..V-1``, first index whose cumulative weight exceeds ``u_resid * total``) from the
   residual :math:`r = (p - q)_+ / \sum_y (p - q)_+(y)`.

Exact law
---------
.. math::

    \pi(x, y) = \min(p(x), q(x))\,\mathbf 1[x = y] + (q(x) - p(x))_+\, r(y),

whose rows sum to ``q`` and columns to ``p`` because
:math:`\sum_x (q - p)_+ = \sum_y (p - q)_+ = \mathrm{TV}(p, q)`. The acceptance is
:math:`\sum_x \min(p, q) = 1 - \mathrm{TV}(p, q)`, which is the maximal-coupling optimum
for ``k = 1``: the rule is optimal.

:data:`TOKEN_NO_RESIDUAL` is a deliberately broken variant (resamples from ``p`` instead
of the residual after a rejection). Its output law is
:math:`\min(p, q) + \mathrm{TV}(p, q)\, p \ne p` unless ``p == q``; it exists only as a
negative control for the validation harness.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._base import Rule, categorical, prepare, require_supported, residual, sample_uniform

__all__ = ["acceptance", "joint", "sample", "verify", "bound", "RULE", "TOKEN_NO_RESIDUAL"]

BOUND_TEXT = "= 1 - TV(p, q) (optimal for k = 1: maximal coupling)"


def _supports(k: int, replacement: bool) -> bool:
    return k == 1


def acceptance(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> float:
    r""":math:`\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`."""
    require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    return float(np.minimum(pa, qa).sum())


def joint(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> np.ndarray:
    r"""Exact law ``[V, V]`` of (draft, output).

    :math:`\mathrm{diag}(\min(p,q)) + (q-p)_+ r^\top`.
    """
    require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    r, _ = residual(pa, qa)
    J = np.outer(np.maximum(qa - pa, 0.0), r)
    J[np.diag_indices_from(J)] += np.minimum(pa, qa)
    return J


def verify(p: np.ndarray, q: np.ndarray, x: int, u_accept: float, u_resid: float) -> int:
    """Deterministic core: one draft ``x``, explicit uniforms (inputs assumed validated)."""
    if u_accept * q[x] < p[x]:
        return int(x)
    r, mass = residual(p, q)
    if mass <= 0.0:  # p == q: rejection has probability 0; keep the draft
        return int(x)
    return categorical(r, u_resid)


def sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    """One speculative-sampling step on ``drafts = [x]``."""
    pa, qa, d = prepare(p, q, drafts)
    require_supported(RULE, d.size, replacement)
    u1 = sample_uniform(rng)
    u2 = sample_uniform(rng)
    return verify(pa, qa, int(d[0]), u1, u2)


def bound(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, float]:
    a = acceptance(p, q, k, replacement=replacement)
    return (a, a)


RULE = Rule(
    name="token",
    support_text="token verification takes exactly one draft (k = 1)",
    bound_text=BOUND_TEXT,
    _supports=_supports,
    _acceptance=acceptance,
    _joint=joint,
    _sample=sample,
    _bound=bound,
)


# ---------------------------------------------------------------- negative control
def _broken_joint(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> np.ndarray:
    pa, qa, _ = prepare(p, q)
    J = np.outer(np.maximum(qa - pa, 0.0), pa)  # resample from p, not the residual
    J[np.diag_indices_from(J)] += np.minimum(pa, qa)
    return J


def _broken_sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    pa, qa, d = prepare(p, q, drafts)
    x = int(d[0])
    if sample_uniform(rng) * qa[x] < pa[x]:
        return x
    return categorical(pa, sample_uniform(rng))


#: Deliberately NOT lossless (no residual correction): the harness must flag it.
TOKEN_NO_RESIDUAL = Rule(
    name="token_no_residual",
    support_text="negative control, k = 1",
    bound_text="(broken on purpose: output law != p)",
    _supports=_supports,
    _acceptance=acceptance,
    _joint=_broken_joint,
    _sample=_broken_sample,
    _bound=bound,
)
