r"""Verifying a static draft tree of any shape (:class:`coupling.Tree`) node by node.

Layout of one request (numpy here, ``[B, ...]`` in :mod:`coupling.torch_backend.topology`)
--------------------------------------------------------------------------------------
``drafts [N]``
    the token drafted at each node, in the tree's node order;
``p [N + 1, V]``, ``q [N + 1, V]``
    row 0: the target's and the draft's law after the context (the root); row ``1 + n``:
    after node ``n``'s prefix (what its children were drafted from, or the bonus law at a
    leaf);
``coins [N]``, ``u [depth + 1]``
    node ``n``'s coin and the draw of the token emitted after ``d`` accepted tokens. Keyed
    (:func:`tree_uniforms`): node ``n`` at depth ``d`` in column ``c`` of its depth (its index
    among the nodes of depth ``d``) has the coin ``U(seed, t, STREAM_ACCEPT, (d - 1)
    MAX_DRAFTS + c)``, so on ``Tree.from_chains(k, gamma)`` every node gets the coin of its
    branch and offset in the chain layout; the draws are the rule's own
    (:meth:`~coupling.rules.base.Rule.call_uniforms`: ``U(seed, t, STREAM_SAMPLE, d)``, or
    by the token's absolute position for a rule with ``draws_by_position``).

The walk (:func:`walk_topology`): hold the set ``S`` of nodes that drafted the emitted prefix
(the root at first), judge the tokens of all their children with the rule's single-step core
(their coins, then the depth's draw), continue with the children that drafted the output, stop
at the first output no child drafted or at a leaf's bonus token. Its law is
:func:`coupling.sequence.topology.topology_outcomes`'s, and it is lossless for the rules and
trees :func:`check_tree_rule` admits (that module's doc gives the argument).
"""

from __future__ import annotations

import numpy as np

from ..keyed import MAX_DRAFTS, STREAM_ACCEPT, uniforms
from ..tree import Tree
from .base import Rule
from .common import categorical

__all__ = ["check_tree_rule", "check_twin_topology", "node_columns", "tree_uniforms",
           "walk_topology"]


def check_tree_rule(rule: Rule, tree: Tree) -> None:
    """``ValueError`` unless ``rule`` verifies ``tree`` losslessly by the walk (module doc of
    :mod:`coupling.sequence.topology`); ``TypeError`` for a ``tree`` that is no Tree."""
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")
    chains = tree.chains()
    if chains is not None:
        rule.require(chains[0], chains[2])
        return
    why = None
    if rule.unit != "token" and not callable(getattr(rule, "topology_law", None)):
        why = "it judges k paths of equal length as a whole; give it Tree.from_chains(k, gamma)"
    elif rule.shared_noise:
        why = ("its drafter draws keyed noise columns along k chains, which a static topology "
               "would reuse; give it Tree.from_chains(k, gamma)")
    elif tree.children == "topk" and not rule.drafter_invariant:
        why = ("top-k children are no draws from q, and only a drafter-invariant rule (such as "
               "'strict') is lossless on drafts it did not draw; use children='iid' or 'distinct'")
    elif tree.children != "topk" and rule.own_draft_law:
        why = "it verifies drafts of its own law, not i.i.d. or successive draws from q"
    elif tree.children != "topk":
        m = _widest_step(tree)
        if not rule.supports(m, tree.children == "iid"):
            why = rule.support_text
    if why is not None:
        raise ValueError(f"rule {rule.name!r} cannot verify this {tree.size}-node tree: {why}")


def _widest_step(tree: Tree) -> int:
    """The most drafts one step can judge: a node's children, or with i.i.d. children those of
    every node at one depth (all siblings may coincide)."""
    if tree.children != "iid":
        return max(len(c) for c in tree.kids)
    return max(tree.columns) + 1


def node_columns(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """``(depth [N], column [N])``: each node's depth (1 under the root) and its index among
    the nodes of that depth; ``ValueError`` past :data:`coupling.keyed.MAX_DRAFTS` columns."""
    depth = np.array(tree.depths, dtype=np.int64)
    column = np.array(tree.columns, dtype=np.int64)
    if column.max() >= MAX_DRAFTS:
        raise ValueError(f"the tree has {int(column.max()) + 1} nodes at one depth; the keyed "
                         f"coins take at most {MAX_DRAFTS}")
    return depth, column


def tree_uniforms(rule: Rule, seed: int, position: int,
                  tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """One request's keyed numbers for a tree: ``(coins [N], u [depth + 1])``, the coins by
    node (module doc), the draws the rule's own (:meth:`Rule.call_uniforms`)."""
    depth, column = node_columns(tree)
    counters = ((depth - 1) * MAX_DRAFTS + column).astype(np.uint64)
    coins = uniforms(seed, position, STREAM_ACCEPT, counters).reshape(tree.size)
    return coins, rule.call_uniforms(seed, position, tree.depth, 1)[1]


def walk_topology(rule: Rule, tree: Tree, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                  coins: np.ndarray, u: np.ndarray) -> tuple[int, int, int]:
    """Verify one request's tree with explicit numbers: ``(accepted, node, next_token)``,
    ``node`` the deepest accepted node (``-1``: none; the lowest index where coinciding
    siblings both drafted the prefix). Layout in the module doc; laws are read in float64,
    normalised."""
    check_tree_rule(rule, tree)
    if rule.unit != "token":                 # a rule that judges the tree as a whole
        return rule.verify_topology(tree, drafts, _rows(p), _rows(q), coins, u)
    step = rule.make_step(tree.children == "iid")
    S, node, depth = [-1], -1, 0
    while True:
        row = 1 + S[0]
        pi, qi = _row(p, row), _row(q, row)
        C = sorted(c for a in S for c in tree.kids[a])   # node order, as the twin's columns
        if not C:
            return depth, node, categorical(pi, float(u[depth]))
        drafts_c = np.asarray([drafts[c] for c in C], dtype=np.int64)
        y = step(pi, qi, drafts_c, np.append(coins[C], u[depth]))
        S = [c for c in C if drafts[c] == y]
        if not S:
            return depth, node, int(y)
        node, depth = S[0], depth + 1


def _rows(law: np.ndarray) -> np.ndarray:
    x = np.asarray(law, dtype=np.float64)
    return x / x.sum(-1, keepdims=True)


def check_twin_topology(rule: Rule, tree: Tree) -> None:
    """``ValueError`` unless ``rule``'s batched twin verifies ``tree``: the twins of the rules
    that judge a tree as a whole (``traversal``) take trees of chains only; their numpy cores
    and the exact analysis take any tree :func:`check_tree_rule` admits."""
    check_tree_rule(rule, tree)
    if rule.unit != "token" and tree.chains() is None:
        raise ValueError(f"rule {rule.name!r}'s batched twin verifies trees of chains "
                         "(Tree.from_chains(k, gamma)); on this topology its numpy core "
                         "verifies (coupling.rules.topology.walk_topology) and "
                         "coupling.block_efficiency analyses it")


def _row(law: np.ndarray, r: int) -> np.ndarray:
    x = np.asarray(law[r], dtype=np.float64)
    return x / x.sum()
