r"""The exact law of one call on a static draft tree of any shape (:class:`coupling.Tree`).

The walk on a topology
----------------------
A rule that couples one node's drafts with the target's next token (``rule.unit ==
"token"``) verifies a tree node by node, as SpecInfer does: at the emitted prefix it holds a
set ``S`` of tree nodes that drafted that prefix (``S = {root}`` at first); the drafts it
judges are the tokens of *all* their children, ``m`` of them; the rule's single-step coupling
emits ``y`` with law exactly ``p`` after the prefix; the walk goes on with the children that
drafted ``y`` (several when siblings coincide), and stops at ``y`` when none did or when ``S``
has no children (the bonus token).

It is lossless whenever the step is and the ``m`` drafts have the law the step assumes given
everything decided so far:

``iid``
    the children of every node in ``S`` are i.i.d. draws from the draft's law after the
    prefix (nodes in ``S`` share the prefix, so their children's laws agree), and no earlier
    decision read them; so the ``m`` drafts are i.i.d. (the rule must take i.i.d. drafts);
``distinct``
    siblings are successive draws without replacement; two nodes never share a prefix, so
    ``S`` is one node and its ``m`` children are ``m`` successive draws;
``topk``
    the children are the ``m`` likeliest tokens, fixed by the prefix; only a rule whose output
    does not depend on the drafts (``rule.drafter_invariant``: ``strict``, ``gumbel``, ...)
    is lossless on drafts it did not draw, and its output is then a fresh sample of ``p``.

For ``Tree.from_chains(k, gamma)`` this is the walk of :mod:`coupling.rules.walk` (a merged
node's survivors are the chains through it), and :func:`tree_outcomes` hands such a tree to
``rule.outcomes`` itself, so every number on today's trees is unchanged to the bit.

Traversal verification judges the drafted tree as a whole on any shape: its trie (coinciding
i.i.d. siblings merge with their subtrees, children in order of first appearance), whose
next child given everything revealed has the draft's law restricted to the unseen tokens, the
one condition its losslessness argument needs (:mod:`coupling.rules.traversal`);
:func:`judged_outcomes` enumerates the fillings of the tree and its exact law given each.
``block`` and ``gbv`` (which judge ``k`` equal-length paths) and the keyed-noise drafters
(``gumbel``, ``gls``, whose columns follow chains) take chain trees only; a topology they
cannot verify is a ``ValueError`` that says why.

Cost: the enumeration visits ``V^m`` draft tuples at a node of ``m`` drafts and every emitted
prefix up to the depth; it is meant for small vocabularies (:data:`MAX_NODE_TUPLES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..dist import num_tuples
from ..rules import Rule
from ..rules.topology import check_tree_rule
from ..tree import Tree

__all__ = ["tree_outcomes", "topology_outcomes", "judged_outcomes", "fillings", "drafted_tries",
           "MAX_NODE_TUPLES", "MAX_FILLINGS"]

#: Largest number of draft tuples (``V^m``) the enumeration reads at one node.
MAX_NODE_TUPLES = 200_000


def tree_outcomes(rule: Rule, target: Callable, draft: Callable, tree: Tree,
                  context: tuple) -> Iterator[tuple[tuple[int, ...], int, object]]:
    """Yield ``(emitted tokens, accepted length, probability)`` for every outcome of one call
    of ``rule`` on ``tree`` after ``context`` (validated, memoised models): ``rule.outcomes``
    on a tree of chains, :func:`topology_outcomes` on any other."""
    check_tree_rule(rule, tree)
    chains = tree.chains()
    if chains is None and rule.unit != "token":
        return judged_outcomes(rule, target, draft, tree, context)
    if chains is None:
        return topology_outcomes(rule, target, draft, tree, context)
    k, gamma, replacement = chains
    return rule.outcomes(target, draft, gamma, context, k=k, replacement=replacement)


def topology_outcomes(rule: Rule, target: Callable, draft: Callable, tree: Tree,
                      context: tuple) -> Iterator[tuple[tuple[int, ...], int, object]]:
    """The walk on a topology (module doc), on any tree the rule can verify (a tree of chains
    too: there it is the chain walk's law)."""
    check_tree_rule(rule, tree)
    first = target(context)
    one = first.dtype.type(1) if first.dtype != object else type(first[0])(1)

    def rec(pre: tuple[int, ...], S: tuple[int, ...], mass) -> Iterator:
        p = target(context + pre)
        C = tuple(sorted(c for a in S for c in tree.kids[a]))   # node order, as the walk's
        if not C:                                         # a leaf: the bonus token, y ~ p
            for y in np.flatnonzero(p != 0):
                yield pre + (int(y),), len(pre), mass * p[y]
            return
        stay, stop = _node_law(rule, p, draft(context + pre), C, tree.children)
        for y in np.flatnonzero(stop != 0):
            yield pre + (int(y),), len(pre), mass * stop[y]
        for (y, nxt), w in stay.items():
            yield from rec(pre + (y,), nxt, mass * w)

    yield from rec((), (-1,), one)


def _node_law(rule: Rule, p: np.ndarray, q: np.ndarray, C: tuple[int, ...], law: str):
    """One step of the walk at drafts ``C`` (tree nodes): ``({(y, children that drafted y):
    mass}, stop [V])``."""
    m = len(C)
    if law != "iid" and m > p.size:
        raise ValueError(f"a node has {m} {law} children but the vocabulary has {p.size} "
                         "tokens; use fewer children or children='iid'")
    if law == "topk":              # drafter-invariant: y ~ p whatever the drafts
        top = np.argsort(-np.asarray(q, dtype=np.float64), kind="stable")[:m]
        stay = {(int(y), tuple(c for c, t in zip(C, top, strict=True) if t == y)): p[y]
                for y in top if p[y] != 0}
        stop = p.copy()
        stop[top] = 0 * stop[top]
        return stay, stop
    if m == 1:
        c, stop = rule.chain_step(p, q)
        return {(int(y), C): c[y] for y in np.flatnonzero(c != 0)}, stop
    replacement = law == "iid"
    if num_tuples(p.size, m, replacement) > MAX_NODE_TUPLES:
        raise ValueError(f"a node of {m} drafts over V={p.size} tokens has more than "
                         f"{MAX_NODE_TUPLES} draft tuples; the exact enumeration is for small "
                         "vocabularies and narrow trees")
    tuples, _ = rule.draft_law(q, m, replacement=replacement)
    J = rule.joint(p, q, m, replacement=replacement)
    stay: dict = {}
    stop = 0 * J[0]
    for t, row in zip(tuples.tolist(), J, strict=True):
        for y in np.flatnonzero(row != 0):
            nxt = tuple(c for c, x in zip(C, t, strict=True) if x == y)
            if nxt:
                stay[(int(y), nxt)] = stay.get((int(y), nxt), 0 * row[y]) + row[y]
            else:
                stop[y] += row[y]
    return stay, stop


#: Largest number of ways to fill a tree (``V^N``) :func:`drafted_tries` may enumerate.
MAX_FILLINGS = 2_000_000


def judged_outcomes(rule: Rule, target: Callable, draft: Callable, tree: Tree,
                    context: tuple) -> Iterator[tuple[tuple[int, ...], int, object]]:
    """The law of one call of a rule that judges the drafted tree as a whole
    (``rule.topology_law``: ``traversal``), over every way the drafter fills ``tree``
    (:func:`fillings`)."""
    check_tree_rule(rule, tree)
    for tokens, prob in fillings(draft, tree, context):
        prefixes = [()] + [tuple(tokens[m] for m in tree.path_to(n)) for n in range(tree.size)]
        P = np.stack([np.asarray(target(context + x), dtype=np.float64) for x in prefixes])
        Q = np.stack([np.asarray(draft(context + x), dtype=np.float64) for x in prefixes])
        for pre, pr, nxt in rule.topology_law(tree, np.array(tokens), P, Q):
            for y in np.flatnonzero(nxt != 0):
                yield pre + (int(y),), len(pre), prob * pr * nxt[y]


def fillings(draft: Callable, tree: Tree, context: tuple) -> Iterator[tuple[tuple[int, ...],
                                                                             float]]:
    """Every way the drafter fills ``tree`` after ``context``: ``(token of each node, in node
    order; probability)`` (float; at most :data:`MAX_FILLINGS`)."""
    V = np.asarray(draft(context)).size
    if tree.size * np.log(V) > np.log(MAX_FILLINGS):
        raise ValueError(f"a {tree.size}-node tree over V={V} tokens has about "
                         f"{float(V) ** tree.size:.3g} fillings, above {MAX_FILLINGS}; the exact "
                         "enumeration is for small trees and vocabularies")

    def fill(n: int, tokens: tuple[int, ...], prob: float) -> Iterator:
        if n == tree.size:
            yield tokens, prob
            return
        a = tree.parent[n]
        up = tuple(tokens[m] for m in tree.path_to(a))
        q = np.asarray(draft(context + up), dtype=np.float64)
        earlier = [tokens[m] for m in tree.kids[a] if m < n]
        if tree.children == "distinct" and len(tree.kids[a]) > np.count_nonzero(q):
            raise ValueError(f"node {a} has {len(tree.kids[a])} children drawn without "
                             f"replacement, but the draft gives {np.count_nonzero(q)} token(s) "
                             f"positive probability after {up}; use fewer children or "
                             "children='iid'")
        for x, w in _child_law(q, earlier, tree.children):
            yield from fill(n + 1, tokens + (x,), prob * w)

    yield from fill(0, (), 1.0)


def drafted_tries(target: Callable, draft: Callable, tree: Tree,
                  context: tuple) -> dict[frozenset, float]:
    """The law of the drafted tree as a verifier sees it: the set of drafted prefixes (the
    root ``()`` included; coinciding siblings merge) -> probability, over every way the
    drafter can fill ``tree`` (validated, memoised float models)."""
    V = target(context).size
    if tree.size * np.log(V) > np.log(MAX_FILLINGS):
        raise ValueError(f"a {tree.size}-node tree over V={V} tokens has about "
                         f"{float(V) ** tree.size:.3g} fillings, above {MAX_FILLINGS}; the exact "
                         "enumeration is for small trees and vocabularies")
    out: dict[frozenset, float] = {}

    def fill(n: int, prefix: list, prob: float) -> None:
        if n == tree.size:
            key = frozenset([()] + prefix)
            out[key] = out.get(key, 0.0) + prob
            return
        a = tree.parent[n]
        up = prefix[a] if a >= 0 else ()
        q = np.asarray(draft(context + up), dtype=np.float64)
        if tree.children == "topk" and len(tree.kids[a]) > q.size:
            raise ValueError(f"node {a} has {len(tree.kids[a])} top-k children but the "
                             f"vocabulary has {q.size} tokens; use fewer children")
        if tree.children == "distinct" and len(tree.kids[a]) > np.count_nonzero(q):
            raise ValueError(f"node {a} has {len(tree.kids[a])} children drawn without "
                             f"replacement, but the draft gives {np.count_nonzero(q)} token(s) "
                             f"positive probability after {up}; use fewer children or "
                             "children='iid'")
        earlier = [prefix[m][-1] for m in tree.kids[a] if m < n]
        for x, w in _child_law(q, earlier, tree.children):
            fill(n + 1, prefix + [up + (x,)], prob * w)

    fill(0, [], 1.0)
    return out


def _child_law(q: np.ndarray, earlier: list[int], law: str) -> list[tuple[int, float]]:
    """``(token, probability)`` of the next child given its earlier siblings' tokens."""
    if law == "iid":
        return [(int(x), float(q[x])) for x in np.flatnonzero(q > 0)]
    if law == "topk":
        return [(int(np.argsort(-q, kind="stable")[len(earlier)]), 1.0)]
    left = 1.0 - float(q[earlier].sum())
    return [(int(x), float(q[x]) / left) for x in np.flatnonzero(q > 0) if x not in earlier]
