r"""The batched walk of a static draft tree of any shape (:class:`coupling.Tree`).

The semantics and the layout are those of :mod:`coupling.rules.topology` with a batch axis:
``drafts [B, N]``, ``p [B, N + 1, V]`` and ``q [B, N + 1, V]`` (row 0 the root's laws, row
``1 + n`` those after node ``n``), ``coins [B, N]`` and ``u [B, depth + 1]``. At every depth
the nodes whose parent drafted the emitted prefix are the step's drafts: a rule's twin kernel
(its ``make_step``, :data:`.tree.StepFn`) reads them as ``x [A, N]`` with ``alive [A, N]``
marking them, the walk keeps the children that drafted the output, and the first output no
child drafted, or a leaf's bonus token, ends the call. The only Python loop is over depths.
"""

from __future__ import annotations

import functools

import torch

from ..keyed import MAX_DRAFTS, STREAM_ACCEPT, STREAM_SAMPLE
from ..tree import Tree
from .common import Verdict, check_probs, check_token_ids, sample_rows
from .laws import normalised_rows
from .rng import keyed_uniforms
from .tree import StepFn, first_true

__all__ = ["walk_topology", "tree_uniforms", "verify_topology"]


@functools.lru_cache(maxsize=32)
def _layout(tree: Tree, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(parent row [N], coin counter [N])``: each node's parent as a law row (0 the root)
    and its coin's counter ``(depth - 1) MAX_DRAFTS + column`` (read only)."""
    if max(tree.columns) >= MAX_DRAFTS:
        raise ValueError(f"the tree has {max(tree.columns) + 1} nodes at one depth; the keyed "
                         f"coins take at most {MAX_DRAFTS}")
    parent = torch.tensor([a + 1 for a in tree.parent], dtype=torch.int64, device=device)
    counter = torch.tensor([(d - 1) * MAX_DRAFTS + c
                            for d, c in zip(tree.depths, tree.columns, strict=True)],
                           dtype=torch.int64, device=device)
    return parent, counter


def tree_uniforms(seeds: torch.Tensor, positions: torch.Tensor, tree: Tree, *,
                  draws_by_position: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(coins [B, N], u [B, depth + 1])`` keyed by each request's seed and position: the
    numbers :func:`coupling.rules.topology.tree_uniforms` gives the numpy walk."""
    s, t = seeds.view(-1, 1), positions.view(-1, 1)
    _, counter = _layout(tree, s.device)
    coins = keyed_uniforms(s, t, STREAM_ACCEPT, counter.view(1, -1))
    d = torch.arange(tree.depth + 1, device=s.device).view(1, -1)
    u = keyed_uniforms(s, t + d, STREAM_SAMPLE, 0) if draws_by_position \
        else keyed_uniforms(s, t, STREAM_SAMPLE, d)
    return coins, u


def walk_topology(step: StepFn, tree: Tree, drafts: torch.Tensor, p: torch.Tensor,
                  q: torch.Tensor, coins: torch.Tensor, u: torch.Tensor) -> Verdict:
    """Walk the tree (module doc). ``Verdict.branch`` holds the deepest accepted node (``-1``
    where none was) and ``tokens [B, depth + 1]`` the emitted tokens, padded with ``-1``."""
    B, N = drafts.shape
    dev = drafts.device
    parent, _ = _layout(tree, dev)
    S = torch.zeros(B, N + 1, dtype=torch.bool, device=dev)   # nodes that drafted the prefix
    S[:, 0] = True
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    accepted = torch.zeros(B, dtype=torch.int64, device=dev)
    node = torch.full((B,), -1, dtype=torch.int64, device=dev)
    nxt = torch.zeros(B, dtype=torch.int64, device=dev)
    tokens = torch.full((B, tree.depth + 1), -1, dtype=torch.int64, device=dev)
    for d in range(tree.depth + 1):
        act = torch.nonzero(~done).squeeze(1)
        if act.numel() == 0:
            break
        cand = S[act][:, parent]                                   # [A, N] the step's drafts
        ref = first_true(S[act])                                   # a row of the prefix's laws
        p_d = normalised_rows(p, (act, ref))
        leaf = ~cand.any(-1)
        y = torch.empty(act.numel(), dtype=torch.int64, device=dev)
        if bool(leaf.any()):                                       # the bonus token, y ~ p
            y[leaf] = sample_rows(p_d[leaf], u[act[leaf], d])
        judge = torch.nonzero(~leaf).squeeze(1)
        if judge.numel():
            a = act[judge]
            y[judge] = step(p_d[judge], normalised_rows(q, (a, ref[judge])), drafts[a],
                            cand[judge], coins[a], u[a, d], d, a)
        hit = cand & (drafts[act] == y.unsqueeze(1))
        go = hit.any(-1)
        tokens[act, d] = y
        stop = act[~go]
        nxt[stop] = y[~go]
        done[stop] = True
        go_rows = act[go]
        accepted[go_rows] += 1
        node[go_rows] = first_true(hit[go])
        S[go_rows] = torch.cat([torch.zeros_like(hit[go][:, :1]), hit[go]], 1)
    return Verdict(accepted, node, nxt, tokens)


def verify_topology(make_step, tree: Tree, drafts: torch.Tensor, p: torch.Tensor,
                    q: torch.Tensor, *, seeds: torch.Tensor | int, positions: torch.Tensor | int,
                    accept_u: torch.Tensor | None = None, sample_u: torch.Tensor | None = None,
                    validate: bool = True, atol: float | None = None,
                    draws_by_position: bool = False) -> Verdict:
    """A walk rule's twin on ``tree``: ``make_step(replacement) -> StepFn`` (the twin module's),
    shapes checked (values too unless ``validate=False``), keyed numbers unless
    ``accept_u [B, N]`` and ``sample_u [B, depth + 1]`` are given."""
    if not all(isinstance(t, torch.Tensor) for t in (drafts, p, q)):
        raise ValueError("drafts, p and q must be torch tensors")
    B, N = drafts.shape if drafts.ndim == 2 else (-1, -1)
    if N != tree.size or p.ndim != 3 or tuple(q.shape) != tuple(p.shape) \
            or tuple(p.shape[:2]) != (B, N + 1):
        raise ValueError(f"a {tree.size}-node tree takes drafts [B, N] = [B, {tree.size}] in "
                         f"node order and p, q [B, N + 1, V] (row 0 the root's laws, row 1 + n "
                         f"those after node n); got drafts {tuple(drafts.shape)}, p "
                         f"{tuple(p.shape)}, q {tuple(q.shape)}")
    check_token_ids(drafts)
    if validate:
        check_probs(p, "p", atol=atol)
        check_probs(q, "q", atol=atol)
        if bool((drafts >= p.shape[-1]).any()):
            raise ValueError(f"drafts hold token ids outside [0, V = {p.shape[-1]})")
    seeds = torch.as_tensor(seeds, device=drafts.device).expand(B).to(torch.int64)
    positions = torch.as_tensor(positions, device=drafts.device).expand(B).to(torch.int64)
    coins, u = tree_uniforms(seeds, positions, tree, draws_by_position=draws_by_position)
    coins = coins if accept_u is None else accept_u.to(torch.float64)
    u = u if sample_u is None else sample_u.to(torch.float64)
    if coins.shape != (B, N) or u.shape != (B, tree.depth + 1):
        raise ValueError(f"accept_u must be [B, N] = {(B, N)} and sample_u [B, depth + 1] = "
                         f"{(B, tree.depth + 1)}")
    step = make_step(tree.children == "iid")
    return walk_topology(step, tree, drafts, p, q, coins, u)
