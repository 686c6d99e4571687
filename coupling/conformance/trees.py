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

Exact mode (``exact=True``): a verifier that also has ``verify.law(tree, drafts, p, q) ->
{emitted tuple: probability}`` is checked by enumeration, every filling of the tree of
positive probability after every reachable context weighted by that law; lossless iff the
TV to the target's law is at most ``1e-12``. :func:`from_tree_rule` is the adapter of this
package's rules: their numpy tree walk with uniforms from the generator, and their exact law
(a single-step rule's conditional law of its output given each drafted tuple, from its
joint; traversal's law of a call on the drafted tree).

>>> from coupling import Tree
>>> report = check_tree_verifier(from_tree_rule("rrs"), Tree.from_spec("2,1"), draws=600)
>>> report.ok
True
>>> exact = check_tree_verifier(from_tree_rule("rrs"), Tree.from_spec("2,1"), exact=True)
>>> exact.ok, exact.tv < 1e-12
(True, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .. import target_law
from ..dist import validate_count
from ..rules import get_rule
from ..rules.topology import check_tree_rule, walk_topology
from ..sequence.paths import propagate
from ..tree import Tree
from .check import (
    EXACT_TOL,
    MAX_STRINGS,
    ConformanceReport,
    PairResult,
    build_report,
    worst_strings,
)
from .errors import guarded
from .generation import check_generation, law_of
from .loop import Laws
from .pairs import Pair, as_pairs, model_pairs
from .verifiers import RuleVerifier, tree_law_emissions

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


def check_tree_verifier(verify: Callable, tree: Tree, *, exact: bool = False,
                        **kwargs) -> ConformanceReport:
    """Check a tree verifier (module doc) over whole generation loops; ``kwargs`` are
    :func:`~coupling.conformance.check_generation`'s (``vocab_size``, ``length``, ``draws``,
    ``seed``, ``alpha``, ``pairs``, ``processing``); with ``exact=True``, ``vocab_size``,
    ``length``, ``seed`` and ``pairs``."""
    if not exact:
        return check_generation(tree_generation(verify, tree), **kwargs)
    if not callable(getattr(verify, "law", None)):
        raise TypeError("exact=True needs verify.law(tree, drafts, p, q) -> {emitted: "
                        "probability}; leave exact out for a sampler alone")
    unknown = set(kwargs) - {"vocab_size", "length", "seed", "pairs"}
    if unknown:
        raise TypeError(f"exact mode takes vocab_size, length, seed and pairs, not "
                        f"{sorted(unknown)}")
    return _exact_check(verify, tree, **kwargs)


def fillings(tree: Tree, context: tuple, draft: Callable) -> list[tuple[tuple[int, ...], float]]:
    """Every filling of ``tree`` after ``context`` of positive probability, with its
    probability, as :func:`fill_tree` draws them (``draft`` maps a context to a law)."""
    out: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for n, a in enumerate(tree.parent):
        grown = []
        for tokens, pr in out:
            q = np.array(draft(context + tuple(tokens[m] for m in tree.path_to(a))))
            if tree.children == "distinct":
                q[[tokens[m] for m in tree.kids[a] if m < n]] = 0.0
            total = q.sum()
            grown += [(tokens + (t,), pr * float(q[t] / total))
                      for t in np.flatnonzero(q > 0).tolist()]
        out = grown
    return out


def _tree_law(verify, tree: Tree, target: Laws, draft: Laws, V: int, length: int,
              pair: str) -> np.ndarray:
    """The exact law (``V**length``, lexicographic) of the first ``length`` tokens of the loop
    around ``verify.law``."""
    law = guarded(lambda tokens, p, q: verify.law(tree, tokens, p, q), pair)

    def step(ctx: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], float]]:
        for tokens, pr in fillings(tree, ctx, draft):
            t = np.array(tokens, dtype=np.int64)
            p, q = _node_laws(target, tree, ctx, t), _node_laws(draft, tree, ctx, t)
            items = [(e, float(w)) for e, w in dict(law(t, p, q)).items()]
            # rounding leaves exact laws a few ulps below 0 (traversal's products)
            if any(w < -1e-12 for _, w in items) or abs(sum(w for _, w in items) - 1) > 1e-9:
                raise ValueError(f"verify.law must return probabilities that are >= 0 and sum "
                                 f"to 1, got {items!r} for nodes {tokens}")
            for e, w in items:
                if w > 0:
                    yield tuple(_check_emitted(e, tree, t, V)), pr * w

    return propagate(step, V, length)


