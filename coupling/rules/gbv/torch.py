r"""``gbv``'s batched torch twin: greedy multi-path block verification of ``B`` draft trees.

Per depth ``d`` (a Python loop over ``gamma``), for every request at once: the selected node's
laws ``p, q [B, V]`` (its lowest path's, float64 over their sums), the ranking key
(``min(1, p/q)`` or ``p/q``, -1 where ``q = 0``) sorted stably (ties by token id),
the draft mass ranked below each token ``F^-`` (an exclusive cumulative sum
in rank order), the skewed law ``q^\star`` of
:mod:`coupling.rules.gbv` (``O(k V)``), and the highest-ranked child among the paths that
share the selected prefix (largest key, then largest token id: the rank order without its
positions). Then block verification of the selected path with ``q^\star``:
the block twin's :func:`~coupling.rules.block.torch.weights` and
:func:`~coupling.rules.block.torch.accepted`, and the residual at the stop.

Randomness: the selected path ``b``'s coins ``accept_u[:, :, b]`` (keyed:
``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS + b)``) and ``sample_u[:, tau]``: the numbers
:func:`coupling.keyed.call_uniforms` hands the numpy core, which this twin matches decision
for decision up to float summation order (``tests/rules/test_gbv_torch.py``). With ``k = 1``
it is the block twin coin for coin.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, assemble, emit_residual
from ...torch_backend.laws import normalised_rows, row_sums
from ...torch_backend.tree import first_true, prepare_tree
from ..block.torch import accepted, weights
from . import RANKS

__all__ = ["verify", "select", "skew"]


def skew(q: torch.Tensor, below: torch.Tensor, A: torch.Tensor, m: torch.Tensor,
         k: int) -> torch.Tensor:
    """The selected path's law at a node, ``[B, V]`` (the numpy :func:`~coupling.rules.gbv.skew`
    on float64 rows; ``A``, ``m`` ``[B]``)."""
    if k == 1:
        return q
    top = (A + m).unsqueeze(-1)
    a = (A.unsqueeze(-1) + m.unsqueeze(-1) * (below + q)) / top
    b = (A.unsqueeze(-1) + m.unsqueeze(-1) * below) / top
    low = A.unsqueeze(-1) / top
    num = sum(a**i * b ** (k - 1 - i) for i in range(k))
    den = sum(low ** (k - 1 - i) for i in range(k))
    out = q * num / den
    return out / out.sum(-1, keepdim=True)


def _ranked(p: torch.Tensor, q: torch.Tensor, rank: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(key, below)`` ``[B, V]``: each token's ranking key and the draft mass ranked below
    it (ascending key, ties by token id)."""
    ratio = p / torch.where(q > 0, q, 1.0)
    key = torch.where(q > 0, ratio.clamp_(max=1.0) if rank == "capped" else ratio, -1.0)
    order = torch.sort(key, dim=-1, stable=True).indices
    q_sorted = q.gather(-1, order)
    excl = torch.zeros_like(q_sorted)
    torch.cumsum(q_sorted[:, :-1], -1, out=excl[:, 1:])
    return key, torch.empty_like(q).scatter_(-1, order, excl)


def _top_child(key: torch.Tensor, x: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """The highest-ranked token among the surviving children ``x [B, k]`` (``alive``): the
    largest key, ties by the largest token id, as the rank order puts them."""
    kx = torch.where(alive, key.gather(-1, x), -2.0)                     # below every key
    best = kx.amax(-1, keepdim=True)
    return torch.where(kx == best, x, -1).amax(-1)


def select(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
           rank: str = "capped") -> tuple[torch.Tensor, torch.Tensor]:
    """``(branch [B], q_star [B, g, V])``: the lowest path equal to the selected one and its
    conditional laws (float64), on the normalised laws (:mod:`coupling.torch_backend.laws`)."""
    B, k, g = drafts.shape
    rows = torch.arange(B, device=drafts.device)
    alive = torch.ones(B, k, dtype=torch.bool, device=drafts.device)
    A = torch.zeros(B, dtype=torch.float64, device=drafts.device)
    m = torch.ones_like(A)
    q_star = torch.empty(B, g, p.shape[-1], dtype=torch.float64, device=p.device)
    for d in range(g):
        at = (rows, first_true(alive), torch.full_like(rows, d))
        pd, qd = normalised_rows(p, at), normalised_rows(q, at)
        key, below = _ranked(pd, qd, rank)
        q_star[:, d] = skew(qd, below, A, m, k)
        x = drafts[:, :, d]
        t = _top_child(key, x, alive).unsqueeze(-1)
        alive = alive & (x == t)
        A = A + m * below.gather(-1, t).squeeze(-1)
        m = m * qd.gather(-1, t).squeeze(-1)
    return first_true(alive), q_star


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
    rows = torch.arange(B, device=drafts.device)
    b, q_star = select(drafts, p, q, rank)
    x, P = drafts[rows, b], p[rows, b]                                    # [B, g], [B, g+1, V]
    sp, one = row_sums(P), torch.ones(B, g, dtype=torch.float64, device=p.device)
    ratio = P[:, :g].gather(-1, x.unsqueeze(-1)).squeeze(-1).to(torch.float64) / sp[:, :g] \
        / q_star.gather(-1, x.unsqueeze(-1)).squeeze(-1)
    w = weights(ratio)
    n = accepted(w, P, q_star, coins[rows, :, b], sums=(sp, one))
    w_n = torch.where(n == g, 1.0, w[rows, n])
    y = emit_residual(P, q_star, n, w_n, u[rows, n], sums=(sp[rows, n], one[:, 0]) if g
                      else None)
    return assemble(drafts, n, b, y)
