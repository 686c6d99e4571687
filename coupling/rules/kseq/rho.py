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
   the margin at every bin edge from bin sums (:func:`bin_pass`, O(V)), and only the few
   breakpoints of the bins where its sign is uncertain are ordered;
2. on that segment :math:`\beta = Q_> + P_</\rho` (masses of the tokens above and below),
   so the margin is a smooth scalar function, :func:`segment_margin`, written without
   cancellation: with :math:`D = 1 - \beta` and :math:`E = 1 - \rho\beta` summed from
   non-negative terms, ``g = D^k - E``; it uses ``k log D - log E`` where
   :math:`\beta \ge 1/2` (there the O(1)-scaled :math:`h(\rho) = \rho - c(\beta)`,
   :math:`c = \sum_{i<k} (1-\beta)^i`, rounds to 0 over whole intervals, so a root search on
   ``h`` returns a valid but too large rho) and ``h`` elsewhere (``g``'s slope
   :math:`\beta h'` is too flat when :math:`\beta` is tiny);
3. :func:`segment_root` solves it: the ``k = 2`` quadratic in closed form, Newton steps
   safeguarded by bisection otherwise;
4. rho steps up (1 ulp, 2, 4, ...) until the margin summed directly is ``>= 0`` (rho = k
   always is valid).

One exception at ``rho = 1``: ``g >= 0`` is the residual's condition only where some token
of ``p``-mass has :math:`p/q < \rho`. Where every such token has :math:`p/q \ge 1`,
:math:`\beta` is the constant :math:`q(\mathrm{supp}\, p)` on ``[1, min p/q]`` and the residual
needs only :math:`c \le \min p/q`: then ``rho = 1`` is valid (and smallest) although
``g(1) < 0``, and otherwise no ``rho`` below ``min p/q`` is, so the root of ``g`` is the answer.

Against the root bisected at 300 digits, the acceptance it gives is within 1e-14 of the
optimum's (``tests/rules/test_kseq.py``).

Written once, batched over rows (:func:`optimal_rho_rows`), over a small table of array
operations (:class:`Ops`, POT's backend idea) that serves numpy (:data:`NP_OPS`,
:func:`optimal_rho` is its one-row case) and torch (:func:`torch_ops`, the twin's
:func:`coupling.rules.kseq.torch.kseq_rho`). For ``k = 1``, :math:`\rho^\star = 1`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["optimal_rho", "optimal_rho_rows", "geometric_c", "beta", "margin", "segment_margin",
           "segment_root", "h_tolerance", "validity_margin", "bin_tolerance", "Ops", "PY_OPS",
           "NP_OPS", "torch_ops", "SORT_AT_MOST", "BINS", "BIN_PASSES"]

#: Ratios ``p/q`` inside the bracket that are ordered at most; above, a histogram over ``BINS``
#: equal bins of the bracket narrows it first (:func:`bin_pass`), up to ``BIN_PASSES`` times.
#: Where every token has mass, thousands of ratios fall in ``(1, k)`` and sorting them all
#: costs more than the rest of a verification step.
SORT_AT_MOST = 64
BINS = 2048
BIN_PASSES = 2


# ------------------------------------------------------------------------------ scalars
def beta(p: np.ndarray, q: np.ndarray, rho: float) -> float:
    r""":math:`\beta(\rho) = \sum_y \min(q(y), p(y)/\rho)`."""
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
    """Validity margin ``rho - c(beta(rho))``, the sign of ``g = rho beta - (1 - (1-beta)^k)``
    when beta > 0 but O(1)-scaled: where some token of p-mass has ``p/q < rho``, the residual
    is a distribution iff it is ``>= 0`` (otherwise the condition is ``c <= min p/q``, module
    doc)."""
    return float(rho - geometric_c(beta(p, q, rho), k))


def h_tolerance(kmax: int) -> float:
    r"""A bound on the rounding error of :math:`h = \rho - c(\beta)` with :math:`\beta` one
    pairwise sum (a few ulps) and :math:`|c'| \le m^2`: beyond it, the sign of ``h`` is
    certain."""
    return 64.0 * (kmax + 1) ** 2 * float(np.finfo(np.float64).eps)


