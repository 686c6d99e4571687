r"""``kseq``: SpecTr's k-sequential selection (Sun et al., NeurIPS 2023, "SpecTr: Fast
Speculative Decoding via Optimal Transport", Algorithm "K-SEQ").

Setting: ``k`` i.i.d. drafts :math:`x_1, \dots, x_k \sim q` (with replacement only).

Algorithm (what :func:`verify` does, step by step)
--------------------------------------------------
Fix :math:`\rho \ge 1` (below) and let :math:`a(x) = \min(1, p(x) / (\rho\, q(x)))`.

1. For ``i = 1..k``: draw ``u_i ~ U[0,1)``; if ``u_i * rho * q(x_i) < p(x_i)`` output
   ``x_i`` and stop.
2. If every draft was rejected, draw ``u_res ~ U[0,1)`` and output the inverse-CDF draw
   from the residual

.. math::

    p_{\mathrm{res}}(y) = \frac{p(y) - c\,\min(q(y), p(y)/\rho)}{(1-\beta)^k},\qquad
    \beta = \sum_y \min(q(y), p(y)/\rho),\quad c = \frac{1 - (1-\beta)^k}{\beta}.

Why it is lossless: a draft is accepted at step ``i`` with token law
:math:`(1-\beta)^{i-1} \min(q, p/\rho)`; summing over ``i`` gives
:math:`c \min(q, p/\rho)`, and the residual supplies the rest of ``p`` with the remaining
mass :math:`(1-\beta)^k`. The residual is a distribution iff :math:`c \le \rho`
(tokens with :math:`p/q < \rho` need :math:`p \ge c\,p/\rho`; the others then satisfy
:math:`p \ge \rho q \ge c q`), i.e. iff

.. math:: g(\rho) = \rho\beta(\rho) - \big(1 - (1-\beta(\rho))^k\big) \ge 0 .

Choice of rho: ``g`` is non-decreasing in ``rho`` (:math:`\rho\beta = \sum\min(\rho q, p)`
grows, :math:`\beta` shrinks), ``g(rho) < 0`` for ``rho < 1`` when :math:`\beta > 0`, and
``g(k) >= 0`` (Bernoulli: :math:`1 - (1-\beta)^k \le k\beta`). The acceptance
:math:`1 - (1-\beta(\rho))^k` decreases in ``rho``, so the best valid choice is the
smallest root :math:`\rho^\star \in [1, k]` of ``g``. :func:`optimal_rho` finds it
exactly up to rounding, working with the equivalent O(1)-scaled margin
:math:`h(\rho) = \rho - c(\beta(\rho))` (same sign as ``g`` when :math:`\beta > 0`; ``g``
itself cancels catastrophically when :math:`\beta` is tiny), with
:math:`c = \sum_{i<k} (1-\beta)^i` computed as a geometric sum: ``h`` is evaluated at the
sorted breakpoints ``p(x)/q(x)`` in ``(1, k)`` (O(V log V), one sort and cumulative sums),
and on the bracketing segment the root is polished by Brent's method and stepped up
(1 ulp, 2, 4, ...) until ``h >= 0`` in floating point (``h(k) >= 0`` always holds).
The acceptance is reported as :math:`\beta c` (no cancellation).
For ``k = 1``, :math:`\rho^\star = 1` and the rule is ``token``.

For a torch twin: ``rho`` and the residual depend only on ``(p, q, k)``; compute them once
per step (``optimal_rho``, ``residual_law``), then run the accept loop of :func:`verify`.

Guarantee (Sun et al. 2023, abstract and Theorem on K-SEQ): acceptance
:math:`\ge (1 - 1/e)` times the optimal (LP) acceptance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from ..dist import tuple_law
from ._base import Rule, categorical, prepare, require_supported, sample_uniform

__all__ = [
    "acceptance",
    "joint",
    "sample",
    "verify",
    "bound",
    "optimal_rho",
    "residual_law",
    "RULE",
]

APPROX = 1.0 - math.exp(-1.0)
BOUND_TEXT = ">= (1 - 1/e) * OPT (Sun et al. 2023, SpecTr, NeurIPS: K-SEQ approximation guarantee)"


def _supports(k: int, replacement: bool) -> bool:
    return k >= 1 and replacement


def _beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    return float(np.minimum(q, p / rho).sum())


def _c(beta, k: int):
    r""":math:`c = (1 - (1-\beta)^k)/\beta = \sum_{i<k} (1-\beta)^i` as a geometric sum: no
    cancellation when :math:`\beta` is tiny (the quotient form loses all digits there)."""
    x = 1.0 - np.asarray(beta, dtype=np.float64)
    term = np.ones_like(x)
    c = np.zeros_like(x)
    for _ in range(k):
        c = c + term
        term = term * x
    return c


def _h(p: np.ndarray, q: np.ndarray, k: int, rho: float) -> float:
    """Validity margin ``rho - c(beta(rho))``: the residual is a distribution iff ``>= 0``
    (same sign as ``g = rho beta - (1 - (1-beta)^k)`` when beta > 0, but O(1)-scaled)."""
    return float(rho - _c(_beta(p, q, rho), k))


def optimal_rho(p: ArrayLike, q: ArrayLike, k: int) -> float:
    r"""Smallest :math:`\rho \ge 1` whose K-SEQ residual is a distribution (see module doc)."""
    pa, qa, _ = prepare(p, q)
    return _optimal_rho(pa, qa, int(k))


def _optimal_rho(p: np.ndarray, q: np.ndarray, k: int) -> float:
    if k == 1 or _beta(p, q, 1.0) <= 0.0:
        return 1.0  # k = 1 is token; disjoint supports accept nothing for any rho
    if _h(p, q, k, 1.0) >= 0.0:
        return 1.0
    # breakpoints of beta(rho): the ratios p/q inside (1, k)
    m = q > 0
    r_all = np.where(m, p / np.where(m, q, 1.0), np.inf)
    ratios = np.unique(r_all[m])
    bps = np.concatenate([[1.0], ratios[(ratios > 1.0) & (ratios < k)], [float(k)]])
    # beta at every breakpoint from one sort: q-mass with ratio >= rho plus p-mass below / rho
    order = np.argsort(r_all)
    rs, ps, qs = r_all[order], p[order], q[order]
    cp = np.concatenate([[0.0], np.cumsum(ps)])
    cq_tail = np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]])
    idx = np.searchsorted(rs, bps, side="left")  # number of tokens with ratio < rho
    hv = bps - _c(cq_tail[idx] + cp[idx] / bps, k)
    hv[-1] = max(hv[-1], 0.0)  # c <= k always: rho = k is valid (rounding cannot say otherwise)
    j = int(np.argmax(hv >= 0.0))
    if j == 0:
        return 1.0
    lo, hi = float(bps[j - 1]), float(bps[j])
    if _h(p, q, k, lo) >= 0.0:  # the cumsum estimate and the direct sum disagree by rounding
        return lo
    if _h(p, q, k, hi) < 0.0:  # same, on the other side: start the upward search at hi
        rho = hi
    else:
        rho = brentq(lambda r: _h(p, q, k, r), lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    # the root may sit an ulp below the true root: step up (1 ulp, 2, 4, ...) until the
    # margin is non-negative in floating point (rho = k always is)
    step = np.finfo(float).eps * rho
    while _h(p, q, k, rho) < 0.0 and rho < k:
        rho = min(float(k), rho + step)
        step *= 2.0
    return float(rho)


def _params(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, np.ndarray, float]:
    rho = _optimal_rho(p, q, k)
    # acceptance probability of each token when drafted: min(1, p / (rho q))
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q > 0, np.minimum(1.0, p / (rho * np.where(q > 0, q, 1.0))), 0.0)
    beta = _beta(p, q, rho)
    return rho, a, beta


def residual_law(p: ArrayLike, q: ArrayLike, k: int) -> np.ndarray:
    """The K-SEQ residual :math:`p_{res}` at the optimal rho (see module doc)."""
    pa, qa, _ = prepare(p, q)
    return _residual(pa, qa, int(k))[0]


RESIDUAL_ULPS = 64


def _residual(p: np.ndarray, q: np.ndarray, k: int) -> tuple[np.ndarray, float, np.ndarray]:
    rho, a, beta = _params(p, q, k)
    if beta <= 0.0:
        return p.copy(), rho, a
    c = float(_c(beta, k))
    # where the residual is exactly 0 in exact arithmetic, rounding leaves +-1e-17 (and the
    # torch twin may round the other way): entries within 64 ulps of p(x) count as 0, which
    # moves the law by at most 1.5e-14 in TV and makes both backends agree on the support
    d = p - c * np.minimum(q, p / rho)
    d = np.where(d > RESIDUAL_ULPS * np.finfo(np.float64).eps * p, d, 0.0)
    z = float(d.sum())
    return (d / z if z > 0 else p.copy()), rho, a


def acceptance(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> float:
    r""":math:`1 - (1 - \beta(\rho^\star))^k`."""
    k = require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    _, _, beta = _params(pa, qa, k)
    return float(beta * _c(beta, k))  # = 1 - (1 - beta)^k without cancellation


def joint(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> np.ndarray:
    """Exact law ``[V**k, V]`` of (draft tuple, output), rows in ``tuple_law`` order."""
    k = require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    res, _, a = _residual(pa, qa, k)
    tuples, probs = tuple_law(qa, k, replacement=True)
    T, V = tuples.shape[0], pa.size
    A = a[tuples]  # [T, k] acceptance probability of each draft
    surv = np.concatenate([np.ones((T, 1)), np.cumprod(1.0 - A, axis=1)], axis=1)  # [T, k+1]
    J = np.zeros((T, V))
    rows = np.arange(T)
    for i in range(k):
        np.add.at(J, (rows, tuples[:, i]), probs * surv[:, i] * A[:, i])
    J += np.outer(probs * surv[:, k], res)
    return J


def verify(
    p: np.ndarray,
    q: np.ndarray,
    drafts: np.ndarray,
    u_accept: np.ndarray,
    u_resid: float,
    *,
    rho: float | None = None,
    res: np.ndarray | None = None,
) -> int:
    """Deterministic core (inputs assumed validated); ``rho``/``res`` may be precomputed."""
    k = drafts.size
    if rho is None or res is None:
        res, rho, _ = _residual(p, q, k)
    for i in range(k):
        x = int(drafts[i])
        if u_accept[i] * rho * q[x] < p[x]:
            return x
    return categorical(res, u_resid)


def sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    pa, qa, d = prepare(p, q, drafts)
    require_supported(RULE, d.size, replacement)
    u = np.array([sample_uniform(rng) for _ in range(d.size)])
    return verify(pa, qa, d, u, sample_uniform(rng))


def bound(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, float]:
    from ..optimal import optimal_acceptance

    k = require_supported(RULE, k, replacement)
    opt = optimal_acceptance(p, q, k, replacement=True)
    return (APPROX * opt, opt)


RULE = Rule(
    name="kseq",
    support_text=(
        "k-sequential selection is defined for i.i.d. drafts (replacement=True), any k >= 1"
    ),
    bound_text=BOUND_TEXT,
    _supports=_supports,
    _acceptance=acceptance,
    _joint=joint,
    _sample=sample,
    _bound=bound,
)
