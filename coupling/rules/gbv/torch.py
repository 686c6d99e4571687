r"""``gbv``'s batched torch twin: greedy multi-path block verification of ``B`` draft trees.

Glossary (one request): ``x`` the selected path; ``r_d`` the lowest path through its depth-``d``
node, whose rows hold the node's laws (:mod:`coupling.rules.trie`); ``A_d``, ``m_d`` the draft
mass of the depth-``d`` prefixes ranked below that node and of the node itself; ``F^-`` the
draft mass ranked below a token at a node; ``q*`` the skewed law
(:func:`coupling.rules.gbv.skewed`); ``w``, ``eta``, ``h`` block verification's weights, coins
and stopping probabilities (:mod:`coupling.rules.block.torch`). Every law is float64 over its
row's sum (:mod:`coupling.torch_backend.laws`).

Two passes over ``gamma``, every request at once; what reads whole rows goes a chunk of rows
at a time (:func:`~coupling.torch_backend.laws.chunk_rows`: one row at ``V = 49152`` on a CPU,
so it stays in cache, in buffers reused across the call (:func:`workspace`); hundreds of rows
on a GPU):

1. **Select** (:func:`select`). At depth ``d``: the children's ranking keys, the
   highest-ranked child ``t`` (largest key, then largest token id: the rank order without its
   positions) and ``F^-(t)`` by a masked sum, no sort (:func:`mass_below_token`). That gives
   ``A``, ``m`` and ``q*(t)`` at every depth, hence the ratios ``p(t) / q*(t)`` and ``w``.
2. **Verify** the selected path (:func:`_block`): a test whose coin can pass (``eta_{i-1} <
   w_i``) needs ``s_i = sum_y max(w_i p_i(y) - q*_i(y), 0)``, so ``q*`` over the whole
   vocabulary, so ``F^-`` of every token (:func:`mass_below`): with the capped key the tokens
   with ``p >= q`` tie at the top and follow all others in token order, a cumulative sum;
   only the tokens under them are sorted. The residual of the last test that passes is kept:
   it is the stop's, and the emitted token is drawn from it.

Randomness: the selected path ``b``'s coins ``accept_u[:, :, b]`` (keyed:
``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS + b)``) and ``sample_u[:, tau]``: the numbers
:func:`coupling.keyed.call_uniforms` hands the numpy core, which this twin matches decision
for decision up to float summation order (``tests/rules/test_gbv_torch.py``). With ``k = 1``
it is the block twin coin for coin.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...torch_backend.common import Verdict, assemble, sample_rows, search_cdf
from ...torch_backend.laws import by_row_chunks, chunk_rows, normalised_rows
from ...torch_backend.tree import first_true, prepare_tree
from ..block.torch import can_pass, stop_probability, weights
from . import RANKS, skewed

__all__ = ["verify", "select", "Selection", "rank_keys", "mass_below", "mass_below_token"]


class Selection(NamedTuple):
    """What :func:`select` finds, per request."""

    branch: torch.Tensor  # [B] int64: the lowest path equal to the selected one
    rows: torch.Tensor    # [B, g] int64: r_d
    A: torch.Tensor       # [B, g] float64: A_d
    m: torch.Tensor       # [B, g] float64: m_d
    ratios: torch.Tensor  # [B, g] float64: p(x_d) / q*(x_d)


def rank_keys(p: torch.Tensor, q: torch.Tensor, rank: str) -> torch.Tensor:
    """:func:`coupling.rules.gbv.rank_key` elementwise: ``min(1, p/q)`` or ``p/q``, -1 where
    ``q = 0``."""
    ratio = p / torch.where(q > 0, q, 1.0)
    return torch.where(q > 0, ratio.clamp(max=1.0) if rank == "capped" else ratio, -1.0)


Work = tuple[torch.Tensor, torch.Tensor]


def workspace(R: int, V: int, device: torch.device, n: int = 2) -> tuple[torch.Tensor, ...]:
    """``n`` float64 ``[R, V]`` buffers (:func:`mass_below_token` and :func:`mass_below` take
    two), reused across the chunks of a call: a fresh whole-row temporary per operation costs
    page faults where glibc returns a freed heap top to the system and maps it again, about a
    third of the twin's time at ``B = 1`` without the buffers (``MALLOC_TOP_PAD_=100000000``
    hides the faults: compare ``benchmarks/bench_twins.py --batches 1 --rules gbv`` with and
    without it)."""
    return tuple(torch.empty(R, V, dtype=torch.float64, device=device) for _ in range(n))


def _under(p: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``q`` where ``p < q``, 0 elsewhere. Masks are written as float64 0/1 into ``out`` and
    multiplied: on a CPU a comparison into a bool tensor, or a select over one, costs 3x
    more."""
    return torch.lt(p, q, out=out).mul_(q)