def bin_tolerance(V: int, kmax: int) -> float:
    r"""A bound on the rounding error of :math:`h = \rho - c(\beta)` at a bin edge
    (:func:`bin_pass`): bin sums accumulate up to ``V`` terms in any order and their prefix
    sums ``BINS`` more, so :math:`\beta` is off by at most ``2 (V + BINS + 64)`` ulps (a
    ratio within ulps of an edge may land in the next bin: ``q`` times a few ulps), and
    :math:`|c'(\beta)| \le m^2`. Beyond it the sign of ``h`` is certain; edges within it
    stay inside the bracket."""
    return 2.0 * (V + BINS + 64) * (kmax + 1) ** 2 * float(np.finfo(np.float64).eps)


# ------------------------------------------------------------------------- array backends
class Ops(NamedTuple):
    """The array operations the root finder needs beyond arithmetic and comparisons.

    :func:`margin` and :func:`segment_root` read only ``where`` and ``log`` (so Python floats
    serve too: :data:`PY_OPS`); :func:`optimal_rho_rows` reads the rest, on ``[R, V]`` rows.
    """

    where: Callable
    log: Callable
    isfinite: Callable = None        # elementwise
    bins: Callable = None            # (x [R, V], top) -> int bins: floor, NaN to 0, in [0, top]
    sum: Callable = None             # (x) -> row sums, keepdim
    cumsum: Callable = None          # along the last axis
    flip: Callable = None            # along the last axis
    cat: Callable = None             # along the last axis
    take: Callable = None            # (x [R, n], idx [R, m]) -> x[r, idx[r, j]]
    smallest: Callable = None        # (x [R, V], n) -> (values, indices) of the n smallest, sorted
    bin_sums: Callable = None        # (idx [R, V], w [R, V], nbins) -> [R, nbins]
    first_true: Callable = None      # (mask [R, n]) -> [R] index of the first True (0 if none)
    amax: Callable = None            # along the last axis
    amin: Callable = None            # along the last axis
    nonzero: Callable = None         # (mask [R]) -> int indices
    arange: Callable = None          # (n, like) -> [n] floats on like's device
    ones: Callable = None            # (n, like) -> [n] float64 ones
    f64: Callable = None             # cast to float64
    index: Callable = None           # cast to the backend's index dtype
    minimum: Callable = None         # elementwise, of two arrays
    pos: Callable = None             # max(x, 0), elementwise
    neg: Callable = None             # min(x, 0), elementwise
    masked: Callable = None          # (x, mask) -> x where mask, else 0 (x finite)


PY_OPS = Ops(lambda cond, a, b: a if cond else b, math.log)


def _np_bin_sums(idx: np.ndarray, w: np.ndarray, nbins: int) -> np.ndarray:
    R = idx.shape[0]
    flat = (idx + np.arange(R)[:, None] * nbins).ravel()
    return np.bincount(flat, weights=w.ravel(), minlength=R * nbins).reshape(R, nbins)


