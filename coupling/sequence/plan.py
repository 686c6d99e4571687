r"""Choosing a draft tree from recorded traces: the best tree of ``n`` nodes, exactly where the
tree's value is a sum over its nodes.

For a rule that tries a node's children in order (``token``, ``rrs``: ``rule.try_law``) on
children drawn without replacement, no two nodes share a prefix and a node is accepted with a
probability that depends only on its ancestors and its earlier siblings, never on the rest of
the tree. So the tokens per call of any sub-tree of a recorded superset (closed under parents
and earlier siblings) is :math:`1 + \sum_{v} a(v)`, with :math:`a(v)` the mean over calls of the
probability that the walk reaches ``v`` (:func:`coupling.sequence.predict.node_reach`), and the
best tree of ``n`` nodes is a tree knapsack: :func:`best_tree` solves it by dynamic
programming over the superset, exactly. With i.i.d. children coinciding siblings merge their
subtrees, the sum is an approximation, and the tree it picks is scored exactly afterwards
(:func:`coupling.sequence.traces.tokens_per_call`); :func:`rank` scores any list of
candidates the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..rules import Rule, get_rule
from ..tree import Tree
from .predict import node_reach
from .traces import Estimate, TreeTraces, tokens_per_call

__all__ = ["node_values", "positional_values", "best_tree", "best_trees", "Candidate", "rank"]


def node_values(traces: TreeTraces, rule: str | Rule) -> np.ndarray:
    """``[N]``: the mean over the recorded calls of the probability that ``rule``'s walk
    reaches each node of the superset (:func:`~coupling.sequence.predict.node_reach`)."""
    r = get_rule(rule)
    tree = traces.superset
    total = np.zeros(tree.size)
    for s in range(traces.calls):
        total += node_reach(r, tree, traces.drafts[s], traces.p[s], traces.q[s])
    return total / traces.calls


def positional_values(values: np.ndarray, superset: Tree) -> np.ndarray:
    r"""Sequoia's model of the same superset (Chen et al., arXiv:2402.12374, its positional
    acceptance assumption): the chance that a node of child rank ``r`` is accepted, given its
    parent was, is the root's, :math:`a_r` = ``values`` of the root's ``r``-th child, at every
    depth and after every context; a node's value is the product of :math:`a_r` along its path.
    Sequoia's tree of ``n`` nodes is :func:`best_trees` on these values.

    >>> positional_values(np.array([0.5, 0.2, 0.1, 0.1, 0.1, 0.1]), Tree.from_branching([2, 2]))
    array([0.5 , 0.2 , 0.25, 0.1 , 0.1 , 0.04])
    """
    values = np.asarray(values, dtype=np.float64)
    rank = {c: r for a in range(-1, superset.size) for r, c in enumerate(superset.kids[a])}
    root = {rank[c]: values[c] for c in superset.kids[-1]}
    out = np.ones(superset.size)
    for n, a in enumerate(superset.parent):
        out[n] = root[rank[n]] * (out[a] if a >= 0 else 1.0)
    return out


def best_tree(values: np.ndarray, superset: Tree, nodes: int) -> tuple[Tree, float]:
    """:func:`best_trees`' tree of ``nodes`` nodes.

    >>> values = np.array([0.6, 0.2, 0.5, 0.1, 0.1, 0.05])
    >>> t, v = best_tree(values, Tree.from_branching([2, 2]), 2)
    >>> t.paths(), round(v, 3)
    ([(0,), (0, 0)], 2.1)
    """
    return best_trees(values, superset, nodes)[nodes - 1]


def best_trees(values: np.ndarray, superset: Tree, nodes: int) -> list[tuple[Tree, float]]:
    """For each size ``b = 1..nodes``, the sub-tree of ``superset`` with ``b`` nodes, closed
    under parents and earlier siblings, of largest ``sum(values)``: the tree (with the
    superset's child law) and ``1 + sum``, its tokens per call where the value adds over nodes
    (module doc). One dynamic program, ``O(N W nodes^2)``."""
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (superset.size,):
        raise ValueError(f"values must hold one number per superset node ({superset.size}), "
                         f"got shape {values.shape}")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= superset.size:
        raise ValueError(f"nodes must be an int in [1, {superset.size}], got {nodes!r}")
    memo: dict[int, tuple[np.ndarray, list]] = {}

    def below(v: int) -> tuple[np.ndarray, list]:
        """F[b]: the best value of ``b`` nodes among v's descendants, and for each ``b`` the
        budgets of v's chosen children (a prefix of them)."""
        if v in memo:
            return memo[v]
        kids = superset.kids[v]
        # H[j][b]: best with b nodes among children j.. (a prefix starting at j), and its split
        H = [np.full(nodes + 1, -np.inf) for _ in range(len(kids) + 1)]
        split = [[0] * (nodes + 1) for _ in range(len(kids) + 1)]
        for j in range(len(kids) + 1):
            H[j][0] = 0.0
        for j in range(len(kids) - 1, -1, -1):
            F, _ = below(kids[j])
            for b in range(1, nodes + 1):
                for b1 in range(1, b + 1):
                    cand = values[kids[j]] + F[b1 - 1] + H[j + 1][b - b1]
                    if cand > H[j][b]:
                        H[j][b], split[j][b] = cand, b1
        memo[v] = (H[0], [kids, split])
        return memo[v]

    F, _ = below(-1)
    paths = superset.paths()

    def take(v: int, b: int, chosen: list[int]) -> list[int]:
        kids, split = memo[v][1]
        j = 0
        while b > 0:
            b1 = split[j][b]
            chosen.append(kids[j])
            take(kids[j], b1 - 1, chosen)
            b -= b1
            j += 1
        return chosen

    out = []
    for b in range(1, nodes + 1):
        picked = sorted((paths[n] for n in take(-1, b, [])), key=lambda x: (len(x), x))
        out.append((Tree.from_paths(picked, superset.children), 1.0 + float(F[b])))
    return out


@dataclass(frozen=True)
class Candidate:
    """A rule on a tree, with its tokens per call on the traces."""

    rule: str
    tree: Tree
    tokens_per_call: Estimate


def rank(traces: TreeTraces, candidates: Iterable[tuple[str, Tree]]) -> list[Candidate]:
    """Every ``(rule, tree)`` scored exactly on the traces
    (:func:`~coupling.sequence.traces.tokens_per_call`), best first."""
    out = [Candidate(rule, tree, tokens_per_call(traces, rule, tree))
           for rule, tree in candidates]
    return sorted(out, key=lambda c: -c.tokens_per_call.mean)

