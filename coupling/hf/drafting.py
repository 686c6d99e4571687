"""Drafting a tree of ``k`` branches of ``gamma`` tokens per row, with keyed randomness.

Model row ``r = b * k + j`` holds branch ``j`` of batch row ``b``. Every draw is a pure function
of the row's seed and the absolute position of the step's first drafted token ``t`` (the
verifier's ``positions``): branch ``j``'s token at offset ``i`` is drawn by inverse CDF from
``U(seed, t, STREAM_DRAFT, i * k + j)``. Start positions strictly increase along a row, so no
draw is reused by a later step, whose verification could otherwise see a draft correlated with
an earlier decision. A shared-noise rule (``rule.shared_noise``: ``gumbel``, ``gls``) drafts with
its keyed noise of the token's own position instead, the very noise its verifier reads (its
twin's ``draft_branches``: ``gls``'s branch ``c`` by its noise column ``c``).

Branches are i.i.d. (``replacement=True``), or their first tokens are ``k`` distinct draws from
the shared first law (``replacement=False``): successive draws without replacement, or the
rule's own draft law where its twin drafts one (a ``draft_roots(q [B, V], u [B, k])`` in the
rule's ``torch`` module: ``greedy``'s likeliest tokens and one draw, ``spechub``'s hub pair),
with the same uniforms; each branch then continues as a chain of its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import tree as topology
from ..keyed import STREAM_DRAFT
from ..rules import RULES
from ..torch_backend import sample_rows, uniforms
from .options import Options
from .processors import Laws
from .ragged import RaggedCache
from .vocab import Retokenizer

__all__ = ["Chains", "Leaves", "draft_tree", "draft_topology", "draw"]


@dataclass
class Chains:
    """``drafts [B, k, g]`` and their laws ``q [B, k, g, V]``."""

    drafts: torch.Tensor
    q: torch.Tensor


def draft_tree(draft: RaggedCache, laws: Laws, opts: Options, feed: tuple[torch.Tensor, ...],
               ext: torch.Tensor, cur: torch.Tensor, batch_rows: torch.Tensor,
               seeds: torch.Tensor, starts: torch.Tensor,
               vocab: Retokenizer | None = None) -> Chains:
    """Draft every branch of every row.

    ``feed = (tokens, real)`` ``[R, m]``: what the draft cache still lacks before the first
    drafted token. ``ext [R, L]``: each model row's sequence as plain ``generate`` holds it, in
    its first ``cur[r]`` columns; the drafts are written after it (the context of the next
    law), ``batch_rows [R]`` the input batch row of each. ``seeds``, ``starts`` ``[B]``: the
    rows' seeds and first drafted positions. ``vocab``: an assistant with another tokenizer
    (:mod:`.vocab`), whose logits are restricted to the shared pieces, as target ids, and
    which is fed its own ids of the pieces drafted.
    """
    k, g = opts.num_drafts, opts.gamma
    R = ext.shape[0]
    rows = torch.arange(R, device=ext.device)
    u = None
    if opts.do_sample and not RULES[opts.rule].shared_noise:
        u = uniforms(seeds, starts, g * k, stream=STREAM_DRAFT).to(ext.device)  # [B, g*k]
    tokens, real = feed
    drafts, qs = [], []
    for i in range(g):
        logits = draft.forward(tokens, real, last_only=True)[:, 0]
        if vocab is not None:
            logits = vocab.logits(logits)
        _, q = laws(ext, cur + i, batch_rows, logits)
        if i == 0 and k > 1:  # one context: every branch's first law is branch 0's, bit for bit
            q = q[::k].repeat_interleave(k, 0)
        x = draw(q, i, opts, u, seeds, starts)
        ext[rows, cur + i] = x
        drafts.append(x)
        qs.append(q)
        fed = x if vocab is None else vocab.draft_ids(x)
        tokens, real = fed.unsqueeze(1), torch.ones_like(x).unsqueeze(1)
    B = R // k
    return Chains(torch.stack(drafts, 1).view(B, k, g), torch.stack(qs, 1).view(B, k, g, -1))


def draw(q: torch.Tensor, i: int, opts: Options, u: torch.Tensor | None, seeds: torch.Tensor,
         starts: torch.Tensor) -> torch.Tensor:
    """The tokens drafted at offset ``i`` from ``q [R, V]``, ``R = B k`` rows (module doc):
    ``u [B, g k]`` the step's drafting uniforms (``None`` for a shared-noise rule or greedy
    laws), ``seeds``, ``starts`` ``[B]``. Returns ``[R]``."""
    k = opts.num_drafts
    if not opts.do_sample:
        return q.argmax(-1)
    rule = RULES[opts.rule]
    if rule.shared_noise:
        B = q.shape[0] // k
        return rule.torch.draft_branches(q.view(B, k, -1), seeds.to(q.device),
                                         starts.to(q.device) + i).reshape(-1)
    ui = u[:, i * k:(i + 1) * k].reshape(-1)  # [B*k], row b*k+j gets U(., i*k + j)
    if i == 0 and k > 1 and not opts.replacement:
        return _distinct_first(q[::k], u[:, :k], opts.rule)
    return sample_rows(q, ui)


def _distinct_first(q0: torch.Tensor, u: torch.Tensor, rule: str) -> torch.Tensor:
    """``k`` distinct first tokens from each row of ``q0 [B, V]`` with the uniforms ``u [B, k]``
    (module doc); returns ``[B*k]`` (row-major: the k first tokens of each row)."""
    B, k = u.shape
    support = (q0 > 0).sum(-1)
    if bool((support < k).any()):
        raise ValueError(
            f"replacement=False drafts {k} distinct first tokens, but the draft's processed law "
            f"has only {int(support.min())} token(s) of positive probability at some row (top-k, "
            "top-p or min-p cut it); lower num_drafts or use replacement=True")
    own = getattr(RULES[rule].torch, "draft_roots", None)
    if own is not None:
        return own(q0, u).reshape(-1)
    w = q0.to(torch.float64).clone()
    out = []
    for j in range(k):  # each draw removes its token from the law of the next
        x = sample_rows(w, u[:, j])
        w.scatter_(1, x.unsqueeze(1), 0.0)
        out.append(x)
    return torch.stack(out, 1).reshape(-1)


@dataclass(frozen=True)
class Leaves:
    """A static tree (:class:`coupling.Tree`) laid out as one model row per leaf: row ``l``
    holds the path from the root to leaf ``l``, its tokens at offsets ``0..depth - 1``
    (holes after a short path)."""

    path: torch.Tensor    # [L, depth] the node at each offset of each leaf's path, -1 after it
    length: torch.Tensor  # [L] the path's length (its leaf's depth)
    row: torch.Tensor     # [N + 1] the first leaf whose path holds each node (the root first)
    offset: torch.Tensor  # [N + 1] each node's depth (0 for the root)

    @classmethod
    @functools.lru_cache(maxsize=16)     # one layout per tree and device, read every step
    def of(cls, tree: topology.Tree, device: torch.device) -> Leaves:
        leaves = [n for n in range(tree.size) if not tree.kids[n]]
        path = torch.full((len(leaves), tree.depth), -1, dtype=torch.long)
        row = [0] * (tree.size + 1)
        for i, leaf in reversed(list(enumerate(leaves))):    # the first leaf wins
            nodes = tree.path_to(leaf)
            path[i, :len(nodes)] = torch.tensor(nodes)
            for n in nodes:
                row[1 + n] = i
        length = (path >= 0).sum(1)
        offset = torch.tensor([0, *tree.depths], dtype=torch.long)
        return cls(path.to(device), length.to(device), torch.tensor(row, device=device),
                   offset.to(device))

    @property
    def rows(self) -> int:
        return self.path.shape[0]


def draft_topology(draft: RaggedCache, laws: Laws, opts: Options, feed: tuple[torch.Tensor, ...],
                   ext: torch.Tensor, cur: torch.Tensor, batch_rows: torch.Tensor,
                   seeds: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill ``opts.tree`` for every row, level by level: one draft call per level feeds each
    leaf row the node of its path at that depth, giving the law after it; the children of a
    node are drawn from the law its first leaf row computed, by the tree's child law, node
    ``n`` with the keyed uniform ``U(seed, t, STREAM_DRAFT, n)`` (the chain layout's numbers
    on ``Tree.from_chains``). Returns ``drafts [B, N]`` in node order and ``q [B, N + 1, V]``
    (:mod:`coupling.rules.topology`'s layout; a node of the deepest level is never fed and
    gets the root's law, a row the walk never reads). Shapes as in :func:`draft_tree`, with
    ``R = B L`` model rows, ``L`` the tree's leaves."""
    tree = opts.tree
    lv = Leaves.of(tree, ext.device)
    L, D, N = lv.rows, tree.depth, tree.size
    R = ext.shape[0]
    B = R // L
    rows = torch.arange(R, device=ext.device)
    u = None
    if opts.do_sample and tree.children != "topk":
        u = uniforms(seeds, starts, N, stream=STREAM_DRAFT).to(ext.device)   # [B, N]
    drafts = torch.zeros(B, N, dtype=torch.long, device=ext.device)
    levels: list[torch.Tensor] = []                  # [B, L, V]: the law after offset d
    tokens, real = feed
    for d in range(D):
        logits = draft.forward(tokens, real, last_only=True)[:, 0]
        _, q = laws(ext, cur + d, batch_rows, logits)
        levels.append(q.view(B, L, -1))
        for a in [-1] if d == 0 else [n for n in range(N) if tree.depths[n] == d]:
            kids = list(tree.kids[a])
            if kids:
                law = levels[d][:, int(lv.row[1 + a])]                          # [B, V]
                drafts[:, kids] = _children(law, len(kids), u[:, kids] if u is not None
                                            else None, tree.children, opts.do_sample)
        node = lv.path[:, d]                                                    # [L]
        x = drafts[:, node.clamp(min=0)].reshape(-1)                            # [R]
        here = (node >= 0).repeat(B)
        ext[rows[here], (cur + d)[here]] = x[here]
        tokens, real = x.unsqueeze(1), here.to(torch.long).unsqueeze(1)
    stacked = torch.stack(levels, 2)                                            # [B, L, D, V]
    offset = lv.offset.clamp(max=D - 1)
    q = stacked[:, lv.row, offset]                                              # [B, N + 1, V]
    deepest = lv.offset == D
    q[:, deepest] = stacked[:, :1, 0]
    return drafts, q


