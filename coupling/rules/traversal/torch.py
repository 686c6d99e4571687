r"""``traversal``'s batched torch twin: traversal verification of ``B`` draft trees at once.

The trie is held per request as *slots* ``(j, i)``: the node at depth ``i`` whose lowest path
is ``j`` lives in slot ``(j, i)``; ``owner[b, j, i]`` says whether path ``j`` is the lowest
path through its depth-``i`` prefix (slot in use), and ``low[b, j, i]`` is that lowest path,
so the parent of slot ``(j, i)`` is ``(low[b, j, i - 1], i - 1)`` and children ordered by
first appearance are slots in ascending ``j``. Every node state of
:mod:`coupling.rules.traversal` is a tensor over slots: weights ``w [B, k, g + 1]``, target
laws ``r [B, k, g + 1, V]``, draft laws ``s [B, k, g, V]`` (float64).

Every state starts from the float64-normalised laws ``p / sum p``, ``q / sum q`` per row
(:mod:`coupling.torch_backend.laws`), the numpy core's arithmetic, so laws given in float32 or
half precision give exactly the normalised target's law.

One step for every unfinished request: walk from the root to the first leaf (first remaining
child at each depth: ``g`` masked reductions over ``k``), accept it if its coin is below its
weight (the root always), else delete it and update its parent (residual, weight, draft law
without the rejected token: ``O(V)``) and recompute the weights of the nodes no rejection
has touched, top-down (``g`` gathers). A request is done after at most ``k g + 1`` steps.

Randomness: the coin of slot ``(j, i)`` is ``accept_u[b, i - 1, j]`` (keyed:
``U(seed, t, STREAM_ACCEPT, (i - 1) * MAX_DRAFTS + j)``), the emitted token is drawn by inverse
CDF with ``sample_u[b, tau]`` (``U(seed, t, STREAM_SAMPLE, tau)``): the numbers
:func:`coupling.keyed.call_uniforms` hands the numpy core, which this twin matches decision
for decision up to float summation order (``tests/rules/test_traversal_torch.py``).
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, assemble, sample_rows
from ...torch_backend.laws import normalised_rows
from ...torch_backend.tree import first_true, prepare_tree

__all__ = ["verify", "walk", "slots"]


def slots(drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(low, owner)`` of ``drafts [B, k, g]``, both ``[B, k, g + 1]``: the lowest path with
    the same depth-``i`` prefix as path ``j``, and whether that is ``j`` itself."""
    B, k, g = drafts.shape
    same = drafts.unsqueeze(2) == drafts.unsqueeze(1)                     # [B, k, k, g]
    ones = torch.ones(B, k, k, 1, dtype=torch.bool, device=drafts.device)
    prefix = torch.cat([ones, same], -1).to(torch.uint8).cumprod(-1).bool()  # [B, k, k, g+1]
    low = prefix.to(torch.uint8).argmax(2)                                # [B, k, g + 1]
    owner = low == torch.arange(k, device=drafts.device).view(1, k, 1)
    return low, owner


