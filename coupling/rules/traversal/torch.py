r"""``traversal``'s batched torch twin: traversal verification of ``B`` draft trees at once.

Glossary (shapes in brackets)
-----------------------------
* *slot* ``(j, i)``: the node at depth ``i`` whose lowest path is ``j``; ``low [B, k, g + 1]``
  is the lowest path through path ``j``'s depth-``i`` prefix, so the parent of slot ``(j, i)``
  is ``(low[b, j, i - 1], i - 1)``, and a slot is in use where ``low[b, j, i] == j``
  (:func:`slots`).
* *candidate*: the first leaf in depth-first order. A rejection deletes the candidate, so the
  nodes are deleted in post-order and the candidate is the next node of the post-order
  sequence (:func:`postorder`): a pointer per request, no search of the tree. A candidate of
  weight 0 is rejected with its highest ancestor of weight 0 and that ancestor's subtree in
  one step (:meth:`_Trees.lift`): below a drafted token out of a truncated target's support,
  nothing there can be accepted or change what is read later.
* *weights* ``w [B, k, g + 1]``: :math:`w_c = \min(w_v r_v(c) / s_v(c), 1)` down the tree,
  from each slot's parent's target and draft laws at the slot's token (``rt``, ``st``; ``st``
  is ``inf`` where the draft law is 0), except at the *fixed* nodes, whose weight a rejection
  of a child set.
* *fixed* nodes (a child rejected) are ancestors of the candidate, at most one per depth: the
  target law of the fixed node at depth ``d`` of request ``b`` is a float64 row of a pool
  (``home [B, g]``), and its draft law is ``q`` times ``scale [B, g]`` (``1 / sum q`` divided
  by each rejection's ``1 - s(t)``) off the rejected tokens: a rejection sets the target law
  to 0 at its token, so no residual reads the draft law there and it is never zeroed.

Laws are the normalised ``p / sum p`` and ``q / sum q`` (:mod:`coupling.torch_backend.laws`).
The float64 sums are read a path at a time, at the path's first candidate
(:meth:`_Trees.read_paths`): a slot of a path not read yet has weight 0 until then, and the
nodes a request never reaches are never summed (with laws that reject early, most of the
tree). No ``[B, k, g + 1, V]`` float64 copy of the laws exists: a rejection reads the
parent's rows a chunk of rows at a time through one reused float64 buffer
(:func:`~coupling.torch_backend.laws.chunk_rows`).

One step for every unfinished request: read the candidate's path if it is new, test the
candidate's coin against its weight (the root always passes); on a rejection, update the
parent's target law, weight and draft scale (``O(V)`` on the rejecting rows only), the
parent's children's ``rt`` and ``st``, and the weights below the rejected depth. A request
is done after at most ``k g + 1`` steps.

Randomness: the coin of slot ``(j, i)`` is ``accept_u[b, i - 1, j]`` (keyed:
``U(seed, t, STREAM_ACCEPT, (i - 1) * MAX_DRAFTS + j)``), the emitted token is drawn by inverse
CDF with ``sample_u[b, tau]`` (``U(seed, t, STREAM_SAMPLE, tau)``): the numbers
:func:`coupling.keyed.call_uniforms` hands the numpy core, which this twin matches decision
for decision up to float rounding order (``tests/rules/test_traversal_torch.py``).
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, assemble, sample_rows
from ...torch_backend.laws import chunk_rows, row_sums, rows
from ...torch_backend.tree import prepare_tree

__all__ = ["verify", "walk", "slots", "postorder"]

Nodes = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # (request, slot path, depth), [A]

#: device types on which the pool of target laws is reserved whole (``B g`` rows) at the first
#: rejection: a CPU allocation's untouched pages cost nothing, where growing it cost a copy
#: and fresh page faults per doubling; an accelerator's allocator commits the whole block, so
#: elsewhere the pool doubles
RESERVE_WHOLE = frozenset({"cpu"})


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


def postorder(low: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots in use in depth-first post-order (children by first appearance), then the
    unused ones: ``(j, i)``, each ``[B, k (g + 1)]``.

    Slot ``(j, i)`` sorts by its ancestors' slots ``low[j, 1..i]`` followed, at every deeper
    depth, by ``k``, a key above every child's (a node after its descendants); an unused slot
    has its owner's keys and moves behind the used ones in a last stable sort."""
    B, k, g1 = low.shape
    depth = torch.arange(g1, device=low.device)
    # key of slot (j, i) at depth i' >= 1: low[j, i'] if i' <= i, else k
    key = torch.where(depth.view(1, 1, g1, 1) <= depth.view(1, 1, 1, g1),
                      low.unsqueeze(-1), k).transpose(2, 3).reshape(B, k * g1, g1)
    order = torch.arange(k * g1, device=low.device).expand(B, -1)
    for i in range(g1 - 1, 0, -1):
        order = order.gather(1, torch.sort(key[:, :, i].gather(1, order), stable=True).indices)
    unused = low != torch.arange(k, device=low.device).view(1, k, 1)
    last = unused.view(B, -1).gather(1, order).to(torch.uint8)
    order = order.gather(1, torch.sort(last, stable=True).indices)
    return order // g1, order % g1