def _prefix(x: torch.Tensor, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``sum_{id < t} x`` per row: ``x [R, V]``, ``t [R]`` -> ``[R]`` (``out``: scratch)."""
    if x.shape[0] == 1 and x.device.type == "cpu":  # one row: a partial sum, no scan
        return x[:, :int(t)].sum(-1)
    c = torch.cumsum(x, -1, out=out)
    before = c.gather(-1, (t - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(t > 0, before, 0.0)


def _mass_top(p, q, t, work: Work) -> torch.Tensor:
    """``F^-(t)`` for a token of capped key 1: every token with ``p < q``, then the earlier
    tokens of key 1."""
    under = _under(p, q, work[0])
    total = under.sum(-1)
    return total + _prefix(torch.sub(q, under, out=work[1]), t, work[0])


def _mass_under(p, q, t, key_t, work: Work) -> torch.Tensor:
    """``F^-(t)`` for any key, from ``p / q``: a capped key under 1 is ``p / q``, and where
    ``q = 0`` (a token of no mass) the ratio is inf or nan and compares false."""
    r, kt = torch.div(p, q, out=work[0]), key_t.unsqueeze(-1)
    lower = torch.lt(r, kt, out=work[1]).mul_(q).sum(-1)
    tie = torch.eq(r, kt, out=work[1])
    if not bool((tie.sum(-1) > 1).any()):  # t ties with itself only
        return lower
    return lower + _prefix(tie.mul_(q), t, work[0])


def mass_below_token(p: torch.Tensor, q: torch.Tensor, t: torch.Tensor, key_t: torch.Tensor,
                     rank: str, work: Work | None = None) -> torch.Tensor:
    """``F^-(t)`` ``[R]``: the mass of ``q [R, V]`` ranked below token ``t [R]`` of key
    ``key_t [R]`` (a smaller key, or the same key and a smaller id); ``work``: scratch
    (:func:`workspace`) of at least ``R`` rows."""
    R, V = q.shape
    work = workspace(R, V, q.device) if work is None else (work[0][:R], work[1][:R])
    if rank != "capped":
        return _mass_under(p, q, t, key_t, work)
    low = key_t < 1.0
    if not bool(low.any()):
        return _mass_top(p, q, t, work)
    if bool(low.all()):
        return _mass_under(p, q, t, key_t, work)
    out = _mass_top(p, q, t, work)
    i = torch.nonzero(low).squeeze(-1)
    n = i.numel()
    out[i] = _mass_under(p[i], q[i], t[i], key_t[i], (work[0][:n], work[1][:n]))
    return out


def mass_below(p: torch.Tensor, q: torch.Tensor, rank: str,
               work: Work | None = None) -> torch.Tensor:
    """``F^-`` of every token, ``[R, V]`` (undefined where ``q = 0``: such a token adds no mass
    and its ``q*`` is 0). With the capped key the tokens with ``p >= q`` tie at the top in
    token order; the others are sorted stably by ``p / q``, compacted to the longest such
    row. ``work``: scratch (:func:`workspace`) of at least ``R`` rows."""
    R, V = q.shape
    if rank == "capped":
        work = workspace(R, V, q.device) if work is None else (work[0][:R], work[1][:R])
        under = _under(p, q, work[0])
        r, c = torch.nonzero(under > 0, as_tuple=True)                   # row-major: ids ascend
        total = under.sum(-1, keepdim=True)
        top = torch.sub(q, under, out=work[1])
        below = torch.cumsum(top, -1, out=work[0]).sub_(top).add_(total)
    else:
        r, c = torch.nonzero(q > 0, as_tuple=True)
        below = torch.zeros_like(q)
    if r.numel() == 0:
        return below
    src = r * V + c
    q_c = q.view(-1).index_select(0, src)
    keys = p.view(-1).index_select(0, src).div_(q_c)                     # >= 0: q > 0 here
    if R == 1:  # one row (a CPU chunk at a large V): nothing to pad
        dst, keys, mass = None, keys.unsqueeze(0), q_c.unsqueeze(0)
    else:  # rows padded to the longest with inf keys, which sort last
        counts = torch.bincount(r, minlength=R)
        width = int(counts.max())
        dst = r * width + torch.arange(r.numel(), device=q.device) - (counts.cumsum(0) -
                                                                      counts)[r]
        keys = torch.full((R * width,), torch.inf, dtype=q.dtype, device=q.device) \
            .index_copy_(0, dst, keys).view(R, width)
        mass = torch.zeros_like(keys).view(-1).index_copy_(0, dst, q_c).view(R, width)
    # non-negative float64 keys order as their int64 bits (a faster sort)
    order = torch.sort(keys.view(torch.int64), dim=-1, stable=True).indices
    ranked = mass.gather(-1, order)
    back = mass.scatter_(-1, order, torch.cumsum(ranked, -1).sub_(ranked)).view(-1)
    below.view(-1).index_copy_(0, src, back if dst is None else back.index_select(0, dst))
    return below


def _top_child(key: torch.Tensor, x: torch.Tensor,
               alive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, key of t)`` ``[B]``: the highest-ranked token among the surviving children
    ``x [B, k]`` (``alive``) of keys ``key [B, k]``, the largest key, ties by the largest token
    id."""
    kx = torch.where(alive, key, -2.0)                                   # below every key
    best = kx.amax(-1, keepdim=True)
    return torch.where(kx == best, x, -1).amax(-1), best.squeeze(-1)


def _step(p, q, d: int, b, r, x, alive, rank: str, ws) -> torch.Tensor:
    """Depth ``d`` of requests ``b`` (node rows ``r``, children ``x [R, k]``, ``alive``):
    ``[R, 4]`` float64 columns, the highest-ranked child ``t``, ``p(t)``, ``q(t)``, ``F^-(t)``.
    ``ws``: four row buffers (:func:`workspace`)."""
    at = (b, r, torch.full_like(b, d))
    pn, qn = normalised_rows(p, at, out=ws[0]), normalised_rows(q, at, out=ws[1])
    t, key_t = _top_child(rank_keys(pn.gather(-1, x), qn.gather(-1, x), rank), x, alive)
    col = t.unsqueeze(-1)
    p_t, q_t = pn.gather(-1, col).squeeze(-1), qn.gather(-1, col).squeeze(-1)
    F = mass_below_token(pn, qn, t, key_t, rank, ws[2:4])
    return torch.stack([t.to(torch.float64), p_t, q_t, F], -1)


def select(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
           rank: str = "capped", ws: tuple[torch.Tensor, ...] | None = None) -> Selection:
    """Greedy selection (pass 1): ``drafts [B, k, g]``, ``p [B, k, g+1, V]``,
    ``q [B, k, g, V]``; ``ws``: four row buffers (:func:`workspace`) of a chunk."""
    B, k, g = drafts.shape
    dev, V = drafts.device, p.shape[-1]
    ws = workspace(min(B, chunk_rows(V, dev)), V, dev, 4) if ws is None else ws
    idx = torch.arange(B, device=dev)
    alive = torch.ones(B, k, dtype=torch.bool, device=dev)
    rows = torch.zeros(B, g, dtype=torch.int64, device=dev)
    found = torch.zeros(3, B, g, dtype=torch.float64, device=dev)      # p(t), q(t), F^-(t)
    for d in range(g):
        rows[:, d] = first_true(alive)
        x = drafts[:, :, d]                                              # [B, k]
        step = by_row_chunks(lambda *a, d=d: _step(p, q, d, *a, rank, ws), V, idx,
                             rows[:, d], x, alive)
        found[:, :, d] = step[:, 1:].T
        alive &= x == step[:, :1].long()
    # the prefixes' masses, as the numpy core's running sums: A += m F^-(t), m *= q(t)
    p_t, q_t, F = found
    m = torch.cumprod(torch.cat([torch.ones_like(q_t[:, :1]), q_t[:, :-1]], -1), -1)
    A = torch.cumsum(torch.cat([torch.zeros_like(F[:, :1]), (m * F)[:, :-1]], -1), -1)
    return Selection(first_true(alive), rows, A, m, p_t / skewed(q_t, F, A, m, k))


def _residual(p, q, sel: Selection, b, i, w, k: int, rank: str, ws) -> torch.Tensor:
    """``max(w p_i - q*_i, 0)`` ``[R, V]`` at the selected path's nodes ``(b, i)`` ``[R]``, in
    ``ws[0]`` (six row buffers, :func:`workspace`)."""
    at = (b, sel.rows[b, i], i)
    pn, qn = normalised_rows(p, at, out=ws[0]), normalised_rows(q, at, out=ws[1])
    qs = skewed(qn, mass_below(pn, qn, rank, ws[2:4]), sel.A[b, i, None], sel.m[b, i, None], k,
                overwrite_below=True, work=tuple(w[:b.numel()] for w in ws[3:6]))
    return pn.mul_(w.unsqueeze(-1)).sub_(qs).clamp_(min=0.0)


def _block(p, q, sel: Selection, eta, u, k: int, rank: str, ws):
    """Block verification of the selected paths (pass 2): ``(accepted [B], token [B])``, with
    ``eta [B, g]`` the selected path's coins, ``u [B, g+1]`` and ``ws`` six row buffers. The
    residual of the last test that passes is kept in ``stop [B, V]``: the stop's, which the
    token is drawn from."""
    B, g = sel.rows.shape
    V = p.shape[-1]
    w = weights(sel.ratios)                                              # [B, g+1]
    n = torch.where(eta[:, g - 1] < w[:, g], g, 0) if g else torch.zeros_like(sel.branch)
    stop = torch.empty(B, V, dtype=torch.float64, device=p.device)

    def test(b, i):  # test i of requests b: whether it passes; keeps the residual if so
        res = _residual(p, q, sel, b, i, w[b, i], k, rank, ws)
        passed = eta[b, i - 1] < stop_probability(res.sum(-1), w[b, i])
        stop[b[passed]] = res[passed]
        return passed

    def root(b, i):  # the stop at 0: w_0 = 1
        stop[b] = _residual(p, q, sel, b, i, w[b, 0], k, rank, ws)
        return b

    open_ = can_pass(eta[:, : g - 1], w[:, 1:g]) & (n < g).unsqueeze(-1)   # [B, g-1]
    for i in (torch.nonzero(open_.any(0)).squeeze(-1) + 1).tolist():
        # the largest passing i wins: a later pass overwrites
        b = torch.nonzero(open_[:, i - 1]).squeeze(-1)
        n[b[by_row_chunks(test, V, b, torch.full_like(b, i))]] = i
    y = torch.empty(B, dtype=torch.int64, device=p.device)
    bonus = torch.nonzero(n == g).squeeze(-1)
    if bonus.numel():
        y[bonus] = sample_rows(p[bonus, sel.branch[bonus], g], u[bonus, g])
    if g and bool((n == 0).any()):
        b = torch.nonzero(n == 0).squeeze(-1)
        by_row_chunks(root, V, b, n[b])
    drawn = torch.nonzero(n < g).squeeze(-1)
    if drawn.numel():
        y[drawn] = by_row_chunks(lambda b, i: search_cdf(
            stop[b].cumsum_(-1), u[b, i], fallback=lambda: p[b, sel.rows[b, i], i]),
            V, drawn, n[drawn])
    return n, y


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, rank: str = "capped") -> Verdict:
    """GBV, batched: ``drafts [B,k,g]`` (i.i.d. paths), ``p [B,k,g+1,V]``, ``q [B,k,g,V]``;
    keyed uniforms from ``seeds``, ``positions`` ``[B]``, or explicit ``accept_u [B,g,k]`` and
    ``sample_u [B,g+1]``; ``rank`` as :class:`coupling.rules.gbv.GBV`."""
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
    drafts, p, q, coins, u = prepare_tree(drafts, p, q, seeds, positions,
                                          replacement=replacement, validate=validate,
                                          atol=atol, accept_u=accept_u, sample_u=sample_u,
                                          rule="gbv")
    B, k, g = drafts.shape
    if not replacement and k > 1:
        raise ValueError("gbv verifies k i.i.d. paths (replacement=True): its skew is the law "
                         "of the largest of k i.i.d. paths")
    V = p.shape[-1]
    p, q = p.detach(), q.detach()  # laws of a draft in training: the twin differentiates nothing
    ws = workspace(min(B, chunk_rows(V, p.device)), V, p.device, 6)
    sel = select(drafts, p, q, rank, ws)
    eta = coins[torch.arange(B, device=p.device), :, sel.branch]                  # [B, g]
    n, y = _block(p, q, sel, eta, u, k, rank, ws)
    return assemble(drafts, n, sel.branch, y)
