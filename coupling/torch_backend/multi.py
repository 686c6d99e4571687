r"""Multi-draft verification along a block: ``kseq``, ``rrs``, ``optimal``, ``gumbel``.

Draft tree
----------
Request ``b`` has ``k`` draft branches of ``g`` tokens each, ``drafts[b, j, :]``, with the
draft and target laws along each branch (``q[b, j, i]``, ``p[b, j, i]``). With replacement
(SpecTr / SpecInfer trees) the branches are i.i.d. continuations of the context; branches
that share a prefix have i.i.d. continuations after it. Without replacement (``rrs``
/``optimal`` with ``replacement=False``) the ``k`` first tokens are distinct (successive
sampling from ``q_0``) and each branch then continues as a single chain.

Verification walks the tree position by position (vectorised over the batch):

* the *surviving* branches at offset ``i`` are those whose first ``i`` tokens equal the
  emitted prefix (all ``k`` at ``i = 0``);
* their tokens at offset ``i`` are i.i.d. draws from ``q_i`` along that prefix (the laws
  ``p_i``, ``q_i`` are read from the lowest-index survivor; all survivors share them), so
  the single-step multi-draft rule applies to them and emits ``y_i`` with law exactly
  ``p_i`` (lossless by the rule's own guarantee);
* if ``y_i`` equals the token of a survivor, the survivors shrink to the branches whose
  token is ``y_i`` and the walk continues (this holds whichever way the rule produced
  ``y_i``: the unobserved continuations of those branches are still i.i.d. ``q_{i+1}``);
  otherwise ``y_i`` is the residual token and the walk stops;
* a survivor at the end of the block gets the bonus token from its ``p_g``.

Survivors are i.i.d. given the prefix because every decision so far depended only on
tokens at earlier offsets and on independent coins. Without replacement the survivors
after offset 0 are a single branch, and each single-step rule with one draft reduces to
``token`` (and ``optimal``'s k = 1 rule *is* ``token``).

Single-step rules (numpy references in :mod:`coupling.rules`, same conventions: strict
``u * (.) < (.)`` tests, inverse-CDF residual draws, float64 arithmetic)

``rrs`` (recursive rejection sampling): target ``r_0 = p``; for each surviving draft in
branch order, accept iff ``u_j q_j(x_j) < r(x_j)``, else ``r <- norm((r - q_j)_+)``; with
``replacement=False`` also ``q_{j+1} = q_j`` with ``x_j`` removed, renormalised. After all
are rejected, draw from ``r``.

``kseq`` (SpecTr k-sequential selection, i.i.d. drafts only): with ``m`` survivors and
``rho = rho*(p, q, m)`` the smallest root in ``[1, m]`` of
:math:`g(\rho) = \sum_y \min(\rho q, p) - (1 - (1 - \beta(\rho))^m)`,
:math:`\beta(\rho) = \sum_y \min(q, p/\rho)`, accept the first survivor with
``u_j rho q(x_j) < p(x_j)``; else draw from
:math:`(p - c \min(q, p/\rho))_+` with :math:`c = (1 - (1-\beta)^m)/\beta`, summed as the
geometric series :math:`\sum_{i<m} (1-\beta)^i` (no cancellation for tiny :math:`\beta`).
``rho*`` is the root of :func:`coupling.rules.kseq.optimal_rho` (:func:`kseq_rho`: on a
CPU a few rows take the numpy reference row by row; otherwise the same algorithm on
tensors: where many breakpoints ``p/q`` lie in ``(1, m)``, a histogram of them narrows the
bracket to a few bins, a ``topk`` orders the breakpoints left in it, and the shared
:func:`coupling.rules.kseq.segment_root` solves the last segment). A step needs ``rho``
only when some test ``u rho q(x) < p(x)`` could go either way for ``rho`` in ``[1, m]``,
or for the residual; otherwise it is not computed (the outcome is the same bit for bit).

``optimal`` (LP-optimal acceptance): with one survivor it is ``token`` (optimal for k = 1,
vectorised). With ``m >= 2`` survivors it samples the row of the drafted set in an exact
optimal plan built through the min cut (:class:`coupling.optimal.CutPlan`, by the numpy
reference :func:`coupling.rules.optimal.verify`): closed forms, POT on a part of the plan
only where they fail, a Python loop over the affected rows. It works on the union of the
supports, whose pair sets grow as ``U^2`` (``U^k * U <= MAX_PLAN_ENTRIES``); **there is no
exact sampler for wide supports**, and it raises ``ValueError`` rather than approximate.

``gumbel`` (shared-noise Gumbel-max coupling, Daliri, Musco & Suresh 2024): the token at
absolute position ``t + i`` is the target's Gumbel-max sample
``y_i = argmax_v log p_i(v) + G(seed, t + i, v)`` (float64), the same noise the drafter
uses in :func:`gumbel_draft`. Drafts are accepted while a survivor's token equals
``y_i``; the first mismatch emits ``y_i``. The output never depends on ``q`` nor on the
drafts (drafter invariance), only on ``p`` along the emitted prefix and the noise; it is
lossless because each ``y_i`` is an exact sample of ``p_i`` and ``G(seed, t + i)`` is
independent of everything that decided the prefix. Any ``k`` is supported.

One request on a CPU (the engine's calls) is walked by the numpy reference,
:func:`coupling.rules.tree.walk` over the rules' own ``verify`` functions, with the same keyed
uniforms (``ONE_ROW_IN_NUMPY``): a scalar step costs about a microsecond there against 5-15
for a tensor operation. The two walks decide alike (``tests/test_torch_backend_multi.py``
holds them equal on whole trees); batches and CUDA take :func:`walk_tree`.

Randomness: coin of branch ``j`` at offset ``i``: ``U(seed, t, STREAM_ACCEPT, i*MAX_DRAFTS + j)``;
residual / bonus / LP-row draw at offset ``i``: ``U(seed, t, STREAM_SAMPLE, i)``; Gumbel noise
``G(seed, t + i, v)`` (stream ``STREAM_GUMBEL``), keyed by the token's absolute position.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..rules import kseq as ref_kseq
from ..rules import tree as ref_tree
from ..rules.kseq import RESIDUAL_ULPS as _KSEQ_RESIDUAL_ULPS
from ._common import (
    Verdict,
    assemble,
    check_inputs,
    check_probs,
    coin_uniforms,
    sample_rows,
    sample_uniforms,
)
from .rng import gumbel_noise

__all__ = ["kseq", "rrs", "optimal", "gumbel", "gumbel_draft", "kseq_rho", "walk_tree"]

# A single-step rule on the A unfinished rows: (p_i [A,V], q_i [A,V], x [A,k], alive [A,k],
# coins [A,k], u [A], offset i, batch rows act [A]) -> output token y [A]
StepFn = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        int,
        torch.Tensor,
    ],
    torch.Tensor,
]


def _first_true(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last axis (0 if none). ``[B, k] -> [B]``."""
    return mask.to(torch.uint8).argmax(-1)