def _exact_check(verify, tree: Tree, *, vocab_size: int = 3, length: int = 4, seed: int = 0,
                 pairs: Sequence[Pair | tuple] | None = None) -> ConformanceReport:
    length = validate_count(length, "length")
    widest = max(len(k) for k in tree.kids)
    pairs = model_pairs(validate_count(vocab_size, "vocab_size"), seed=seed, k=widest,
                        replacement=tree.children == "iid") if pairs is None \
        else as_pairs(pairs)
    V = np.asarray(pairs[0].target(())).size
    if V**length > MAX_STRINGS:
        raise ValueError(f"vocab_size**length = {V}**{length} strings exceed {MAX_STRINGS}; "
                         "lower length or vocab_size")
    t0, results = time.perf_counter(), []
    for pair in pairs:
        target, draft = Laws(pair.target, "target"), Laws(pair.draft, "draft")
        P = np.asarray(target_law(pair.target, length), dtype=np.float64)
        out = _tree_law(verify, tree, target, draft, V, length, pair.name)
        tv = 0.5 * float(np.abs(out - P).sum())
        results.append(PairResult(pair.name, pair.description, 0, None, 0, None, tv, tv, tv,
                                  EXACT_TOL, None, worst_strings(out, P, V, length)))
    return build_report(verify, tuple(results), exact=True, alpha=1e-6, draws=0,
                        settings=dict(vocab_size=V, gamma=tree.depth, k=widest,
                                      replacement=tree.children == "iid", length=length,
                                      seed=int(seed)),
                        seconds=time.perf_counter() - t0, pairs=len(pairs), mode="exact")


class _TreeRule:
    """A rule of :data:`coupling.RULES` as a tree verifier: its numpy walk
    (:func:`coupling.rules.topology.walk_topology`) with uniforms from the generator."""

    def __init__(self, rule: str):
        self.rule = get_rule(rule)
        self.name = f"{self.rule.name} (tree walk)"
        self.steps = {r: RuleVerifier(self.rule, replacement=r) for r in (True, False)}

    def __call__(self, tree: Tree, drafts, p, q, rng: np.random.Generator) -> list[int]:
        check_tree_rule(self.rule, tree)
        coins, u = rng.random(tree.size), rng.random(tree.depth + 1)
        _, node, nxt = walk_topology(self.rule, tree, np.asarray(drafts), p, q, coins, u)
        path = tree.path_to(node) if node >= 0 else []
        return [int(drafts[m]) for m in path] + [int(nxt)]


    def law(self, tree: Tree, drafts, p, q) -> dict[tuple[int, ...], float]:
        """``{emitted tokens: probability}`` of one call given the drafted tree (module doc)."""
        check_tree_rule(self.rule, tree)
        d = np.asarray(drafts, dtype=np.int64)
        P, Q = (np.asarray(x, dtype=np.float64) for x in (p, q))
        P, Q = P / P.sum(-1, keepdims=True), Q / Q.sum(-1, keepdims=True)
        if self.rule.unit != "token":         # judged as a whole: its law given the tree
            return tree_law_emissions(self.rule.topology_law(tree, d, P, Q))
        out: dict[tuple[int, ...], float] = {}
        step = self.steps[tree.children == "iid"]

        def walk(S: list[int], head: tuple[int, ...], mass: float) -> None:
            C = sorted(c for a in S for c in tree.kids[a])    # node order, as the walk's
            law = P[1 + S[0]] if not C else step.step_law(P[1 + S[0]], Q[1 + S[0]], d[C])
            for y in np.flatnonzero(law > 0).tolist():
                hit = [c for c in C if d[c] == y]
                if hit:
                    walk(hit, head + (y,), mass * float(law[y]))
                else:
                    out[head + (y,)] = out.get(head + (y,), 0.0) + mass * float(law[y])

        walk([-1], (), 1.0)
        return out


def from_tree_rule(rule: str) -> Callable:
    """A rule of :data:`coupling.RULES` that verifies trees, as a tree verifier."""
    return _TreeRule(rule)
