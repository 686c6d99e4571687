r"""``kseq``'s batched torch twin: SpecTr k-sequential selection at every node of the draft tree.

With ``m`` survivors at an offset (:mod:`coupling.torch_backend.tree`) and
``rho = rho*(p, q, m)`` (:func:`kseq_rho`), accept the first survivor with
``u_j rho q(x_j) < p(x_j)``; else draw from :math:`(p - c \min(q, p/\rho))_+` with
:math:`c = \sum_{i<m} (1-\beta)^i`. A step needs ``rho`` only when some test could go either
way for ``rho`` in ``[1, m]``, or for the residual; otherwise it is not computed.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import first_true, verify_tree
from . import RESIDUAL_ULPS
from . import rho as rho_np

__all__ = ["verify", "step", "kseq_rho"]


def _geometric_c(beta: torch.Tensor, mf: torch.Tensor, kmax: int) -> torch.Tensor:
    r""":math:`c = (1 - (1-\beta)^m)/\beta = \sum_{i<m} (1-\beta)^i`, summed term by term (no
    cancellation for tiny :math:`\beta`; :func:`coupling.rules.kseq.rho.geometric_c` per row)."""
    x = 1.0 - beta
    term = torch.ones_like(x)
    c = torch.zeros_like(x)
    for i in range(kmax):
        c = c + torch.where(mf > i, term, 0.0)
        term = term * x
    return c


_TORCH_OPS = rho_np.Ops(torch.where, torch.log)


def _direct_margin(p, q, dp, dq, mf, kmax: int, rho: torch.Tensor) -> torch.Tensor:
    """:func:`coupling.rules.kseq.margin` at ``rho [B]`` from one pass over ``p, q [B, V]``,
    as the reference's ``_direct_margin``: with ``w = q - p/rho``,
    ``D = dq + sum w_+`` and ``E = dp + rho sum (-w)_+``, sums of non-negative terms."""
    w = q - p / rho.unsqueeze(1)
    d = dq + w.clamp(min=0.0).sum(-1)
    e = dp - rho * w.clamp(max=0.0).sum(-1)
    return rho_np.margin(rho, d, e, mf, kmax, _TORCH_OPS)[0]


def _bin_pass(R, P, Q, lo, hi, mf, kmax: int, tol: float):
    """:func:`coupling.rules.kseq._bin_pass` on ``[A]`` rows at once (``R = p/q [A, V]``,
    ``inf`` where ``q = 0 < p``, NaN where ``p = q = 0``), with ``scatter_add`` for the bin
    sums. Returns ``lo, hi [A]``, the bins ``[A, V]``, ``jlo, jhi [A, 1]`` and the masses
    below / above the bracket (``[A, 1]`` each). On CUDA ``scatter_add`` sums in no fixed
    order: the bin sums, hence ``rho``, may differ by rounding from run to run there (the
    guard of :func:`kseq_rho` keeps every ``rho`` valid)."""
    BINS = rho_np.BINS
    A = R.shape[0]
    width = (hi - lo) / BINS
    # 1 + (R - lo) / width in one pass; NaN (p = q = 0, no mass) to bin 0
    s = torch.addcmul((1.0 - lo / width)[:, None], R, (1.0 / width)[:, None])
    idx = s.nan_to_num_(nan=0.0).floor_().clamp_(0, BINS + 1).to(torch.int64)  # [A, V]
    sums = []
    for x in (P, Q):
        per_bin = torch.zeros(A, BINS + 2, dtype=x.dtype, device=x.device).scatter_add_(1, idx, x)
        below = per_bin.cumsum(-1)[:, : BINS + 1]                  # bins 0..j: R < e_j
        above = per_bin.flip(-1).cumsum(-1).flip(-1)[:, 1:]        # bins j+1..: R >= e_j
        sums.append((below, above))
    (p_lt, p_ge), (q_lt, q_ge) = sums
    j = torch.arange(BINS + 1, device=R.device)
    e = torch.where(j == BINS, hi[:, None], lo[:, None] + j * width[:, None])  # [A, BINS+1]
    h = e - _geometric_c(q_ge + p_lt / e, mf[:, None], kmax)
    valid = ((h > tol) & (j > 0)) | (j == BINS)  # lo is invalid and hi valid by the invariant
    jhi = first_true(valid)
    invalid = ((h < -tol) | (j == 0)) & (j < jhi[:, None])
    jlo = torch.where(invalid, j, 0).amax(-1)
    lo_j, hi_j = jlo[:, None], jhi[:, None]
    return (e.gather(1, lo_j).squeeze(1), e.gather(1, hi_j).squeeze(1), idx, lo_j, hi_j,
            (p_lt.gather(1, lo_j), q_lt.gather(1, lo_j)),
            (p_ge.gather(1, hi_j), q_ge.gather(1, hi_j)))


def kseq_rho(p: torch.Tensor, q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    r"""Smallest :math:`\rho \in [1, m]` whose K-SEQ residual is a distribution, per row.

    ``p, q`` float64 ``[B, V]``, ``m`` int ``[B]`` (number of drafts). Returns float64 ``[B]``.
    The root of :func:`coupling.rules.kseq.optimal_rho`: ``rho = 1`` when ``m <= 1``, when
    :math:`\beta(1) = 0`, or when ``rho = 1`` is already valid; otherwise the smallest root
    in ``[1, m]`` of the non-decreasing, continuous, piecewise-smooth validity margin
    (:func:`coupling.rules.kseq.margin`, the sign of :math:`h(\rho) = \rho - c(\beta(\rho))`).
    The reference's algorithm (:func:`coupling.rules.kseq._root_segment`), batched:

    1. where more than ``SORT_AT_MOST`` ratios ``p/q`` lie inside ``(1, m)`` (thousands where
       every token has mass), a histogram of them over ``BINS`` equal bins gives ``h`` at
       every bin edge (:func:`_bin_pass`, about ten passes over ``V``, no sort), and the
       bracket shrinks to the bins where its sign is not certain; if more than
       ``SORT_AT_MOST`` ratios remain there, a second pass bins the bracket itself;
    2. the few breakpoints left are ordered (a ``topk``), and cumulative sums over them,
       on top of the masses below and above the bracket, give the margin at each, hence
       the segment free of breakpoints where it turns non-negative, as in the reference;
    3. on it :func:`coupling.rules.kseq.segment_root`, shared with the reference, solves
       the smooth margin (closed form for ``m = 2``, safeguarded Newton otherwise) on
       ``[B]``-sized tensors;
    4. ``rho`` steps up by 1, 2, 4, ... ulps until the direct margin is ``>= 0``
       (``rho = m`` always is valid).
    """
    B, V = p.shape
    rho = torch.ones(B, dtype=torch.float64, device=p.device)
    b1 = torch.minimum(p, q).sum(-1)  # beta(1)
    need = (m > 1) & (b1 > 0)  # else token / nothing to accept
    if not bool(need.any()):
        return rho
    kmax = int(m[need].max())
    mf_all = m.to(torch.float64)
    dp_all, dq_all = 1.0 - p.sum(-1), 1.0 - q.sum(-1)
    f1 = 1.0 - _geometric_c(b1, mf_all, kmax)  # h(1)
    unsure = f1.abs() <= rho_np.h_tolerance(kmax)
    if bool((need & unsure).any()):  # a flat margin at 1: the exact sign
        f1 = torch.where(unsure, _direct_margin(p, q, dp_all, dq_all, mf_all, kmax, rho), f1)
    need = need & (f1 < 0)  # rho = 1 invalid
    if not bool(need.any()):
        return rho
    idx = torch.nonzero(need).squeeze(1)
    P, Q, mf, dp, dq = p[idx], q[idx], mf_all[idx], dp_all[idx], dq_all[idx]
    mm = kmax if bool((mf == kmax).all()) else mf  # a Python int: the margin's fast path
    mcol = mm if isinstance(mm, int) else mm.unsqueeze(1)

    # 1. bin the ratios p/q until few are left inside the bracket [lo, hi]
    R = P / Q  # q = 0 < p: +inf, above every rho; p = q = 0: NaN, no mass
    lo, hi = torch.ones_like(mf), mf.clone()
    inside = (R > 1.0) & (R < mf[:, None])
    n = int(inside.sum(-1).max())
    if n <= rho_np.SORT_AT_MOST:
        low, high = R <= 1.0, R >= mf[:, None]
        base_lt = ((P * low).sum(-1, keepdim=True), (Q * low).sum(-1, keepdim=True))
        base_ge = ((P * high).sum(-1, keepdim=True), (Q * high).sum(-1, keepdim=True))
    else:
        tol = rho_np.bin_tolerance(V, kmax)
        for _ in range(rho_np.BIN_PASSES):
            lo, hi, bins, jlo, jhi, base_lt, base_ge = _bin_pass(R, P, Q, lo, hi, mf, kmax, tol)
            inside = (bins > jlo) & (bins <= jhi)
            n = int(inside.sum(-1).max())
            if n <= rho_np.SORT_AT_MOST:
                break
    # 2. the n breakpoints left, in order, on top of the masses below and above the bracket
    zero = torch.zeros((), dtype=P.dtype, device=P.device)
    n = max(n, 1)  # at least one (+inf) column: amin needs it
    t, order = torch.where(inside, R, torch.inf).topk(n, -1, largest=False, sorted=True)
    real = torch.isfinite(t)  # rows with fewer than n breakpoints left are padded with +inf
    ps = torch.where(real, P.gather(1, order), zero)
    qs = torch.where(real, Q.gather(1, order), zero)
    pad = torch.zeros_like(lo)[:, None]
    p_lt, q_lt = (b + torch.cat([pad, x.cumsum(-1)], 1)
                  for b, x in zip(base_lt, (ps, qs), strict=True))      # [A, n+1]: first j
    p_ge, q_ge = (b + torch.cat([x.flip(-1).cumsum(-1).flip(-1), pad], 1)
                  for b, x in zip(base_ge, (ps, qs), strict=True))
    f_t, _ = rho_np.segment_margin(torch.where(real, t, 1.0), (p_lt[:, :n], q_lt[:, :n]),
                                     (p_ge[:, :n], q_ge[:, :n]), (dp[:, None], dq[:, None]),
                                     mcol, kmax, _TORCH_OPS)
    hi = torch.where(real & (f_t >= 0), t, hi[:, None]).amin(-1)
    lo = torch.where(real & (t < hi[:, None]), t, lo[:, None]).amax(-1)
    s = (t <= lo[:, None]).sum(-1, keepdim=True)       # breakpoints left at or below lo
    below = (p_lt.gather(1, s).squeeze(1), q_lt.gather(1, s).squeeze(1))
    above = (p_ge.gather(1, s).squeeze(1), q_ge.gather(1, s).squeeze(1))
    # 3. the smooth root on the segment
    x = rho_np.segment_root(lo, hi, below, above, (dp, dq), mm, kmax, _TORCH_OPS)
    # 4. the root may sit an ulp below the true root: step up until the margin is >= 0
    # (after the first pass, only over the rows still short)
    step = torch.finfo(torch.float64).eps * x
    rows = torch.nonzero((x < mf) & (_direct_margin(P, Q, dp, dq, mm, kmax, x) < 0)).squeeze(1)
    while rows.numel():
        x[rows] = torch.minimum(mf[rows], x[rows] + step[rows])
        step[rows] *= 2.0
        xr = x[rows]
        mr = mm if isinstance(mm, int) else mm[rows]
        f = _direct_margin(P[rows], Q[rows], dp[rows], dq[rows], mr, kmax, xr)
        rows = rows[(xr < mf[rows]) & (f < 0)]
    return rho.index_put((idx,), x)


def _rows64(p: torch.Tensor, q: torch.Tensor, rows: torch.Tensor):
    """``p[rows], q[rows]`` in float64 (one copy each; no gather when ``rows`` is all)."""
    if rows.numel() != p.shape[0]:
        p, q = p[rows], q[rows]
    return p.to(torch.float64), q.to(torch.float64)


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""
    B, k = x.shape
    m = alive.sum(-1)  # [B] survivors
    px = p_i.gather(1, x).to(torch.float64)  # [B, k] p(x_j), q(x_j)
    qx = q_i.gather(1, x).to(torch.float64)
    # rho is only needed through the tests u rho q(x) < p(x) and the residual. A draft with
    # u m q(x) < p(x) passes, and one with u q(x) >= p(x) fails, for every rho in [1, m]
    # (rounding is monotone): where the first draft not surely failing surely passes, the
    # outcome is known without rho (any rho in [1, m] reproduces it bit for bit)
    open_ = alive & (coins * qx < px)  # [B, k] not surely failing
    sure = alive & (coins * m.unsqueeze(1).to(torch.float64) * qx < px)
    known = sure.gather(1, first_true(open_).unsqueeze(1)).squeeze(1) & open_.any(-1)
    rho = torch.ones(B, dtype=torch.float64, device=x.device)
    rows = torch.nonzero(~known & (m > 1)).squeeze(1)
    if rows.numel():
        rho[rows] = kseq_rho(*_rows64(p_i, q_i, rows), m[rows])
    # the first surviving draft that passes its test (the tests are independent given rho,
    # so all k at once; the same coins and arithmetic as the reference's loop)
    passed = alive & (coins * rho.unsqueeze(1) * qx < px)  # [B, k]
    decided = passed.any(-1)
    y = x.gather(1, first_true(passed).unsqueeze(1)).squeeze(1)
    if bool(decided.all()):
        return y
    rows = torch.nonzero(~decided).squeeze(1)  # every survivor failed: the residual
    p64, q64 = _rows64(p_i, q_i, rows)  # [R, V]
    mr = m[rows]
    low = torch.minimum(q64, p64 / rho[rows].unsqueeze(1))  # [R, V] min(q, p / rho)
    beta = low.sum(-1, keepdim=True)
    c = _geometric_c(beta, mr.clamp(min=1).to(torch.float64).unsqueeze(1), max(int(mr.max()), 1))
    # exact zeros of the residual come out as +-1e-17: within 64 ulps of p(x) they count as 0,
    # as in coupling.rules.kseq.residual_at (the two backends then agree on the support)
    r = p64 - c * low
    r = torch.where(r > RESIDUAL_ULPS * torch.finfo(torch.float64).eps * p64, r, 0.0)
    res = torch.where(beta > 0, r, p64)
    return y.index_put((rows,), sample_rows(res, u[rows], fallback=p64))


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """SpecTr k-sequential selection over draft trees of i.i.d. branches, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``replacement=False`` is refused)."""
    if not replacement:
        raise ValueError("kseq is defined for i.i.d. drafts only; use replacement=True (or "
                         "rrs/optimal)")
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=True,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="kseq")
