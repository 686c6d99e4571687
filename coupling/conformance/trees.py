r"""Verifiers of a static draft tree of any shape (:class:`coupling.Tree`: Medusa's choices,
EAGLE's path lists, per-depth branching), checked over whole generation loops.

Protocol: ``verify(tree, drafts, p, q, rng) -> emitted``: ``drafts`` int ``[N]`` the token of
every node in node order (children of a node i.i.d. from the draft's law after its path, or
without replacement for ``tree.children == "distinct"``), ``p`` and ``q`` float ``[N + 1, V]``
the target's and the draft's laws, row 0 after the committed text and row ``1 + n`` after
node ``n``'s path (the layout of :mod:`coupling.sequence.traces`); ``emitted`` is the tokens
of a root-to-node path of the tree (empty: none accepted) followed by one more token.

:func:`check_tree_verifier` turns the verifier into a generation loop that drafts the tree
after every emission and runs :func:`~coupling.conformance.check_generation` on it: the law
of the first ``length`` tokens against the target's, statistical, with early stop.
:func:`from_tree_rule` is the adapter of this package's rules (their numpy tree walk with
uniforms from the generator).

>>> from coupling import Tree
>>> report = check_tree_verifier(from_tree_rule("rrs"), Tree.from_spec("2,1"), draws=600)
>>> report.ok
True
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..rules import get_rule
from ..rules.topology import check_tree_rule, walk_topology
from ..tree import Tree
from .check import ConformanceReport
from .generation import check_generation, law_of

__all__ = ["check_tree_verifier", "from_tree_rule", "tree_generation", "fill_tree"]


def fill_tree(draft: Callable, tree: Tree, context: tuple, rng: np.random.Generator
              ) -> np.ndarray:
    """Each node's token, in node order, drawn as a drafter fills ``tree`` after
    ``context``: from the draft's law after the node's path, without the earlier siblings'
    tokens when the children are distinct. ``draft`` maps a context to a law."""
    tokens = np.zeros(tree.size, dtype=np.int64)
    for n, a in enumerate(tree.parent):
        q = np.array(draft(context + tuple(int(tokens[m]) for m in tree.path_to(a))))
        if tree.children == "distinct":
            q[[int(tokens[m]) for m in tree.kids[a] if m < n]] = 0.0
        tokens[n] = rng.choice(q.size, p=q / q.sum())
    return tokens


def _node_laws(model: Callable, tree: Tree, context: tuple, tokens: np.ndarray) -> np.ndarray:
    rows = [model(context)] + [model(context + tuple(int(tokens[m]) for m in tree.path_to(n)))
                               for n in range(tree.size)]
    return np.stack(rows)


def _check_emitted(emitted, tree: Tree, tokens: np.ndarray, V: int) -> list[int]:
    out = [int(x) for x in emitted]
    paths = {()} | {tuple(int(tokens[m]) for m in tree.path_to(n)) for n in range(tree.size)}
    if not out or tuple(out[:-1]) not in paths or not 0 <= out[-1] < V:
        raise ValueError(f"a tree verifier must emit the tokens of a root-to-node path of the "
                         f"drafted tree and one more token in [0, {V}); got {out} for nodes "
                         f"{tokens.tolist()} of a tree with parents {list(tree.parent)}")
    return out


def tree_generation(verify: Callable, tree: Tree) -> Callable:
    """The generation loop (:func:`check_generation`'s protocol) of a tree verifier: fill
    ``tree`` from the draft, verify, append, repeat."""
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")

    def generate(target, draft, context, max_new_tokens, rng):
        tlaw, dlaw = (lambda c: law_of(target(c))), (lambda c: law_of(draft(c)))
        out = list(context)
        while len(out) - len(context) < max_new_tokens:
            ctx = tuple(out)
            tokens = fill_tree(dlaw, tree, ctx, rng)
            p, q = _node_laws(tlaw, tree, ctx, tokens), _node_laws(dlaw, tree, ctx, tokens)
            out += _check_emitted(verify(tree, tokens, p, q, rng), tree, tokens, p.shape[-1])
        return out[len(context):]

    generate.__qualname__ = getattr(verify, "name", None) or getattr(
        verify, "__qualname__", type(verify).__name__)
    return generate


def check_tree_verifier(verify: Callable, tree: Tree, **kwargs) -> ConformanceReport:
    """Check a tree verifier (module doc) over whole generation loops; ``kwargs`` are
    :func:`~coupling.conformance.check_generation`'s (``vocab_size``, ``length``, ``draws``,
    ``seed``, ``alpha``, ``pairs``, ``processing``)."""
    return check_generation(tree_generation(verify, tree), **kwargs)


class _TreeRule:
    """A rule of :data:`coupling.RULES` as a tree verifier: its numpy walk
    (:func:`coupling.rules.topology.walk_topology`) with uniforms from the generator."""

    def __init__(self, rule: str):
        self.rule = get_rule(rule)
        self.name = f"{self.rule.name} (tree walk)"

    def __call__(self, tree: Tree, drafts, p, q, rng: np.random.Generator) -> list[int]:
        check_tree_rule(self.rule, tree)
        coins, u = rng.random(tree.size), rng.random(tree.depth + 1)
        _, node, nxt = walk_topology(self.rule, tree, np.asarray(drafts), p, q, coins, u)
        path = tree.path_to(node) if node >= 0 else []
        return [int(drafts[m]) for m in path] + [int(nxt)]


def from_tree_rule(rule: str) -> Callable:
    """A rule of :data:`coupling.RULES` that verifies trees, as a tree verifier."""
    return _TreeRule(rule)