class _Trees:
    """The state of ``B`` traversals (module doc)."""

    def __init__(self, drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor):
        self.drafts = drafts
        self.B, self.k, self.g = drafts.shape
        self.rows = torch.arange(self.B, device=drafts.device)
        self.low, self.alive = slots(drafts)
        # the walk rewrites its laws in place: fresh float64 rows of the normalised laws
        self.r = normalised_rows(p).view(p.shape)
        self.s = normalised_rows(q).view(q.shape)
        self.w = torch.ones(self.B, self.k, self.g + 1, dtype=torch.float64, device=p.device)
        self.touched = torch.zeros_like(self.alive)
        self.reweigh()

    def reweigh(self) -> None:
        """``w_c = min(w_v r_v(c) / s_v(c), 1)`` top-down, except where a rejection set it."""
        rows = self.rows.unsqueeze(1)
        for i in range(1, self.g + 1):
            par = self.low[:, :, i - 1]                                   # [B, k]
            tok = self.drafts[:, :, i - 1]
            w_par = self.w[:, :, i - 1].gather(1, par)
            r_t = self.r[rows, par, i - 1, tok]
            s_t = self.s[rows, par, i - 1, tok]
            safe = torch.where(s_t > 0, s_t, 1.0)
            new = torch.where(s_t > 0, torch.clamp(w_par * r_t / safe, max=1.0), 0.0)
            self.w[:, :, i] = torch.where(self.touched[:, :, i], self.w[:, :, i], new)

    def first_leaf(self, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``(j, d)`` of the first leaf in depth-first order, for the rows ``act``."""
        j = torch.zeros_like(act)
        d = torch.zeros_like(act)
        for i in range(1, self.g + 1):
            kids = self.alive[act, :, i] & (self.low[act, :, i - 1] == j.unsqueeze(1)) \
                & (d == i - 1).unsqueeze(1)
            down = kids.any(-1)
            j = torch.where(down, first_true(kids), j)
            d = torch.where(down, i, d)
        return j, d

    def reject(self, act: torch.Tensor, j: torch.Tensor, d: torch.Tensor) -> None:
        """Delete leaves ``(j, d)`` (``d >= 1``) of rows ``act`` and update their parents."""
        v = self.low[act, j, d - 1]
        t = self.drafts[act, j, d - 1]
        pd = d - 1
        self.alive[act, j, d] = False
        w, r, s = self.w[act, v, pd], self.r[act, v, pd], self.s[act, v, pd]
        res = (w.unsqueeze(-1) * r - s).clamp_(min=0.0)
        rho = res.sum(-1)
        den = rho + (1.0 - w)
        # den = 0 needs w = 1 and r = s: then the rejection had probability 0
        self.w[act, v, pd] = torch.where(den > 0, rho / torch.where(den > 0, den, 1.0), 1.0)
        self.r[act, v, pd] = torch.where((rho > 0).unsqueeze(-1),
                                         res / torch.where(rho > 0, rho, 1.0).unsqueeze(-1), r)
        rest = 1.0 - s.gather(-1, t.unsqueeze(-1))                        # [A, 1]
        s = s.scatter(-1, t.unsqueeze(-1), 0.0)
        self.s[act, v, pd] = torch.where(rest > 0, s / torch.where(rest > 0, rest, 1.0), s)
        self.touched[act, v, pd] = True
        self.reweigh()


def walk(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, coins: torch.Tensor,
         u: torch.Tensor) -> Verdict:
    """Traversal of validated ``drafts [B,k,g]``, ``p [B,k,g+1,V]``, ``q [B,k,g,V]`` with
    explicit ``coins [B,g,k]`` and ``u [B,g+1]``."""
    trees = _Trees(drafts, p, q)
    B, k, g = drafts.shape
    done = torch.zeros(B, dtype=torch.bool, device=drafts.device)
    stop_j = torch.zeros(B, dtype=torch.int64, device=drafts.device)
    stop_d = torch.zeros_like(stop_j)
    for _ in range(k * g + 1):          # every step accepts or deletes one of <= k g + 1 nodes
        act = torch.nonzero(~done).squeeze(1)
        if act.numel() == 0:
            break
        j, d = trees.first_leaf(act)
        coin = coins[act, (d - 1).clamp(min=0), j]
        accept = (d == 0) | (coin < trees.w[act, j, d])
        stop_j[act[accept]], stop_d[act[accept]] = j[accept], d[accept]
        done[act[accept]] = True
        if not bool(accept.all()):
            keep = ~accept
            trees.reject(act[keep], j[keep], d[keep])
    rows = trees.rows
    y = sample_rows(trees.r[rows, stop_j, stop_d], u[rows, stop_d])
    return assemble(drafts, stop_d, stop_j, y)


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """Traversal verification, batched: ``drafts [B,k,g]``, ``p [B,k,g+1,V]``,
    ``q [B,k,g,V]``; keyed uniforms from ``seeds``, ``positions`` ``[B]``, or explicit
    ``accept_u [B,g,k]`` and ``sample_u [B,g+1]``. ``replacement=False`` promises ``k``
    distinct first tokens (successive sampling), checked when ``validate``."""
    drafts, p, q, coins, u = prepare_tree(drafts, p, q, seeds, positions,
                                          replacement=replacement, validate=validate,
                                          atol=atol, accept_u=accept_u, sample_u=sample_u,
                                          rule="traversal")
    return walk(drafts, p, q, coins, u)
