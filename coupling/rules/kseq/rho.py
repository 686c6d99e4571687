r"""The smallest valid K-SEQ ratio :math:`\rho^\star` (see :mod:`coupling.rules.kseq`).

Choice of rho: ``g`` is non-decreasing in ``rho`` (:math:`\rho\beta = \sum\min(\rho q, p)`
grows, :math:`\beta` shrinks), ``g(rho) < 0`` for ``rho < 1`` when :math:`\beta > 0`, and
``g(k) >= 0`` (Bernoulli: :math:`1 - (1-\beta)^k \le k\beta`). The acceptance
:math:`1 - (1-\beta(\rho))^k` decreases in ``rho``, so the best valid choice is the
smallest root :math:`\rho^\star \in [1, k]` of ``g``. :func:`optimal_rho` finds it
exactly up to rounding:

1. one sort of the breakpoints ``p(x)/q(x)`` and cumulative sums give the margin at every
   breakpoint in ``(1, k)``, hence the segment ``(lo, hi)`` free of breakpoints where it
   turns non-negative. Where more than ``SORT_AT_MOST`` breakpoints lie in ``(1, k)``
   (thousands when every token has mass), a histogram over ``BINS`` equal bins first gives
   the margin at every bin edge from bin sums (:func:`_bin_pass`, O(V)), and only the few
   breakpoints of the bins where its sign is uncertain are sorted;
2. on that segment :math:`\beta = Q_> + P_</\rho` (masses of the tokens above and below),
   so the margin is a smooth scalar function, :func:`segment_margin`, written without
   cancellation: with :math:`D = 1 - \beta` and :math:`E = 1 - \rho\beta` summed from
   non-negative terms, ``g = D^k - E``; it uses ``k log D - log E`` where
   :math:`\beta \ge 1/2` (there the O(1)-scaled :math:`h(\rho) = \rho - c(\beta)`,
   :math:`c = \sum_{i<k} (1-\beta)^i`, rounds to 0 over whole intervals, and the Brent
   search on ``h`` used before this returned up to 7% too large a rho, valid and within
   1e-15 in acceptance, but not the smallest) and ``h`` elsewhere
   (``g``'s slope :math:`\beta h'` is too flat when :math:`\beta` is tiny);
3. :func:`segment_root` solves it: the ``k = 2`` quadratic in closed form, Newton steps
   safeguarded by bisection otherwise;
4. rho steps up (1 ulp, 2, 4, ...) until the margin summed directly is ``>= 0`` (rho = k
   always is valid).

Against the root bisected at 300 digits, the acceptance it gives is within 1e-14 of the
optimum's (``tests/test_rules.py``). The torch twin runs the same functions on tensors.
The acceptance is reported as :math:`\beta c` (no cancellation).
For ``k = 1``, :math:`\rho^\star = 1` and the rule is ``token``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["optimal_rho", "geometric_c", "beta", "margin", "segment_margin", "segment_root",
           "h_tolerance", "validity_margin", "bin_tolerance", "Ops", "PY_OPS", "NP_OPS",
           "SORT_AT_MOST", "BINS", "BIN_PASSES"]


def beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    return float(np.minimum(q, p / rho).sum())


def geometric_c(beta, k: int):
    r""":math:`c = (1 - (1-\beta)^k)/\beta = \sum_{i<k} (1-\beta)^i` as a geometric sum: no
    cancellation when :math:`\beta` is tiny (the quotient form loses all digits there)."""
    x = 1.0 - np.asarray(beta, dtype=np.float64)
    term = np.ones_like(x)
    c = np.zeros_like(x)
    for _ in range(k):
        c = c + term
        term = term * x
    return c


def validity_margin(p: np.ndarray, q: np.ndarray, k: int, rho: float) -> float:
    """Validity margin ``rho - c(beta(rho))``: the residual is a distribution iff ``>= 0``
    (same sign as ``g = rho beta - (1 - (1-beta)^k)`` when beta > 0, but O(1)-scaled)."""
    return float(rho - geometric_c(beta(p, q, rho), k))


class Ops(NamedTuple):
    """The two elementwise functions the margin and the root need beyond arithmetic, for
    the backend at hand (Python floats, numpy or torch)."""

    where: Callable
    log: Callable


PY_OPS = Ops(lambda cond, a, b: a if cond else b, math.log)
NP_OPS = Ops(np.where, np.log)


def margin(rho, d, e, m, kmax: int, ops: Ops = NP_OPS, dd=0.0, de=0.0):
    r"""A margin with the sign of :math:`h(\rho)`, from :math:`D = 1 - \beta(\rho)` and
    :math:`E = 1 - \rho\beta(\rho)`, and its derivative from theirs: ``(f, f')``.

    Written once for every backend: the arguments are Python floats (``ops=PY_OPS``), numpy
    arrays (``NP_OPS``) or torch tensors, broadcasting together; ``m`` a Python int or an
    array of them (per row), ``kmax >= max(m)``.
    ``g = \rho\beta - 1 + (1-\beta)^m = D^m - E = \beta h``, so all three share a sign.
    Callers pass ``D`` and ``E`` summed from non-negative terms (:func:`_direct_margin`,
    :func:`segment_margin`): both are then resolved far below an ulp of 1.

    * Where :math:`\beta \ge 1/2` (``D <= 1/2``): ``f = m log D - log E`` (``+1`` where
      ``E <= 0``). There ``h = rho - \sum_{i<m} D^i`` rounds to 0 over whole intervals
      (any point of them would pass for a root), and ``g`` itself, a near-``m``-fold root,
      stalls Newton; the logarithms make the root simple again.
    * Elsewhere ``f = h``, whose slope stays near 1 when :math:`\beta` is tiny (``g``'s is
      :math:`\beta h'`, too flat to place the root to 1e-15).
    """
    where = ops.where
    d = where(d > 0, d, 0.0)
    c, dc, term = 0.0 * d, 0.0 * d, 1.0 + 0.0 * d
    uniform = isinstance(m, int)  # one m for all rows: no masks (a third of the ops)
    for i in range(m if uniform else kmax):
        c = c + (term if uniform else where(m > i, term, 0.0))  # sum_{i<m} D^i
        if uniform and i + 1 < m:
            dc = dc + (i + 1) * term  # the derivative of the sum in D
        elif not uniform:
            dc = dc + where(m > i + 1, (i + 1) * term, 0.0)
        term = term * d
    tiny = 1e-300  # only keeps the unused branch finite
    d_, e_ = where(d > tiny, d, tiny), where(e > tiny, e, tiny)
    use_log = (d <= 0.5) & (e > 0)
    f = where(d <= 0.5, where(e > 0, m * ops.log(d_) - ops.log(e_), 1.0), rho - c)
    df = where(use_log, m * dd / d_ - de / e_, where(d <= 0.5, 1.0, 1.0 - dc * dd))
    return f, df


def segment_margin(rho, below, above, defect, m, kmax: int, ops: Ops = NP_OPS):
    r""":func:`margin` and its derivative on a segment free of breakpoints.

    ``below = (P_<, Q_<)`` are the masses of the tokens with :math:`p/q < \rho`,
    ``above = (P_>, Q_>)`` those of the others, ``defect = (1 - \sum p, 1 - \sum q)``. There
    :math:`\beta = Q_> + P_</\rho`, and

    .. math:: D = \delta_q + (Q_< - P_</\rho),\qquad E = \delta_p + (P_> - \rho Q_>)

    hold for any input sums and cancel nothing: ``Q_< - P_</rho`` sums ``q - p/rho >= 0``
    and ``P_> - rho Q_>`` sums ``p - rho q >= 0``.
    """
    (pl, ql), (pg, qg), (dp, dq) = below, above, defect
    return margin(rho, dq + ql - pl / rho, dp + pg - rho * qg, m, kmax, ops,
                  dd=pl / (rho * rho), de=-qg)


def _all(flags) -> bool:
    return bool(flags) if isinstance(flags, bool) else bool(flags.all())


def segment_root(lo, hi, below, above, defect, m, kmax: int, ops: Ops = NP_OPS,
                 iters: int = 60):
    r"""The smallest root in ``[lo, hi]`` of :func:`segment_margin` (not negative at ``hi``),
    for any backend (same conventions): ``lo`` if the margin is already ``>= 0`` there,
    else Newton steps, each replaced by bisection when it leaves the bracket, from the
    larger root of the ``m = 2`` quadratic :math:`\rho^2 - (2 - Q_>)\rho + P_< = 0`
    (``rho h`` for ``m = 2``: the answer there), until the step or the bracket is below
    2e-16 / 1e-15 relative. The result may sit an ulp below the root in floating point:
    callers step it up.
    """
    where = ops.where
    b2 = 2.0 - above[1]
    disc = b2 * b2 - 4.0 * below[0]
    x = 0.5 * (b2 + where(disc > 0, disc, 0.0) ** 0.5)
    x = where(x < lo, lo, where(x > hi, hi, x))
    f_lo, _ = segment_margin(lo, below, above, defect, m, kmax, ops)
    at_lo = f_lo >= 0
    x = where(at_lo, lo, x)
    a, b = lo, hi
    for _ in range(iters):
        f, df = segment_margin(x, below, above, defect, m, kmax, ops)
        a, b = where(f < 0, x, a), where(f >= 0, x, b)
        nx = x - f / where(df > 0, df, 1.0)
        nx = where((nx > a) & (nx < b) & (df > 0), nx, 0.5 * (a + b))
        done = at_lo | (abs(nx - x) <= 2e-16 * x) | (b - a <= 1e-15 * b) | (f == 0)
        x = where(done, x, nx)
        if _all(done):
            break
    return x


def h_tolerance(kmax: int) -> float:
    r"""A bound on the rounding error of :math:`h = \rho - c(\beta)` with :math:`\beta` one
    pairwise sum (a few ulps) and :math:`|c'| \le m^2`: beyond it, the sign of ``h`` is
    certain."""
    return 64.0 * (kmax + 1) ** 2 * float(np.finfo(np.float64).eps)


def optimal_rho(p: np.ndarray, q: np.ndarray, k: int) -> float:
    r"""Smallest :math:`\rho \ge 1` whose K-SEQ residual is a distribution, for validated
    ``p``, ``q`` (module doc)."""
    if k == 1:
        return 1.0  # token
    beta1 = beta(p, q, 1.0)
    if beta1 <= 0.0:
        return 1.0  # disjoint supports accept nothing for any rho
    h1 = 1.0 - float(geometric_c(beta1, k))  # h(1), its sign certain beyond the tolerance
    if (h1 if abs(h1) > h_tolerance(k) else _direct_margin(p, q, k, 1.0)) >= 0.0:
        return 1.0
    lo, hi, below, above, defect = _root_segment(p, q, k)
    rho = float(segment_root(lo, hi, below, above, defect, k, k, PY_OPS))
    # the root may sit an ulp below the true root: step up (1 ulp, 2, 4, ...) until the
    # margin summed directly is non-negative (rho = k always is valid)
    step = np.finfo(float).eps * rho
    while rho < k and _direct_margin(p, q, k, rho) < 0.0:
        rho = min(float(k), rho + step)
        step *= 2.0
    return rho


def _direct_margin(p: np.ndarray, q: np.ndarray, k: int, rho: float) -> float:
    r""":func:`margin` at ``rho`` from one pass over the tokens: with ``w = q - p/rho``,
    :math:`D = \delta_q + \sum w_+` and :math:`E = \delta_p + \rho \sum (-w)_+` (tokens
    below rho contribute ``q - p/rho >= 0``, those above ``p - rho q >= 0``)."""
    w = q - p / rho
    d = (1.0 - float(q.sum())) + float(np.maximum(w, 0.0).sum())
    e = (1.0 - float(p.sum())) - rho * float(np.minimum(w, 0.0).sum())
    return float(margin(rho, d, e, k, k, PY_OPS)[0])


#: Ratios ``p/q`` inside the bracket that :func:`_root_segment` sorts at most; above, a
#: histogram over ``BINS`` equal bins of the bracket narrows it first (:func:`_bin_pass`),
#: up to ``BIN_PASSES`` times. Where every token has mass, thousands of ratios fall in
#: ``(1, k)`` and sorting them all costs more than the rest of a verification step.
SORT_AT_MOST = 64
BINS = 2048
BIN_PASSES = 2


def bin_tolerance(V: int, kmax: int) -> float:
    r"""A bound on the rounding error of :math:`h = \rho - c(\beta)` at a bin edge
    (:func:`_bin_pass`): bin sums accumulate up to ``V`` terms in any order and their prefix
    sums ``BINS`` more, so :math:`\beta` is off by at most ``2 (V + BINS + 64)`` ulps (a
    ratio within ulps of an edge may land in the next bin: ``q`` times a few ulps), and
    :math:`|c'(\beta)| \le m^2`. Beyond it the sign of ``h`` is certain; edges within it
    stay inside the bracket."""
    return 2.0 * (V + BINS + 64) * (kmax + 1) ** 2 * float(np.finfo(np.float64).eps)


def _bin_pass(ratio: np.ndarray, p: np.ndarray, q: np.ndarray, lo: float, hi: float, k: int,
              tol: float):
    r"""Narrow the bracket ``[lo, hi]`` (margin ``< 0`` at ``lo``, ``>= 0`` at ``hi``) to a
    run of ``BINS`` equal bins over it, from one histogram of the ratios.

    Bin ``j`` (``1..BINS``) holds the ratios in ``[e_{j-1}, e_j)``, ``e_j = lo + j (hi -
    lo) / BINS``; bin 0 those below ``lo`` and bin ``BINS + 1`` those at or above ``hi``.
    Sums of ``p`` and ``q`` per bin and their prefix sums give
    :math:`\beta(e_j) = Q_{\ge e_j} + P_{< e_j} / e_j`, hence ``h`` at every edge at once
    (a ratio exactly at an edge counts on either side: there ``q = p / e_j``). The new
    ``hi`` is the first edge where ``h > tol`` (certainly valid), the new ``lo`` the last
    edge before it where ``h < -tol``: the smallest root lies between them, whatever the
    edges in between hold. Returns ``(lo, hi, bins, jlo, jhi, below, above)``: the ratios'
    bins, the bracket's first and last bins, and the masses ``(P, Q)`` below it (bins
    ``<= jlo``) and above it (bins ``> jhi``).
    """
    width = (hi - lo) / BINS
    x = ratio * (1.0 / width) + (1.0 - lo / width)  # 1 + (ratio - lo) / width
    bins = np.minimum(np.maximum(x, 0.0, out=x), BINS + 1, out=x).astype(np.intp)  # floor
    below, above = [], []
    for mass in (p, q):
        per_bin = np.bincount(bins, weights=mass, minlength=BINS + 2)
        below.append(np.cumsum(per_bin)[: BINS + 1])            # bins 0..j: ratio < e_j
        above.append(np.cumsum(per_bin[::-1])[::-1][1:])        # bins j+1..: ratio >= e_j
    e = lo + np.arange(BINS + 1) * width
    e[-1] = hi
    h = e - geometric_c(above[1] + below[0] / e, k)
    valid = h > tol
    valid[0], valid[-1] = False, True  # lo is invalid and hi valid by the invariant
    jhi = int(np.argmax(valid))
    invalid = h[:jhi] < -tol
    invalid[0] = True
    jlo = int(np.flatnonzero(invalid)[-1])
    return (float(e[jlo]), float(e[jhi]), bins, jlo, jhi,
            (float(below[0][jlo]), float(below[1][jlo])),
            (float(above[0][jhi]), float(above[1][jhi])))


def _root_segment(p: np.ndarray, q: np.ndarray, k: int):
    """``(lo, hi, below, above, defect)``: the segment between consecutive breakpoints
    ``p/q`` (or 1, k) where the margin turns non-negative, with the masses below / above it
    (:func:`segment_margin`), all Python floats. Tokens with ratio <= 1 lie below every
    rho in [1, k] and those with ratio >= k above: only the ratios inside (1, k) are
    sorted (after :func:`_bin_pass` narrowed the bracket, where more than
    ``SORT_AT_MOST`` lie there), then cumulative sums give the margin at every breakpoint
    in one vectorised call."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q > 0, p / np.where(q > 0, q, 1.0), np.inf)  # q = 0: never in beta
    lo, hi = 1.0, float(k)
    inside = (ratio > lo) & (ratio < hi)
    if np.count_nonzero(inside) <= SORT_AT_MOST:
        # masses below every breakpoint (ratio <= 1) and above (ratio >= k): one pass each
        # (a BLAS dot with a 0/1 mask waits on threads on a busy CPU: 8 ms for 49152 tokens)
        side = (ratio > lo).astype(np.intp) + (ratio >= hi)  # 0 below, 1 inside, 2 above
        (p_lt, _, p_ge), (q_lt, _, q_ge) = (np.bincount(side, weights=x, minlength=3)
                                            for x in (p, q))
        base_lt, base_ge = (float(p_lt), float(q_lt)), (float(p_ge), float(q_ge))
    else:
        tol = bin_tolerance(p.size, k)
        for _ in range(BIN_PASSES):
            lo, hi, bins, jlo, jhi, base_lt, base_ge = _bin_pass(ratio, p, q, lo, hi, k, tol)
            inside = (bins > jlo) & (bins <= jhi)
            if np.count_nonzero(inside) <= SORT_AT_MOST:
                break
    sel = np.flatnonzero(inside)
    order = sel[np.argsort(ratio[sel], kind="stable")]
    t, ps, qs = ratio[order], p[order], q[order]
    return _sorted_segment(t, ps, qs, base_lt, base_ge, (1.0 - float(p.sum()),
                                                         1.0 - float(q.sum())), k, lo, hi)