def _laws_at(act: torch.Tensor, ref: torch.Tensor, i: int, *laws: torch.Tensor):
    """``law[act, ref, i]`` ``[A, V]`` for each law: views for one row (most steps only read
    a few entries; a gather would copy a V-vector per law and position), else copies."""
    if act.numel() == 1:
        b, j = int(act), int(ref)
        return tuple(law[b, j, i].unsqueeze(0) for law in laws)
    return tuple(law[act, ref, i] for law in laws)


def walk_tree(
    step: StepFn,
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    coins: torch.Tensor,
    u_sample: torch.Tensor,
    bonus: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Verdict:
    """Walk the draft tree (module doc) with a single-step rule ``step``.

    ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]``, ``coins [B,g,k]``, ``u_sample [B,g+1]``.
    ``bonus(p_g [A,V], u [A], act [A]) -> [A]`` draws the bonus token of the unfinished
    rows ``act`` (default: inverse CDF with ``u``).
    """
    B, k, g = drafts.shape
    dev = drafts.device
    alive = torch.ones(B, k, dtype=torch.bool, device=dev)  # branch agrees with the emitted prefix
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    nxt = torch.zeros(B, dtype=torch.int64, device=dev)
    branch = torch.zeros(B, dtype=torch.int64, device=dev)
    for i in range(g):  # sequential: survivors at i depend on the token emitted at i-1
        # only unfinished rows are verified at offset i (gathered, then scattered back);
        # the sync this costs is what lets a B = 1 call stop at its first residual token
        act = torch.nonzero(~done).squeeze(1)
        if act.numel() == 0:
            break
        al = alive[act]  # [A, k]
        ref = _first_true(al)  # [A] lowest surviving branch: its laws are the prefix's laws
        x = drafts[act, :, i]  # [A, k]
        y = step(*_laws_at(act, ref, i, p, q), x, al, coins[act, i], u_sample[act, i], i, act)
        hit = al & (x == y.unsqueeze(1))  # [A, k] survivors that drafted y
        go = hit.any(-1)
        stop = act[~go]
        nxt[stop] = y[~go]
        branch[stop] = ref[~go]
        accepted[act] += go.to(torch.int64)
        alive[act] = torch.where(go.unsqueeze(1), hit, al)
        done[stop] = True
    act = torch.nonzero(~done).squeeze(1)
    if act.numel():
        ref = _first_true(alive[act])
        (p_end,) = _laws_at(act, ref, g, p)  # [A, V]
        u_end = u_sample[act, g]
        nxt[act] = bonus(p_end, u_end, act) if bonus is not None else sample_rows(p_end, u_end)
        branch[act] = ref
    return assemble(drafts, accepted, branch, nxt)


# --------------------------------------------------------------------------------- rrs
def _rrs_step(replacement: bool) -> StepFn:
    def step(p_i, q_i, x, alive, coins, u, i, act):
        B, k = x.shape
        # r (current target) and qc (current draft law) are p and q until the first rejection:
        # their float64 copies [B, V] are made then (a step that accepts at once reads p and
        # q at the draft only)
        r = qc = None
        decided = torch.zeros(B, dtype=torch.bool, device=x.device)
        y = torch.zeros(B, dtype=torch.int64, device=x.device)
        for j in range(k):  # sequential by definition: each rejection changes the target
            xj = x[:, j : j + 1]  # [B, 1]
            rx, qx = ((p_i, q_i) if r is None else (r, qc))
            rx, qx = (v.gather(1, xj).squeeze(1).to(torch.float64) for v in (rx, qx))
            test = alive[:, j] & ~decided
            acc = test & (coins[:, j] * qx < rx)
            y = torch.where(acc, xj.squeeze(1), y)
            decided = decided | acc
            rej = (test & ~acc).unsqueeze(1)
            if not bool(rej.any()):  # nothing rejected: r and q_j stay as they are
                continue
            if r is None:
                r, qc = p_i.to(torch.float64), q_i.to(torch.float64)
            d = (r - qc).clamp_(min=0.0)
            z = d.sum(-1, keepdim=True)
            # z == 0: this step accepts with probability 1, the residual is never used
            r = torch.where(rej & (z > 0), d / torch.where(z > 0, z, 1.0), r)
            if not replacement:
                qn = qc.scatter(1, xj, 0.0)
                zq = qn.sum(-1, keepdim=True)
                qc = torch.where(rej & (zq > 0), qn / torch.where(zq > 0, zq, 1.0), qc)
        if bool(decided.all()):
            return y
        return torch.where(decided, y, sample_rows(p_i if r is None else r, u))

    return step


# -------------------------------------------------------------------------------- kseq
def _geometric_c(beta: torch.Tensor, mf: torch.Tensor, kmax: int) -> torch.Tensor:
    r""":math:`c = (1 - (1-\beta)^m)/\beta = \sum_{i<m} (1-\beta)^i`, summed term by term (no
    cancellation for tiny :math:`\beta`; same form as :func:`coupling.rules.kseq._c`)."""
    x = 1.0 - beta
    term = torch.ones_like(x)
    c = torch.zeros_like(x)
    for i in range(kmax):
        c = c + torch.where(mf > i, term, 0.0)
        term = term * x
    return c


#: On a CPU, batches of at most ``SMALL_ROWS`` rows take the numpy reference's root row by
#: row (:func:`coupling.rules.kseq._optimal_rho`): its scalar steps cost about 1 us in Python
#: floats and numpy against 5-15 us per torch operation, which at the engine's B = 1 made the
#: torch path 3-6x slower (``benchmarks/bench_kseq_rho.py``). ``SMALL_ROWS = 0`` forces the
#: torch path (the conformance tests run both).
SMALL_ROWS = 8
_TORCH_OPS = ref_kseq.Ops(torch.where, torch.log)


def _direct_margin(p, q, dp, dq, mf, kmax: int, rho: torch.Tensor) -> torch.Tensor:
    """:func:`coupling.rules.kseq.margin` at ``rho [B]`` from one pass over ``p, q [B, V]``,
    as the reference's ``_direct_margin``: with ``w = q - p/rho``,
    ``D = dq + sum w_+`` and ``E = dp + rho sum (-w)_+``, sums of non-negative terms."""
    w = q - p / rho.unsqueeze(1)
    d = dq + w.clamp(min=0.0).sum(-1)
    e = dp - rho * w.clamp(max=0.0).sum(-1)
    return ref_kseq.margin(rho, d, e, mf, kmax, _TORCH_OPS)[0]


def _bin_pass(R, P, Q, lo, hi, mf, kmax: int, tol: float):
    """:func:`coupling.rules.kseq._bin_pass` on ``[A]`` rows at once (``R = p/q [A, V]``,
    ``inf`` where ``q = 0 < p``, NaN where ``p = q = 0``), with ``scatter_add`` for the bin
    sums. Returns ``lo, hi [A]``, the bins ``[A, V]``, ``jlo, jhi [A, 1]`` and the masses
    below / above the bracket (``[A, 1]`` each). On CUDA ``scatter_add`` sums in no fixed
    order: the bin sums, hence ``rho``, may differ by rounding from run to run there (the
    guard of :func:`kseq_rho` keeps every ``rho`` valid)."""
    BINS = ref_kseq.BINS
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
    jhi = _first_true(valid)
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

    On a CPU, ``B <= SMALL_ROWS`` rows take the reference's numpy root row by row.
    """
    B, V = p.shape
    if p.device.type == "cpu" and B <= SMALL_ROWS:
        P, Q = p.detach().numpy(), q.detach().numpy()
        return torch.tensor([ref_kseq._optimal_rho(P[b], Q[b], mb) if mb > 1 else 1.0
                             for b, mb in enumerate(m.tolist())], dtype=torch.float64)
    rho = torch.ones(B, dtype=torch.float64, device=p.device)
    b1 = torch.minimum(p, q).sum(-1)  # beta(1)
    need = (m > 1) & (b1 > 0)  # else token / nothing to accept
    if not bool(need.any()):
        return rho
    kmax = int(m[need].max())
    mf_all = m.to(torch.float64)
    dp_all, dq_all = 1.0 - p.sum(-1), 1.0 - q.sum(-1)
    f1 = 1.0 - _geometric_c(b1, mf_all, kmax)  # h(1)
    unsure = f1.abs() <= ref_kseq.h_tolerance(kmax)
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
    if n <= ref_kseq.SORT_AT_MOST:
        low, high = R <= 1.0, R >= mf[:, None]
        base_lt = ((P * low).sum(-1, keepdim=True), (Q * low).sum(-1, keepdim=True))
        base_ge = ((P * high).sum(-1, keepdim=True), (Q * high).sum(-1, keepdim=True))
    else:
        tol = ref_kseq.bin_tolerance(V, kmax)
        for _ in range(ref_kseq.BIN_PASSES):
            lo, hi, bins, jlo, jhi, base_lt, base_ge = _bin_pass(R, P, Q, lo, hi, mf, kmax, tol)
            inside = (bins > jlo) & (bins <= jhi)
            n = int(inside.sum(-1).max())
            if n <= ref_kseq.SORT_AT_MOST:
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
    f_t, _ = ref_kseq.segment_margin(torch.where(real, t, 1.0), (p_lt[:, :n], q_lt[:, :n]),
                                     (p_ge[:, :n], q_ge[:, :n]), (dp[:, None], dq[:, None]),
                                     mcol, kmax, _TORCH_OPS)
    hi = torch.where(real & (f_t >= 0), t, hi[:, None]).amin(-1)
    lo = torch.where(real & (t < hi[:, None]), t, lo[:, None]).amax(-1)
    s = (t <= lo[:, None]).sum(-1, keepdim=True)       # breakpoints left at or below lo
    below = (p_lt.gather(1, s).squeeze(1), q_lt.gather(1, s).squeeze(1))
    above = (p_ge.gather(1, s).squeeze(1), q_ge.gather(1, s).squeeze(1))
    # 3. the smooth root on the segment
    x = ref_kseq.segment_root(lo, hi, below, above, (dp, dq), mm, kmax, _TORCH_OPS)
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


def _kseq_step(p_i, q_i, x, alive, coins, u, i, act):
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
    known = sure.gather(1, _first_true(open_).unsqueeze(1)).squeeze(1) & open_.any(-1)
    rho = torch.ones(B, dtype=torch.float64, device=x.device)
    rows = torch.nonzero(~known & (m > 1)).squeeze(1)
    if rows.numel():
        rho[rows] = kseq_rho(*_rows64(p_i, q_i, rows), m[rows])
    # the first surviving draft that passes its test (the tests are independent given rho,
    # so all k at once; the same coins and arithmetic as the reference's loop)
    passed = alive & (coins * rho.unsqueeze(1) * qx < px)  # [B, k]
    decided = passed.any(-1)
    y = x.gather(1, _first_true(passed).unsqueeze(1)).squeeze(1)
    if bool(decided.all()):
        return y
    rows = torch.nonzero(~decided).squeeze(1)  # every survivor failed: the residual
    p64, q64 = _rows64(p_i, q_i, rows)  # [R, V]
    mr = m[rows]
    low = torch.minimum(q64, p64 / rho[rows].unsqueeze(1))  # [R, V] min(q, p / rho)
    beta = low.sum(-1, keepdim=True)
    c = _geometric_c(beta, mr.clamp(min=1).to(torch.float64).unsqueeze(1), max(int(mr.max()), 1))
    # exact zeros of the residual come out as +-1e-17: within 64 ulps of p(x) they count as 0,
    # as in coupling.rules.kseq._residual (the two backends then agree on the support)
    r = p64 - c * low
    r = torch.where(r > _KSEQ_RESIDUAL_ULPS * torch.finfo(torch.float64).eps * p64, r, 0.0)
    res = torch.where(beta > 0, r, p64)
    return y.index_put((rows,), sample_rows(res, u[rows], fallback=p64))


# ----------------------------------------------------------------------------- optimal
def _optimal_step(replacement: bool) -> StepFn:
    token_step = _rrs_step(True)  # with one draft, rrs is exactly the token rule

    def step(p_i, q_i, x, alive, coins, u, i, act):
        from ..rules import optimal as ref

        y = token_step(p_i, q_i, x, alive & (torch.cumsum(alive, -1) == 1), coins, u, i, act)
        multi = alive.sum(-1) >= 2
        if not bool(multi.any()):
            return y
        # m >= 2 survivors: sample the draft tuple's row of an exact LP plan (numpy, per row)
        y = y.clone()
        idx = torch.nonzero(multi).squeeze(1).tolist()
        P = p_i[idx].detach().to(torch.float64).cpu().numpy()
        Q = q_i[idx].detach().to(torch.float64).cpu().numpy()
        X, A, U = x[idx].cpu().numpy(), alive[idx].cpu().numpy(), u[idx].cpu().numpy()
        for n, b in enumerate(idx):    # (verify renormalises the laws on their support)
            out = ref.verify(P[n], Q[n], X[n][A[n]], float(U[n]), replacement=replacement)
            y[b] = out
        return y

    return step


# ------------------------------------------------------------------------------ gumbel
def gumbel_draft(
    q: torch.Tensor, seeds: torch.Tensor | int, positions: torch.Tensor | int
) -> torch.Tensor:
    """Drafter side of the Gumbel coupling: ``argmax_v log q[..., v] + G(seed, position, v)``.

    ``q`` is ``[..., V]``; ``seeds`` and ``positions`` broadcast to ``q.shape[:-1]`` (e.g. a
    ``[B]`` batch drafting the token at absolute position ``positions[b]``). float64.
    """
    if not isinstance(q, torch.Tensor) or not q.dtype.is_floating_point or q.ndim < 1:
        raise ValueError("q must be a floating tensor [..., V] of draft probabilities")
    check_probs(q, "q")
    s = torch.as_tensor(seeds, device=q.device)
    t = torch.as_tensor(positions, device=q.device)
    s, t = torch.broadcast_tensors(s, t)
    s, t = s.expand(q.shape[:-1]), t.expand(q.shape[:-1])
    G = gumbel_noise(s, t, q.shape[-1], dtype=torch.float64, device=q.device)
    return torch.argmax(q.to(torch.float64).log() + G, -1)


def _gumbel_target(
    p_rows: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``argmax_v log p[b, v] + G(seeds[b], positions[b], v)`` (float64), ``[B, V] -> [B]``."""
    G = gumbel_noise(seeds, positions, p_rows.shape[-1], dtype=torch.float64, device=p_rows.device)
    return torch.argmax(p_rows.to(torch.float64).log() + G, -1)


# ------------------------------------------------------------------------ one row, numpy
#: On a CPU, a call with one request (the engine's) walks its tree with the numpy reference
#: (:func:`coupling.rules.tree.walk` over the rules' own ``verify``) instead of
#: :func:`walk_tree`: the same rules on the same keyed uniforms, at about 1 us per scalar
#: step against 5-15 us per tensor operation (``benchmarks/bench_decide.py``). ``False``
#: forces the torch walk (the conformance tests compare the two on whole trees).
ONE_ROW_IN_NUMPY = True


def _walk_one_row(rule: str, replacement: bool, drafts, p, q, coins, u) -> Verdict:
    """:func:`walk_tree` for ``B = 1`` on a CPU, by :func:`coupling.rules.tree.walk`; only the
    rows the walk reads are converted to float64."""
    def laws(t: torch.Tensor):
        return lambda j, i: t[0, j, i].detach().to(torch.float64).numpy()

    n, branch, y = ref_tree.walk(ref_tree.step_for(rule, replacement), drafts[0].numpy(),
                                 laws(p), laws(q), coins[0].numpy(), u[0].numpy())
    return assemble(drafts, *(torch.tensor([v]) for v in (n, branch, y)))


# ------------------------------------------------------------------------------ public
def _multi(
    rule: str,
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    seeds,
    positions,
    *,
    replacement: bool,
    validate: bool,
    atol: float | None,
    accept_u: torch.Tensor | None,
    sample_u: torch.Tensor | None,
) -> Verdict:
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, rule=rule
    )
    B, k, g = drafts.shape
    if not replacement and validate and k > 1 and g > 0:
        first = drafts[:, :, 0].sort(-1).values
        if bool((first[:, 1:] == first[:, :-1]).any()):
            raise ValueError(
                "replacement=False promises k distinct first tokens (successive sampling), "
                "but some "
                "request repeats one; pass replacement=True for i.i.d. branches"
            )
    coins = (
        coin_uniforms(seeds, positions, g, k) if accept_u is None else accept_u.to(torch.float64)
    )
    u = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    if coins.shape != (B, g, k) or u.shape != (B, g + 1):
        raise ValueError(f"accept_u must be [B, gamma, k] = {(B, g, k)} and sample_u [B, gamma+1]")
    if ONE_ROW_IN_NUMPY and B == 1 and drafts.device.type == "cpu":
        return _walk_one_row(rule, replacement, drafts, p, q, coins, u)
    if rule == "rrs":
        step = _rrs_step(replacement)
    elif rule == "kseq":
        step = _kseq_step
    else:
        step = _optimal_step(replacement)
    return walk_tree(step, drafts, p, q, coins, u)