def _children(law: torch.Tensor, m: int, u: torch.Tensor | None, children: str,
              do_sample: bool) -> torch.Tensor:
    """``m`` children of a node per row from ``law [B, V]``: i.i.d. inverse-CDF draws with the
    uniforms ``u [B, m]``, successive draws without replacement, or the ``m`` likeliest tokens
    (``children="topk"``, or greedy laws). Returns ``[B, m]``."""
    B = law.shape[0]
    if children == "topk":
        return law.topk(m, -1).indices
    if not do_sample:
        return law.argmax(-1, keepdim=True).expand(B, m)
    if children == "iid":
        return sample_rows(law.repeat_interleave(m, 0), u.reshape(-1)).view(B, m)
    support = (law > 0).sum(-1)
    if bool((support < m).any()):
        raise ValueError(f"the tree has a node with {m} children drawn without replacement, "
                         f"but the draft's processed law has only {int(support.min())} token(s) "
                         "of positive probability at some row (top-k, top-p or min-p cut it); "
                         "use fewer children or children='iid'")
    w = law.to(torch.float64).clone()
    out = []
    for j in range(m):
        x = sample_rows(w, u[:, j])
        w.scatter_(1, x.unsqueeze(1), 0.0)
        out.append(x)
    return torch.stack(out, 1)
