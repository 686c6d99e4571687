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

Along a block (Leviathan et al.'s speculative decoding) the rule is applied position by
position, accepting while the draft is the output (:mod:`coupling.rules.walk`): the first
rejection emits the residual draw and ends the call; ``gamma`` acceptances earn the bonus
token from the last target law.

:data:`NO_RESIDUAL` is a deliberately broken variant (resamples from ``p`` instead of the
residual after a rejection). Its output law is :math:`\min(p, q) + \mathrm{TV}(p, q)\, p \ne p`
unless ``p == q``; it exists only as a negative control for the validation harnesses.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ...lm import check_path
from ..base import Rule
from ..common import categorical, normalise, residual

__all__ = ["acceptance", "joint", "verify", "chain_step", "path_law", "Token", "RULE",
           "NO_RESIDUAL"]


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    r""":math:`\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`."""
    return float(np.minimum(p, q).sum())


def joint(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r"""Exact law ``[V, V]`` of (draft, output),
    :math:`\mathrm{diag}(\min(p,q)) + (q-p)_+ r^\top`."""
    r, _ = residual(p, q)
    J = np.outer(np.maximum(q - p, 0.0), r)
    J[np.diag_indices_from(J)] += np.minimum(p, q)
    return J


def verify(p: np.ndarray, q: np.ndarray, x: int, u_accept: float, u_resid: float) -> int:
    """Deterministic core: one draft ``x``, explicit uniforms (validated laws)."""
    if u_accept * q[x] < p[x]:
        return int(x)
    # (p - q)_+ has no mass only through rounding (with p == q no draft is rejected); the
    # residual is then p itself, as in joint: never a token of zero target probability
    r, _ = residual(p, q)
    return categorical(r, u_resid)


def chain_step(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(min(p, q), (p - q)_+)``: the draft survives as ``y`` / the call ends on ``y``. Exact on
    Fraction laws too (the proofs' arithmetic)."""
    return np.minimum(p, q), np.maximum(p - q, 0 * p)


def path_law(x: np.ndarray, P: np.ndarray, Q: np.ndarray, *,
             resample_target: bool = False) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact law of one call along a validated drafted path: ``(tau [gamma + 1],
    next [gamma + 1, V])``, :math:`P(\tau = i) = \prod_{j \le i} a_j (1 - a_{i+1})` with
    :math:`a_j = \min(1, p_j(x_j)/q_j(x_j))`, and the law of the emitted token given
    :math:`\tau = i`: the residual, or the bonus law :math:`p_{\gamma+1}` (float64, or exact
    Fractions). ``resample_target`` is the negative control's bug (``p`` after a rejection)."""
    gamma = x.size
    one = Fraction(1) if P.dtype == object else 1.0
    a = [min(one, P[i, x[i]] / Q[i, x[i]]) for i in range(gamma)]
    tau, run = [], one
    for i in range(gamma):
        tau.append(run * (one - a[i]))
        run = run * a[i]
    tau.append(run)
    nxt = [P[i] if resample_target else normalise(np.maximum(P[i] - Q[i], 0 * one), P[i])
           for i in range(gamma)]
    nxt.append(P[gamma])
    dt = object if P.dtype == object else np.float64
    return np.array(tau, dtype=dt), np.stack(nxt).astype(dt)


class Token(Rule):
    """Speculative sampling: accept the draft with probability ``min(1, p/q)``, else draw the
    residual."""

    name = "token"
    twin = "coupling.rules.token.torch"
    greedy_ok = True
    title = "speculative sampling"
    reference = "Leviathan et al. 2023; Chen et al. 2023"
    max_drafts = 1
    bound_text = "= 1 - TV(p, q) (optimal for k = 1: maximal coupling)"

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q)

    def _joint(self, p, q, k, replacement):
        return joint(p, q)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, int(drafts[0]), float(u[0]), float(u[1]))

    def _bound(self, p, q, k, replacement):
        a = acceptance(p, q)
        return a, a

    def chain_step(self, p, q):
        return chain_step(p, q)

    #: the negative control's bug (:data:`NO_RESIDUAL`)
    resample_target = False

    def try_law(self, p: np.ndarray, q: np.ndarray, drafts: np.ndarray,
                replacement: bool = True) -> np.ndarray:
        """``[a, 1 - a]``, ``a = min(1, p(x) / q(x))``: the draft's acceptance given it."""
        x = int(np.asarray(drafts).reshape(-1)[0])
        a = min(1.0, float(p[x]) / float(q[x])) if q[x] > 0 else 0.0
        return np.array([a, 1.0 - a])

    def path_law(self, drafts, p_path, q_path) -> tuple[np.ndarray, np.ndarray]:
        """:func:`path_law` on validated inputs (float64, or exact Fractions)."""

        return path_law(*check_path(drafts, p_path, q_path),
                        resample_target=self.resample_target)


class NoResidual(Token):
    """Negative control: after a rejection, resample from ``p`` instead of the residual."""

    name = "token_no_residual"
    title = "broken on purpose: resamples from p after a rejection"
    lossless = False
    resample_target = True
    bound_text = "(broken on purpose: output law != p)"

    def _joint(self, p, q, k, replacement):
        J = np.outer(np.maximum(q - p, 0.0), p)
        J[np.diag_indices_from(J)] += np.minimum(p, q)
        return J

    def _verify(self, p, q, drafts, u, replacement):
        x = int(drafts[0])
        if u[0] * q[x] < p[x]:
            return x
        return categorical(p, float(u[1]))

    def chain_step(self, p, q):
        over = np.maximum(q - p, 0 * p)      # P(draft y, reject it); the diagonal of the joint
        return np.minimum(p, q) + over * p, p * (over.sum() - over)

    twin = None  # a negative control has no torch twin


RULE = Token()
#: Deliberately NOT lossless (no residual correction): the harnesses must flag it.
NO_RESIDUAL = NoResidual()