class _Trees:
    """The state of ``B`` traversals (module doc)."""

    def __init__(self, drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor):
        self.drafts, self.p, self.q = drafts, p, q
        self.B, self.k, self.g = B, k, g = drafts.shape
        dev = drafts.device
        self.rows = torch.arange(B, device=dev)
        self.low, _ = slots(drafts)
        self.seq_j, self.seq_d = postorder(self.low)
        self.pos = torch.empty(B, k, g + 1, dtype=torch.int64, device=dev)  # index in seq
        self.pos.view(B, -1).scatter_(1, self.seq_j * (g + 1) + self.seq_d,
                                      torch.arange(k * (g + 1), device=dev).expand(B, -1))
        self.next = torch.zeros(B, dtype=torch.int64, device=dev)   # candidates deleted so far
        # float64 sums of p and q at the internal nodes, read a path at a time (read_paths)
        self.sp = torch.zeros(B, k, g, dtype=torch.float64, device=dev)
        self.sq = torch.zeros_like(self.sp)
        self.summed = torch.zeros(B, k, g, dtype=torch.bool, device=dev)
        self.ready = torch.zeros(B, k, dtype=torch.bool, device=dev)
        self.w = torch.ones(B, k, g + 1, dtype=torch.float64, device=dev)
        self.fixed = torch.zeros(B, k, g + 1, dtype=torch.bool, device=dev)
        # r_v(x), s_v(x) of each slot's parent v at the slot's token x (slot (j, 0): unused);
        # a slot of a path not read yet has weight 0 until it is
        self.rt = torch.zeros(B, k, g + 1, dtype=torch.float64, device=dev)
        self.st = torch.full_like(self.rt, torch.inf)
        self.scale = torch.zeros(B, g, dtype=torch.float64, device=dev)
        self.home = torch.full((B, g), -1, dtype=torch.int64, device=dev)
        self.pool = torch.empty(0, p.shape[-1], dtype=torch.float64, device=dev)
        self.used = 0
        n = min(B, chunk_rows(p.shape[-1], dev))
        self.buf = torch.empty(n, p.shape[-1], dtype=torch.float64, device=dev)

    def read_paths(self, act: torch.Tensor, j: torch.Tensor) -> None:
        """Make the weights of paths ``j`` of rows ``act`` current: on a path's first
        candidate, read the sums of its internal nodes not read yet and set its slots' ``rt``
        and ``st`` (but under a fixed node, whose rejections keep its children's current).
        The nodes a request never reaches are never summed: with laws that reject early, most
        of a tree."""
        need = torch.nonzero(~self.ready[act, j]).squeeze(1)
        if need.numel() == 0:
            return
        b, j = act[need], j[need]                    # one path per request
        self.ready[b, j] = True
        g = self.g
        depth = torch.arange(g, device=b.device).expand(b.numel(), g)
        bb = b.unsqueeze(1).expand(-1, g)
        v = self.low[b, j, :g]                       # [P, g]: the path's internal nodes
        node = (bb, v, depth)
        new = torch.nonzero(~self.summed[node], as_tuple=True)
        at = tuple(x[new] for x in node)
        self.sp[at], self.sq[at] = row_sums(self.p, at), row_sums(self.q, at)
        self.summed[at] = True
        x = self.drafts[b, j]                        # [P, g]: the path's tokens
        rt = self.p[(*node, x)].to(torch.float64) / self.sp[node]
        st = _positive(self.q[(*node, x)].to(torch.float64) / self.sq[node])
        kid = (bb, self.low[b, j, 1:], depth + 1)
        keep = self.fixed[node]
        self.rt[kid] = torch.where(keep, self.rt[kid], rt)
        self.st[kid] = torch.where(keep, self.st[kid], st)
        self.reweigh()

    def reweigh(self, start: int = 1) -> None:
        """``w_c = min(w_v r_v(c) / s_v(c), 1)`` top-down from depth ``start`` (the weights
        above it are current), except at the fixed nodes."""
        for i in range(start, self.g + 1):
            w_par = self.w[:, :, i - 1].gather(1, self.low[:, :, i - 1])
            new = torch.mul(w_par, self.rt[:, :, i]).div_(self.st[:, :, i]).clamp_(max=1.0)
            self.w[:, :, i] = torch.where(self.fixed[:, :, i], self.w[:, :, i], new)

    def lift(self, act: torch.Tensor, j: torch.Tensor,
             d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The highest ancestor of weight 0 of each candidate ``(j, d)`` of weight 0 (the
        candidate itself if its parent's weight is positive), made the candidate. A node of
        weight 0 gives its descendants weight 0 and is never accepted, and deleting a node
        under it changes nothing that is read again: its subtree, the nodes before it in
        post-order, is deleted in one step (below a drafted token out of a truncated
        target's support, a whole subtree)."""
        g1 = self.g + 1
        depth = torch.arange(g1, device=act.device)
        path = self.low[act, j]                                  # [A, g + 1]
        dead = (self.w[act.unsqueeze(1), path, depth] == 0) & (depth <= d.unsqueeze(1))
        top = dead.to(torch.uint8).argmax(-1)
        jz = path.gather(1, top.unsqueeze(1)).squeeze(1)
        self.next[act] = self.pos[act, jz, top]
        return jz, top

    def candidate(self, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot ``(j, d)`` of the first leaf of rows ``act``: the next node in post-order."""
        at = self.next[act].unsqueeze(1)
        return self.seq_j[act].gather(1, at).squeeze(1), self.seq_d[act].gather(1, at).squeeze(1)

    def place(self, act: torch.Tensor, pd: torch.Tensor) -> torch.Tensor:
        """The pool rows of ``(act, pd)``, allocating the missing (:data:`RESERVE_WHOLE`)."""
        new = torch.nonzero(self.home[act, pd] < 0).squeeze(1)
        if new.numel():
            need = self.used + new.numel()
            if need > self.pool.shape[0]:
                size = self.B * self.g if act.device.type in RESERVE_WHOLE \
                    else max(need, 2 * self.pool.shape[0])
                grown = self.pool.new_empty(size, self.pool.shape[1])
                grown[: self.used] = self.pool[: self.used]
                self.pool = grown
            self.home[act[new], pd[new]] = torch.arange(self.used, need, device=act.device)
            self.used = need
        return self.home[act, pd]

    def weighted_target(self, nodes: Nodes, w: torch.Tensor, fresh: torch.Tensor,
                        home: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``w r`` ``[n, V]`` (float64, into ``out`` if given) for the target laws ``r`` of
        ``nodes``: ``p / sum p`` where ``fresh`` (no child rejected yet), else the pool rows
        ``home``."""
        if out is None:
            out = self.buf.new_empty(home.numel(), self.buf.shape[1])
        if not bool(fresh.any()):
            return torch.mul(rows(self.pool, (home,)), w.unsqueeze(-1), out=out)
        # (w / sum p) p: one pass over each row
        torch.mul(rows(self.p, nodes), (w / self.sp[nodes]).unsqueeze(-1), out=out)
        if not bool(fresh.all()):
            out[~fresh] = self.pool[home[~fresh]] * w[~fresh].unsqueeze(-1)
        return out

    def target(self, nodes: Nodes, fresh: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
        """The target laws ``r`` ``[n, V]`` (float64) of ``nodes`` (:meth:`weighted_target`)."""
        one = torch.ones(home.shape, dtype=torch.float64, device=home.device)
        return self.weighted_target(nodes, one, fresh, home)

    def residual(self, nodes: Nodes, t: torch.Tensor, w: torch.Tensor, scale: torch.Tensor,
                 fresh: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
        """Write each node's new target law ``(w r - s)_+ / rho`` to its pool row (``r`` where
        ``rho = 0``), ``s = q scale`` less the rejected token ``t``; returns ``rho [A]``. A
        chunk of rows at a time: its passes stay in a core's cache."""
        A = t.numel()
        rho = torch.empty(A, dtype=torch.float64, device=t.device)
        step = self.buf.shape[0]
        for lo in range(0, A, step):
            c = slice(lo, min(lo + step, A))
            at = tuple(x[c] for x in nodes)
            res = self.weighted_target(at, w[c], fresh[c], home[c], self.buf[: c.stop - lo])
            res.addcmul_(rows(self.q, at), scale[c].neg().unsqueeze(-1)).clamp_(min=0.0)
            res.scatter_(-1, t[c].unsqueeze(-1), 0.0)
            total = torch.sum(res, -1, out=rho[c])
            if home[c].numel() == 1 and home.device.type == "cpu" and float(total) > 0:
                torch.div(res, total, out=rows(self.pool, (home[c],)))  # a view: one pass
                continue
            res.div_(torch.where(total > 0, total, 1.0).unsqueeze(-1))
            empty = torch.nonzero(total <= 0).squeeze(1)
            if empty.numel():   # no residual: the law stays
                res[empty] = self.target(tuple(x[empty] for x in at), fresh[c][empty],
                                         home[c][empty])
            self.pool.index_copy_(0, home[c], res)
        return rho

    def reject(self, act: torch.Tensor, j: torch.Tensor, d: torch.Tensor) -> None:
        """Delete the candidates ``(j, d)`` (``d >= 1``) of rows ``act`` and update their
        parents (module doc)."""
        self.next[act] += 1
        pd = d - 1
        v, t = self.low[act, j, pd], self.drafts[act, j, pd]
        w = self.w[act, v, pd]
        nodes = (act, v, pd)
        fresh = ~self.fixed[nodes]
        scale = torch.where(fresh, 1.0 / self.sq[nodes], self.scale[act, pd])
        home = self.place(act, pd)
        rho = self.residual(nodes, t, w, scale, fresh, home)
        den = rho + 1.0 - w
        # den = 0 needs w = 1 and r = s: then the rejection had probability 0
        self.w[nodes] = torch.where(den > 0, rho / torch.where(den > 0, den, 1.0), 1.0)
        rest = 1.0 - self.q[(*nodes, t)].to(torch.float64) * scale
        scale = scale / torch.where(rest > 0, rest, 1.0)
        self.scale[act, pd] = scale
        self.fixed[nodes] = True
        # the children of v see its new laws at their tokens (t itself: s = 0, st = inf)
        x = self.drafts[act, :, pd]                                        # [A, k]
        kid = self.low[act, :, pd] == v.unsqueeze(1)
        s_x = self.q[act.unsqueeze(1), v.unsqueeze(1), pd.unsqueeze(1), x].to(torch.float64)
        s_x = _positive(torch.where(x == t.unsqueeze(1), 0.0, s_x * scale.unsqueeze(1)))
        at = (act.unsqueeze(1), torch.arange(self.k, device=act.device), d.unsqueeze(1))
        self.rt[at] = torch.where(kid, self.pool[home.unsqueeze(1), x], self.rt[at])
        self.st[at] = torch.where(kid, s_x, self.st[at])
        self.reweigh(int(d.min()))  # nothing above the shallowest rejected leaf changed

    def stop_laws(self, j: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """The target laws ``[B, V]`` at the stops ``(j, d)``, as float64 weights: a fixed
        node's pool row, else the row of ``p`` (an inverse CDF needs no normalising)."""
        out = self.p[self.rows, j, d].to(torch.float64)
        hit = torch.nonzero(self.fixed[self.rows, j, d]).squeeze(1)
        if hit.numel():
            out[hit] = self.pool[self.home[hit, d[hit]]]
        return out


def _positive(s: torch.Tensor) -> torch.Tensor:
    """Draft probabilities with 0 as ``inf``: the weight ``w r / s`` of a child of no draft
    mass is then 0."""
    return torch.where(s > 0, s, torch.inf)


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
        j, d = trees.candidate(act)
        trees.read_paths(act, j)
        w = trees.w[act, j, d]
        accept = (d == 0) | (coins[act, (d - 1).clamp(min=0), j] < w)
        stop_j[act[accept]], stop_d[act[accept]] = j[accept], d[accept]
        done[act[accept]] = True
        if not bool(accept.all()):
            act, j, d, dead = act[~accept], j[~accept], d[~accept], w[~accept] == 0
            if bool(dead.any()):
                j[dead], d[dead] = trees.lift(act[dead], j[dead], d[dead])
            trees.reject(act, j, d)
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