def _np_smallest(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.argsort(x, axis=-1, kind="stable")[:, :n]
    return _np_take(x, idx), idx


def _np_take(x: np.ndarray, i: np.ndarray) -> np.ndarray:
    # plain fancy indexing: np.take_along_axis costs ~10 us of Python per call
    return x[np.arange(x.shape[0])[:, None], i]


def _np_bins(x: np.ndarray, top: int) -> np.ndarray:
    return np.clip(np.floor(np.nan_to_num(x, nan=0.0)), 0, top).astype(np.intp)


NP_OPS = Ops(
    where=np.where, log=np.log, isfinite=np.isfinite, bins=_np_bins,
    sum=lambda x: x.sum(-1, keepdims=True), cumsum=lambda x: np.cumsum(x, -1),
    flip=lambda x: x[..., ::-1], cat=lambda xs: np.concatenate(xs, -1),
    take=_np_take, smallest=_np_smallest,
    bin_sums=_np_bin_sums, first_true=lambda m: np.argmax(m, -1),
    amax=lambda x: x.max(-1), amin=lambda x: x.min(-1), nonzero=np.flatnonzero,
    arange=lambda n, like: np.arange(n, dtype=np.float64),
    ones=lambda n, like: np.ones(n, dtype=np.float64),
    f64=lambda x: np.asarray(x, dtype=np.float64), index=lambda x: np.asarray(x, dtype=np.intp),
    minimum=np.minimum, pos=lambda x: np.maximum(x, 0.0), neg=lambda x: np.minimum(x, 0.0),
    masked=lambda x, mask: np.where(mask, x, 0.0),
)


@functools.cache
def torch_ops() -> Ops:
    """:class:`Ops` on torch tensors (imports torch)."""
    import torch

    def bins(x, top):
        return x.nan_to_num(nan=0.0).floor_().clamp_(0, top).to(torch.int64)

    def bin_sums(idx, w, nbins):
        out = torch.zeros(idx.shape[0], nbins, dtype=w.dtype, device=w.device)
        # on CUDA scatter_add sums in no fixed order: the bin sums may differ by rounding from
        # run to run there (the final guard keeps every rho valid)
        return out.scatter_add_(1, idx, w)

    def smallest(x, n):
        return x.topk(n, -1, largest=False, sorted=True)

    return Ops(
        where=torch.where, log=torch.log, isfinite=torch.isfinite, bins=bins,
        sum=lambda x: x.sum(-1, keepdim=True), cumsum=lambda x: x.cumsum(-1),
        flip=lambda x: x.flip(-1), cat=lambda xs: torch.cat(xs, -1),
        take=lambda x, i: x.gather(-1, i), smallest=smallest, bin_sums=bin_sums,
        first_true=lambda m: m.to(torch.uint8).argmax(-1),
        amax=lambda x: x.amax(-1), amin=lambda x: x.amin(-1),
        nonzero=lambda m: torch.nonzero(m).squeeze(1),
        arange=lambda n, like: torch.arange(n, dtype=torch.float64, device=like.device),
        ones=lambda n, like: torch.ones(n, dtype=torch.float64, device=like.device),
        # selections by arithmetic: on the CPU torch.where over a row of V = 49152 costs about
        # 10x a clamp (and kseq's twin computes this root on such rows)
        minimum=torch.minimum, pos=lambda x: x.clamp(min=0.0), neg=lambda x: x.clamp(max=0.0),
        masked=lambda x, mask: x * mask,
        f64=lambda x: x.to(torch.float64), index=lambda x: x.to(torch.int64),
    )


# ------------------------------------------------------------------------ the margin
def margin(rho, d, e, m, kmax: int, ops: Ops = NP_OPS, dd=0.0, de=0.0):
    r"""A margin with the sign of :math:`h(\rho)`, from :math:`D = 1 - \beta(\rho)` and
    :math:`E = 1 - \rho\beta(\rho)`, and its derivative from theirs: ``(f, f')``.

    Written once for every backend: the arguments are Python floats (``ops=PY_OPS``), numpy
    arrays (``NP_OPS``) or torch tensors, broadcasting together; ``m`` a Python int or an
    array of them (per row), ``kmax >= max(m)``.
    ``g = \rho\beta - 1 + (1-\beta)^m = D^m - E = \beta h``, so all three share a sign.
    Callers pass ``D`` and ``E`` summed from non-negative terms (:func:`direct_margin`,
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


# -------------------------------------------------------------------- the root, batched
def geometric_c_rows(beta, mf, kmax: int, ops: Ops):
    r""":func:`geometric_c` with one ``m`` per row (``mf`` broadcasting with ``beta``)."""
    x = 1.0 - beta
    term = 1.0 + 0.0 * x
    c = 0.0 * x
    for i in range(kmax):
        c = c + ops.where(mf > i, term, 0.0)
        term = term * x
    return c


def direct_margin(p, q, dp, dq, m, kmax: int, rho, ops: Ops):
    """:func:`margin` at ``rho [R]`` from one pass over ``p, q [R, V]``: with
    ``w = q - p/rho``, ``D = dq + sum w_+`` and ``E = dp + rho sum (-w)_+``, sums of
    non-negative terms (tokens below rho contribute ``q - p/rho``, those above
    ``p - rho q``)."""
    w = q - p / rho[:, None]
    d = dq + ops.sum(ops.pos(w))[:, 0]
    e = dp - rho * ops.sum(ops.neg(w))[:, 0]
    return margin(rho, d, e, m, kmax, ops)[0]


def bin_pass(R, P, Q, lo, hi, mf, kmax: int, tol: float, ops: Ops):
    r"""Narrow the brackets ``[lo, hi]`` (margin ``< 0`` at ``lo``, ``>= 0`` at ``hi``) of
    ``[A]`` rows to a run of ``BINS`` equal bins each, from one histogram of the ratios
    ``R = p/q [A, V]`` (``inf`` where ``q = 0 < p``, NaN where ``p = q = 0``).

    Bin ``j`` (``1..BINS``) holds the ratios in ``[e_{j-1}, e_j)``, ``e_j = lo + j (hi -
    lo) / BINS``; bin 0 those below ``lo`` and bin ``BINS + 1`` those at or above ``hi``.
    Sums of ``p`` and ``q`` per bin and their prefix sums give
    :math:`\beta(e_j) = Q_{\ge e_j} + P_{< e_j} / e_j`, hence ``h`` at every edge at once
    (a ratio exactly at an edge counts on either side: there ``q = p / e_j``). The new
    ``hi`` is the first edge where ``h > tol`` (certainly valid), the new ``lo`` the last
    edge before it where ``h < -tol``: the smallest root lies between them, whatever the
    edges in between hold. Returns ``lo, hi [A]``, the ratios' bins ``[A, V]``, the
    bracket's first and last bins ``[A, 1]``, and the masses ``(P, Q)`` below it (bins
    ``<= jlo``) and above it (bins ``> jhi``), ``[A, 1]`` each.
    """
    width = (hi - lo) / BINS
    idx = ops.bins((1.0 - lo / width)[:, None] + R * (1.0 / width)[:, None], BINS + 1)
    sums = []
    for x in (P, Q):
        per_bin = ops.bin_sums(idx, x, BINS + 2)
        below = ops.cumsum(per_bin)[:, : BINS + 1]                 # bins 0..j: R < e_j
        above = ops.flip(ops.cumsum(ops.flip(per_bin)))[:, 1:]     # bins j+1..: R >= e_j
        sums.append((below, above))
    (p_lt, p_ge), (q_lt, q_ge) = sums
    j = ops.arange(BINS + 1, R)
    e = ops.where(j == BINS, hi[:, None], lo[:, None] + j * width[:, None])  # [A, BINS+1]
    h = e - geometric_c_rows(q_ge + p_lt / e, mf[:, None], kmax, ops)
    valid = ((h > tol) & (j > 0)) | (j == BINS)  # lo is invalid and hi valid by the invariant
    jhi = ops.first_true(valid)
    invalid = ((h < -tol) | (j == 0)) & (j < jhi[:, None])
    jlo = ops.index(ops.amax(ops.where(invalid, j, 0.0)))
    lo_j, hi_j = jlo[:, None], ops.index(jhi)[:, None]
    return (ops.take(e, lo_j)[:, 0], ops.take(e, hi_j)[:, 0], idx, lo_j, hi_j,
            (ops.take(p_lt, lo_j), ops.take(q_lt, lo_j)),
            (ops.take(p_ge, hi_j), ops.take(q_ge, hi_j)))


def _bracket(R, P, Q, mf, kmax: int, ops: Ops):
    """Steps 1-2 of the module doc on ``[A]`` rows whose root lies in ``(1, m)``: the segment
    ``(lo, hi)`` free of breakpoints where the margin turns non-negative, with the masses
    below / above it."""
    lo, hi = 1.0 + 0.0 * mf, mf + 0.0
    inside = (R > 1.0) & (R < mf[:, None])
    n = int(ops.amax(ops.sum(inside * 1)[:, 0]))
    if n <= SORT_AT_MOST:
        low, high = R <= 1.0, R >= mf[:, None]
        base_lt = (ops.sum(ops.masked(P, low)), ops.sum(ops.masked(Q, low)))
        base_ge = (ops.sum(ops.masked(P, high)), ops.sum(ops.masked(Q, high)))
    else:
        tol = bin_tolerance(R.shape[1], kmax)
        for _ in range(BIN_PASSES):
            lo, hi, bins, jlo, jhi, base_lt, base_ge = bin_pass(R, P, Q, lo, hi, mf, kmax, tol,
                                                                ops)
            inside = (bins > jlo) & (bins <= jhi)
            n = int(ops.amax(ops.sum(inside * 1)[:, 0]))
            if n <= SORT_AT_MOST:
                break
    # the breakpoints left, in order, on top of the masses below and above the bracket; a
    # ratio binned across an edge by rounding may sit just outside it: it counts where it sorts
    t, order = ops.smallest(ops.where(inside, R, math.inf), max(n, 1))
    real = ops.isfinite(t)          # rows with fewer breakpoints left are padded with +inf
    ps = ops.where(real, ops.take(P, order), 0.0)
    qs = ops.where(real, ops.take(Q, order), 0.0)
    pad = 0.0 * lo[:, None]
    p_lt, q_lt = (b + ops.cat([pad, ops.cumsum(x)]) for b, x in zip(base_lt, (ps, qs),
                                                                     strict=True))
    p_ge, q_ge = (b + ops.cat([ops.flip(ops.cumsum(ops.flip(x))), pad])
                  for b, x in zip(base_ge, (ps, qs), strict=True))
    return t, real, lo, hi, (p_lt, q_lt), (p_ge, q_ge)


def optimal_rho_rows(p, q, m, ops: Ops = NP_OPS):
    r"""The smallest :math:`\rho \in [1, m]` whose K-SEQ residual is a distribution, per row:
    ``p, q`` float64 ``[R, V]`` (validated laws), ``m`` ints ``[R]``; float64 ``[R]``.

    ``rho = 1`` when ``m <= 1``, when :math:`\beta(1) = 0`, or when ``rho = 1`` is already
    valid; otherwise the smallest root in ``[1, m]`` of the non-decreasing, continuous,
    piecewise-smooth validity margin, by the four steps of the module doc.
    """
    rho = ops.ones(p.shape[0], p)
    b1 = ops.sum(ops.minimum(p, q))[:, 0]                   # beta(1)
    need = (m > 1) & (b1 > 0)                                # else token / nothing to accept
    if not bool(need.any()):
        return rho
    kmax = int(ops.amax(ops.where(need, m, 0)))
    mf_all = ops.f64(m)
    dp_all, dq_all = 1.0 - ops.sum(p)[:, 0], 1.0 - ops.sum(q)[:, 0]
    c1 = geometric_c_rows(b1, mf_all, kmax, ops)
    f1 = 1.0 - c1                                            # h(1)
    unsure = abs(f1) <= h_tolerance(kmax)
    if bool((need & unsure).any()):                          # a flat margin at 1: exact sign
        f1 = ops.where(unsure, direct_margin(p, q, dp_all, dq_all, mf_all, kmax, rho, ops), f1)
    # h(1) < 0 makes rho = 1 invalid only if some token of p-mass has p/q < 1; where every such
    # token has p/q >= 1 the residual needs only c(beta(1)) <= min p/q (module doc)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):   # numpy's warnings
        r_min = ops.amin(ops.where(p > 0, p / q, math.inf))
    need = need & (f1 < 0) & ~((r_min >= 1.0) & (c1 <= r_min))
    if not bool(need.any()):
        return rho
    idx = ops.nonzero(need)
    P, Q, mf, dp, dq = p[idx], q[idx], mf_all[idx], dp_all[idx], dq_all[idx]
    mm = kmax if bool((mf == kmax).all()) else mf            # an int: the margin's fast path
    mcol = mm if isinstance(mm, int) else mm[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):   # numpy's warnings
        R = P / Q                                            # q = 0 < p: +inf; p = q = 0: NaN
    t, real, lo, hi, lt, ge = _bracket(R, P, Q, mf, kmax, ops)
    n = t.shape[1]
    f_t, _ = segment_margin(ops.where(real, t, 1.0), (lt[0][:, :n], lt[1][:, :n]),
                            (ge[0][:, :n], ge[1][:, :n]), (dp[:, None], dq[:, None]), mcol, kmax,
                            ops)
    hi = ops.amin(ops.where(real & (f_t >= 0), t, hi[:, None]))
    lo = ops.amax(ops.where(real & (t < hi[:, None]), t, lo[:, None]))
    s = ops.sum((t <= lo[:, None]) * 1)                      # breakpoints at or below lo
    below = (ops.take(lt[0], s)[:, 0], ops.take(lt[1], s)[:, 0])
    above = (ops.take(ge[0], s)[:, 0], ops.take(ge[1], s)[:, 0])
    if idx.shape[0] == 1:
        # one row: the last two steps on Python floats, where a scalar operation costs a tenth
        # of a one-element array's
        lo, hi, below, above, dp, dq = (float(v) if not isinstance(v, tuple)
                                        else tuple(float(w) for w in v)
                                        for v in (lo[0], hi[0], (below[0][0], below[1][0]),
                                                  (above[0][0], above[1][0]), dp[0], dq[0]))
        rho[idx] = _step_up(segment_root(lo, hi, below, above, (dp, dq), kmax, kmax, PY_OPS),
                            P[:1], Q[:1], dp, dq, kmax, ops)
        return rho
    # 3. the smooth root on the segment
    x = segment_root(lo, hi, below, above, (dp, dq), mm, kmax, ops)
    # 4. the root may sit an ulp below the true root: step up until the margin is >= 0
    step = float(np.finfo(np.float64).eps) * x
    short = ops.nonzero((x < mf) & (direct_margin(P, Q, dp, dq, mm, kmax, x, ops) < 0))
    while short.shape[0]:
        x[short] = ops.where(mf[short] < x[short] + step[short], mf[short],
                             x[short] + step[short])
        step[short] = 2.0 * step[short]
        xr = x[short]
        mr = mm if isinstance(mm, int) else mm[short]
        f = direct_margin(P[short], Q[short], dp[short], dq[short], mr, kmax, xr, ops)
        short = short[(xr < mf[short]) & (f < 0)]
    rho[idx] = x
    return rho


def _step_up(x: float, p, q, dp: float, dq: float, k: int, ops: Ops = NP_OPS) -> float:
    """Step 4 on one row ``[1, V]`` in Python floats: up by 1, 2, 4, ... ulps until the margin
    summed directly is ``>= 0`` (``rho = k`` always is valid)."""
    step = float(np.finfo(np.float64).eps) * x
    while x < k:
        w = q - p / x
        d = dq + float(ops.sum(ops.pos(w))[0, 0])
        e = dp - x * float(ops.sum(ops.neg(w))[0, 0])
        if margin(x, d, e, k, k, PY_OPS)[0] >= 0.0:
            break
        x = min(float(k), x + step)
        step *= 2.0
    return x


def optimal_rho(p: np.ndarray, q: np.ndarray, k: int) -> float:
    r"""Smallest :math:`\rho \ge 1` whose K-SEQ residual is a distribution, for validated
    ``p``, ``q`` (the one-row case of :func:`optimal_rho_rows`)."""
    if k == 1:
        return 1.0
    return float(optimal_rho_rows(p[None], q[None], np.array([k]), NP_OPS)[0])