def _sorted_segment(t, ps, qs, base_lt, base_ge, defect, k: int, lo: float, hi: float):
    """The tail of :func:`_root_segment`: the breakpoints ``t`` of the bracket ``[lo, hi]``
    in order, their masses, and the masses below / above them. A ratio binned across an
    edge by rounding may sit just outside the bracket: it still counts where it sorts."""
    p_lt, q_lt = (b + np.concatenate([[0.0], np.cumsum(x)]) for b, x in zip(base_lt, (ps, qs),
                                                                              strict=True))
    p_ge, q_ge = (b + np.concatenate([np.cumsum(x[::-1])[::-1], [0.0]])
                  for b, x in zip(base_ge, (ps, qs), strict=True))
    n = t.size  # at t_j: the inside tokens before j lie below, those from j on above
    f, _ = segment_margin(t, (p_lt[:n], q_lt[:n]), (p_ge[:n], q_ge[:n]), defect, k, k, NP_OPS)
    valid = np.flatnonzero(f >= 0.0)
    hi = min(float(t[valid[0]]), hi) if valid.size else hi  # the margin is >= 0 at hi
    s_hi = int(np.searchsorted(t, hi, side="left"))
    lo = max(float(t[s_hi - 1]), lo) if s_hi > 0 else lo
    s = int(np.searchsorted(t, lo, side="right"))  # inside tokens at or below lo
    return (lo, hi, (float(p_lt[s]), float(q_lt[s])), (float(p_ge[s]), float(q_ge[s])),
            defect)