def rrs(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """Recursive rejection sampling over a draft tree (module doc), batched.

    ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]``, ``seeds``/``positions`` ``[B]``;
    ``replacement=False``: the k first tokens are distinct (successive sampling) and each
    branch continues as a single chain. ``accept_u [B,g,k]`` / ``sample_u [B,g+1]`` override
    the keyed uniforms (tests). Returns a :class:`Verdict`.
    """
    return _multi(
        "rrs",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=replacement,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def kseq(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """SpecTr k-sequential selection over a draft tree of i.i.d. branches (module doc), batched."""
    if not replacement:
        raise ValueError(
            "kseq is defined for i.i.d. drafts only; use replacement=True (or rrs/optimal)"
        )
    return _multi(
        "kseq",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=True,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def optimal(
    drafts,
    p,
    q,
    *,
    seeds,
    positions,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
    accept_u=None,
    sample_u=None,
) -> Verdict:
    """LP-optimal verification over a draft tree (module doc).

    One survivor: the token rule (vectorised). ``m >= 2`` survivors: exact LP-plan sampling,
    numpy, per row, small vocabularies only (``ValueError`` beyond
    :data:`coupling.rules.optimal.MAX_PLAN_ENTRIES`).
    """
    return _multi(
        "optimal",
        drafts,
        p,
        q,
        seeds,
        positions,
        replacement=replacement,
        validate=validate,
        atol=atol,
        accept_u=accept_u,
        sample_u=sample_u,
    )


def gumbel(
    drafts,
    p,
    q=None,
    *,
    seeds,
    positions,
    noise: torch.Tensor | None = None,
    replacement: bool = True,
    validate: bool = True,
    atol: float | None = None,
) -> Verdict:
    """Gumbel-max coupling along a draft tree (module doc), batched.

    Emits the target's keyed Gumbel-max stream ``argmax(log p_i + G(seed, t + i))`` and
    accepts drafts while they agree with it. ``q`` is only validated (and may be None) and
    ``replacement`` is accepted for a uniform call signature: the output depends on neither.
    ``noise``: optional float64 ``[B, gamma+1, V]`` holding ``gumbel_noise(seeds, t + i, V)``
    for ``i = 0..gamma``, e.g. kept from drafting with :func:`gumbel_draft`, to skip
    recomputing it (about 0.8 ms per 49152-entry vector on one CPU thread); or ``[B, gamma,
    V]``, the drafter's positions only: the bonus position's noise is then hashed here, and
    only if the walk reaches it. The caller vouches that it is that noise.
    """
    if q is None:  # the rule never reads q: validate against a uniform stand-in
        if not isinstance(p, torch.Tensor) or p.ndim not in (3, 4) or not p.dtype.is_floating_point:
            raise ValueError("p must be a floating tensor [B, k, gamma+1, V] (or [B, gamma+1, V])")
        q = torch.full(
            (*p.shape[:-2], p.shape[-2] - 1, p.shape[-1]),
            1.0 / p.shape[-1],
            dtype=p.dtype,
            device=p.device,
        )
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, rule="gumbel"
    )
    B, k, g = drafts.shape
    V = p.shape[-1]
    if noise is not None and (
        not isinstance(noise, torch.Tensor) or tuple(noise.shape) not in ((B, g + 1, V), (B, g, V))
    ):
        raise ValueError(
            f"noise must be a tensor [B, gamma+1, V] = {(B, g + 1, V)} of keyed Gumbel noise "
            "(gumbel_noise(seeds, positions + i, V) for i = 0..gamma), or [B, gamma, V] without "
            "the bonus position, or None"
        )
    dummy_coins = torch.zeros(B, g, k, dtype=torch.float64, device=drafts.device)
    dummy_u = torch.zeros(B, g + 1, dtype=torch.float64, device=drafts.device)

    def target_token(p_rows: torch.Tensor, act: torch.Tensor, i: int) -> torch.Tensor:
        if noise is None or i >= noise.shape[1]:
            return _gumbel_target(p_rows, seeds[act], positions[act] + i)
        G = noise[int(act), i].unsqueeze(0) if act.numel() == 1 else noise[act, i]
        return torch.argmax(p_rows.to(torch.float64).log() + G.to(torch.float64), -1)

    def step(p_i, q_i, x, alive, coins, u, i, act):
        return target_token(p_i, act, i)

    def bonus(p_g, u, act):
        return target_token(p_g, act, g)

    return walk_tree(step, drafts, p, q, dummy_coins, dummy_u, bonus=bonus)
