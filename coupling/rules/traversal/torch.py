r"""``traversal``'s batched torch twin: traversal verification of ``B`` draft trees at once.

The trie is held per request as *slots* ``(j, i)``: the node at depth ``i`` whose lowest path
is ``j`` lives in slot ``(j, i)``; ``owner[b, j, i]`` says whether path ``j`` is the lowest
path through its depth-``i`` prefix (slot in use), and ``low[b, j, i]`` is that lowest path,
so the parent of slot ``(j, i)`` is ``(low[b, j, i - 1], i - 1)`` and children ordered by
first appearance are slots in ascending ``j``. Every node state of
:mod:`coupling.rules.traversal` is held over slots without a ``V`` axis: weights
``w [B, k, g + 1]`` and each slot's parent's target and draft laws at the slot's token
(``rt``, ``st``), on the normalised laws ``p / sum p``, ``q / sum q``
(:mod:`coupling.torch_backend.laws`; the sums are read once per node). The touched nodes are
ancestors of the current leaf, at most one per depth: a touched node's target law is a
float64 row of a pool keyed by (request, depth), its draft law is ``q / sum q`` less the
removed children's tokens, divided in turn by each removal's ``1 - s(t)`` (the numpy core's
divisions, in its order). No ``[B, k, g + 1, V]`` float64 copy of the laws exists.

One step for every unfinished request: find the first leaf in depth-first order (the alive
slot without alive children of the lowest pre-order rank, :func:`preorder`: one scatter and
one argmin), accept it if its coin is below its weight (the root always), else delete it and
update its parent (residual, weight, draft law without the rejected token: ``O(V)`` on the
rejecting rows only) and recompute the weights of the nodes no rejection has touched,
top-down from the rejected depth (gathers over ``[B, k]``). A request is done after at most
``k g + 1`` steps.

Randomness: the coin of slot ``(j, i)`` is ``accept_u[b, i - 1, j]`` (keyed:
``U(seed, t, STREAM_ACCEPT, (i - 1) * MAX_DRAFTS + j)``), the emitted token is drawn by inverse
CDF with ``sample_u[b, tau]`` (``U(seed, t, STREAM_SAMPLE, tau)``): the numbers
:func:`coupling.keyed.call_uniforms` hands the numpy core, which this twin matches decision
for decision up to float summation order (``tests/rules/test_traversal_torch.py``).
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, assemble, sample_rows
from ...torch_backend.laws import row_sums, rows
from ...torch_backend.tree import prepare_tree

__all__ = ["verify", "walk", "slots", "preorder"]


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


def preorder(low: torch.Tensor) -> torch.Tensor:
    """Each slot's rank in depth-first pre-order ``[B, k, g + 1]`` (children by first
    appearance): slot ``(j, i)`` sorts by its ancestors' slots ``low[j, 1..i]``, a prefix before
    its extensions; a stable sort per depth, the last first."""
    B, k, g1 = low.shape
    depth = torch.arange(g1, device=low.device)
    # key of slot (j, i) at depth i' >= 1: low[j, i'] + 1 if i' <= i, else 0
    key = torch.where(depth.view(1, 1, g1, 1) <= depth.view(1, 1, 1, g1),
                      low.unsqueeze(-1) + 1, 0).transpose(2, 3).reshape(B, k * g1, g1)
    order = torch.arange(k * g1, device=low.device).expand(B, -1)
    for i in range(g1 - 1, 0, -1):
        order = order.gather(1, torch.sort(key[:, :, i].gather(1, order), stable=True).indices)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(k * g1, device=low.device).expand(B, -1))
    return rank.view(B, k, g1)


class _Trees:
    """The state of ``B`` traversals (module doc)."""

    def __init__(self, drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor):
        self.drafts, self.p, self.q = drafts, p, q
        self.B, self.k, self.g = B, k, g = drafts.shape
        dev = drafts.device
        self.rows = torch.arange(B, device=dev)
        self.low, self.alive = slots(drafts)
        self.rank = preorder(self.low)
        # each slot (j, i >= 1)'s parent slot (low[j, i - 1], i - 1), flat over [k, g + 1]
        self.parent = (self.low[:, :, :g] * (g + 1)
                       + torch.arange(g, device=dev)).reshape(B, -1)
        self.sp, self.sq = _node_sums(p, q, self.alive[:, :, :g])
        self.w = torch.ones(B, k, g + 1, dtype=torch.float64, device=dev)
        self.touched = torch.zeros_like(self.alive)
        # r_v(x), s_v(x) of each slot's parent v at the slot's token x (slot (j, 0): unused)
        self.rt = torch.zeros(B, k, g + 1, dtype=torch.float64, device=dev)
        self.st = torch.zeros_like(self.rt)
        for i in range(1, g + 1):
            par, x = self.low[:, :, i - 1], drafts[:, :, i - 1]
            at = (self.rows.unsqueeze(1), par, i - 1, x)
            self.rt[:, :, i] = p[at].to(torch.float64) / self.sp[:, :, i - 1].gather(1, par)
            self.st[:, :, i] = q[at].to(torch.float64) / self.sq[:, :, i - 1].gather(1, par)
        # a touched node's target law lives in a pool row, one per (request, depth): the
        # touched nodes are ancestors of the current leaf; its draft law is q / sum q less
        # the removed children's tokens, divided in turn by each removal's 1 - s(t)
        self.home = torch.full((B, g), -1, dtype=torch.int64, device=dev)
        self.pool = torch.empty(0, p.shape[-1], dtype=torch.float64, device=dev)
        self.used = 0
        self.gone = torch.zeros(B, g, k, dtype=torch.int64, device=dev)
        self.rest = torch.ones(B, g, k, dtype=torch.float64, device=dev)
        self.n_gone = torch.zeros(B, g, dtype=torch.int64, device=dev)
        self.reweigh()

    def reweigh(self, start: int = 1) -> None:
        """``w_c = min(w_v r_v(c) / s_v(c), 1)`` top-down from depth ``start`` (the weights
        above it are current), except where a rejection set it."""
        for i in range(start, self.g + 1):
            w_par = self.w[:, :, i - 1].gather(1, self.low[:, :, i - 1])
            r_t, s_t = self.rt[:, :, i], self.st[:, :, i]
            safe = torch.where(s_t > 0, s_t, 1.0)
            new = torch.where(s_t > 0, torch.clamp(w_par * r_t / safe, max=1.0), 0.0)
            self.w[:, :, i] = torch.where(self.touched[:, :, i], self.w[:, :, i], new)

    def first_leaf(self, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``(j, d)`` of the first leaf in depth-first order, for the rows ``act``: the
        alive slot without alive children of the lowest pre-order rank (deletions remove
        leaves only, so the alive slots are a subtree and this is the walk from the root
        down the first alive children)."""
        B, k, g1 = self.alive.shape
        kids = torch.zeros(B, k * g1, dtype=torch.int64, device=self.rows.device)
        kids.scatter_add_(1, self.parent, self.alive[:, :, 1:].reshape(B, -1).long())
        leaf = self.alive & (kids.view(B, k, g1) == 0)
        at = torch.where(leaf, self.rank, k * g1).view(B, -1)[act].argmin(-1)
        return at // g1, at % g1

    def laws(self, act: torch.Tensor, v: torch.Tensor, pd: torch.Tensor,
             fresh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target and draft laws ``[A, V]`` (float64) of nodes ``(v, pd)`` of rows
        ``act``; ``fresh``: no rejection has touched the node yet."""
        r = torch.div(rows(self.p, (act, v, pd)), self.sp[act, v, pd].unsqueeze(-1))  # float64
        old = torch.nonzero(~fresh).squeeze(1)
        if old.numel():
            r[old] = self.pool[self.home[act[old], pd[old]]]
        s = torch.div(rows(self.q, (act, v, pd)), self.sq[act, v, pd].unsqueeze(-1))
        n = torch.where(fresh, 0, self.n_gone[act, pd])
        for h in range(int(n.max()) if n.numel() else 0):
            on = h < n
            t = self.gone[act, pd, h].unsqueeze(-1)
            s.scatter_(-1, t, torch.where(on.unsqueeze(-1), 0.0, s.gather(-1, t)))
            s.div_(torch.where(on, self.rest[act, pd, h], 1.0).unsqueeze(-1))
        return r, s

    def store(self, act: torch.Tensor, pd: torch.Tensor, r: torch.Tensor) -> None:
        """Write the rows ``r`` to the pool rows of ``(act, pd)``, allocating the missing."""
        new = torch.nonzero(self.home[act, pd] < 0).squeeze(1)
        if new.numel():
            need = self.used + new.numel()
            if need > self.pool.shape[0]:  # amortised growth: the pool doubles
                grown = self.pool.new_empty(max(need, 2 * self.pool.shape[0]), r.shape[-1])
                grown[: self.used] = self.pool[: self.used]
                self.pool = grown
            self.home[act[new], pd[new]] = torch.arange(self.used, need, device=r.device)
            self.used = need
        self.pool[self.home[act, pd]] = r

    def reject(self, act: torch.Tensor, j: torch.Tensor, d: torch.Tensor) -> None:
        """Delete leaves ``(j, d)`` (``d >= 1``) of rows ``act`` and update their parents."""
        v, t, pd = self.low[act, j, d - 1], self.drafts[act, j, d - 1], d - 1
        self.alive[act, j, d] = False
        fresh = ~self.touched[act, v, pd]
        r, s = self.laws(act, v, pd, fresh)
        w = self.w[act, v, pd]
        res = torch.mul(r, w.unsqueeze(-1)).sub_(s).clamp_(min=0.0)
        rho = res.sum(-1)
        den = rho + 1.0 - w
        # den = 0 needs w = 1 and r = s: then the rejection had probability 0
        self.w[act, v, pd] = torch.where(den > 0, rho / torch.where(den > 0, den, 1.0), 1.0)
        res.div_(torch.where(rho > 0, rho, 1.0).unsqueeze(-1))
        empty = torch.nonzero(rho <= 0).squeeze(1)  # no residual: the law stays (rows, not a
        if empty.numel():                           # select over [A, V], 5x slower on a CPU)
            res[empty] = r[empty]
        r = res
        self.store(act, pd, r)
        rest = 1.0 - s.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        div = torch.where(rest > 0, rest, 1.0)
        n = torch.where(fresh, 0, self.n_gone[act, pd])
        self.gone[act, pd, n], self.rest[act, pd, n] = t, div
        self.n_gone[act, pd] = n + 1
        # the children of v see its new laws at their tokens (t itself: s = 0)
        x = self.drafts[act, :, pd]                                        # [A, k]
        kid = (self.low[act, :, pd] == v.unsqueeze(1)).unsqueeze(-1)
        s_x = torch.where(x == t.unsqueeze(1), 0.0, s.gather(-1, x) / div.unsqueeze(1))
        at = (act.unsqueeze(1), torch.arange(self.k, device=act.device), d.unsqueeze(1))
        self.rt[at] = torch.where(kid[..., 0], r.gather(-1, x), self.rt[at])
        self.st[at] = torch.where(kid[..., 0], s_x, self.st[at])
        self.touched[act, v, pd] = True
        self.reweigh(int(d.min()))  # nothing above the shallowest rejected leaf changed

    def stop_laws(self, j: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """The target laws ``[B, V]`` at the stops ``(j, d)``, as float64 weights: a touched
        node's pool row, else the row of ``p`` (an inverse CDF needs no normalising)."""
        out = self.p[self.rows, j, d].to(torch.float64)
        hit = torch.nonzero(self.touched[self.rows, j, d]).squeeze(1)
        if hit.numel():
            out[hit] = self.pool[self.home[hit, d[hit]]]
        return out


def _node_sums(p: torch.Tensor, q: torch.Tensor,
               owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 row sums of ``p`` and ``q`` ``[B, k, g]`` at the slots in use (``owner``),
    read once each (0 elsewhere)."""
    at = torch.nonzero(owner, as_tuple=True)
    sp = torch.zeros(owner.shape, dtype=torch.float64, device=p.device)
    sq = torch.zeros_like(sp)
    sp[at], sq[at] = row_sums(p, at), row_sums(q, at)
    return sp, sq


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
    y = sample_rows(trees.stop_laws(stop_j, stop_d), u[trees.rows, stop_d])
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
