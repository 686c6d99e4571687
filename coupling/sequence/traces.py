r"""Recorded draft trees: what a model pair would accept on any tree, from one recording.

A *tree trace* records, at each of ``S`` calls of a model pair, a **superset** draft tree
(``W`` i.i.d. children under every node down to depth ``D``: ``Tree.from_branching([W] *
D)``), the draft's law ``q`` and the target's law ``p`` at the root and after every node (one
tree-attention target call scores them all), and the sampling settings those laws already
include.

Why a superset suffices. The first ``m`` of ``W`` i.i.d. draws are ``m`` i.i.d. draws (and
the first ``m`` of ``W`` successive draws without replacement are ``m`` such draws), so a tree
with the superset's child law whose nodes' child ranks stay below ``W`` and whose depth is at
most ``D`` is, node for node, a sub-tree of the superset drafted exactly as it would have been
(:func:`embed`). A superset of one child law says nothing exact about the other: the first
``m`` distinct tokens of ``W`` i.i.d. draws are successive draws only where the ``W`` draws
hold ``m`` of them, and keeping just those calls would bias the estimate. For a rule whose expected
tokens given the drafted tree are exact (:func:`coupling.sequence.predict.
conditional_tree_tokens`: ``token``, ``rrs`` by which try accepts; ``traversal`` by its law
given the tree), the mean over calls of that conditional value is an unbiased estimate of the
tree's tokens per call on the recorded contexts, with no coin sampled: :func:`tokens_per_call`,
with a bootstrap interval over contexts. Top-``m`` children need the laws after the likeliest
tokens, which an i.i.d. superset holds only by chance: they are not evaluated here.

Layout (version 1) of a ``.npz`` file: ``header`` (a JSON string: ``version``, ``vocab_size``,
``width``, ``depth``, ``children`` (``"iid"`` or ``"distinct"``), ``sampling``, ``models``), and
per call ``s``: ``idx [S, U]`` the token ids of the laws' support (ascending, padded with
``-1``), ``drafts [S, N]`` each node's token as an index into ``idx[s]``, ``p``, ``q``
``[S, N + 1, U]`` (float32 from a recording, float64 from :func:`from_models`; row 0 the
root's laws, row ``1 + n`` those after node ``n``), ``context [S]`` (the prompt a call
belongs to: the unit of the bootstrap).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..rules import Rule, get_rule
from ..tree import Tree
from .predict import conditional_tree_tokens

__all__ = ["TreeTraces", "Estimate", "FORMAT_VERSION", "embed", "call_tokens",
           "tokens_per_call", "from_models"]

#: the version of the ``.npz`` layout this module writes and reads
FORMAT_VERSION = 1


@dataclass(frozen=True)
class TreeTraces:
    """Recorded superset trees (module doc). Arrays as in the layout; ``header`` a dict."""

    header: dict
    idx: np.ndarray
    drafts: np.ndarray
    p: np.ndarray
    q: np.ndarray
    context: np.ndarray
    superset: Tree = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in ("version", "vocab_size", "width", "depth"):
            if key not in self.header:
                raise ValueError(f"a tree trace's header needs {key!r}")
        if self.header["version"] != FORMAT_VERSION:
            raise ValueError(f"tree trace format version {self.header['version']}; this "
                             f"package reads version {FORMAT_VERSION}")
        tree = Tree.from_branching([int(self.header["width"])] * int(self.header["depth"]),
                                   self.header.get("children", "iid"))
        S, N = self.drafts.shape
        U = self.idx.shape[1]
        if N != tree.size or self.p.shape != (S, N + 1, U) or self.q.shape != self.p.shape \
                or self.idx.shape[0] != S or self.context.shape != (S,):
            raise ValueError(f"tree trace arrays disagree with a width-{self.header['width']} "
                             f"depth-{self.header['depth']} superset ({tree.size} nodes): "
                             f"drafts {self.drafts.shape}, idx {self.idx.shape}, p "
                             f"{self.p.shape}, q {self.q.shape}, context {self.context.shape}")
        object.__setattr__(self, "superset", tree)

    @property
    def calls(self) -> int:
        return self.drafts.shape[0]

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, header=np.array(json.dumps(self.header)), idx=self.idx,
                            drafts=self.drafts, p=self.p, q=self.q, context=self.context)

    @classmethod
    def load(cls, path: str | Path) -> TreeTraces:
        with np.load(path, allow_pickle=False) as z:
            missing = {"header", "idx", "drafts", "p", "q", "context"} - set(z.files)
            if missing:
                raise ValueError(f"{path}: not a tree trace (missing {sorted(missing)})")
            return cls(json.loads(str(z["header"])), z["idx"], z["drafts"], z["p"], z["q"],
                       z["context"])

    def check(self, *, vocab_size: int | None = None, sampling: dict | None = None) -> None:
        """``ValueError`` when the traces come from another vocabulary or sampling setting than
        the plan's."""
        if vocab_size is not None and int(self.header["vocab_size"]) != vocab_size:
            raise ValueError(f"the traces were recorded over {self.header['vocab_size']} "
                             f"tokens, the plan's model has {vocab_size}: record traces of "
                             "this model pair")
        if sampling is not None and self.header.get("sampling") != sampling:
            raise ValueError(f"the traces' laws include the sampling settings "
                             f"{self.header.get('sampling')}, not {sampling}: record with the "
                             "settings you serve")


@dataclass(frozen=True)
class Estimate:
    """Tokens per call: the ``mean`` over calls and its bootstrap interval over contexts."""

    mean: float
    low: float
    high: float
    calls: int


def embed(superset: Tree, tree: Tree) -> np.ndarray:
    """The superset node of each node of ``tree``: the node with the same path of child ranks.
    ``ValueError`` when the child laws differ, a rank reaches the superset's width or a path
    its depth."""
    if tree.children != superset.children:
        raise ValueError(f"the tree's children are {tree.children}, the recorded superset's "
                         f"{superset.children}: the first children of a superset are draws of "
                         "its own law only; record a superset of that law")
    index = {path: n for n, path in enumerate(superset.paths())}
    out = []
    for path in tree.paths():
        if path not in index:
            raise ValueError(f"node {path} of the tree is not in the recorded superset "
                             f"(width {len(superset.kids[-1])}, depth {superset.depth}): "
                             "record a wider or deeper superset")
        out.append(index[path])
    return np.array(out, dtype=np.int64)


def call_tokens(traces: TreeTraces, rule: str | Rule, tree: Tree) -> np.ndarray:
    """``[S]``: the exact expected tokens of each recorded call, had ``rule`` verified
    ``tree`` drafted as a sub-tree of the call's superset (module doc)."""
    r = get_rule(rule)
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")
    if tree.children == "topk":
        raise ValueError("top-k children need the laws after the likeliest tokens, which an "
                         "i.i.d. superset holds only by chance; evaluate i.i.d. or distinct "
                         "children")
    nodes = embed(traces.superset, tree)
    rows = np.concatenate([[0], 1 + nodes])
    out = np.empty(traces.calls)
    for s in range(traces.calls):
        out[s] = conditional_tree_tokens(r, tree, traces.drafts[s, nodes], traces.p[s, rows],
                                         traces.q[s, rows])
    return out


def tokens_per_call(traces: TreeTraces, rule: str | Rule, tree: Tree, *, level: float = 0.95,
                    resamples: int = 2000, seed: int = 0) -> Estimate:
    """The mean of :func:`call_tokens` and its bootstrap interval, resampling whole contexts
    (calls of one prompt share its text, so they are not independent)."""
    values = call_tokens(traces, rule, tree)
    groups = [values[traces.context == c] for c in np.unique(traces.context)]
    sums = np.array([g.sum() for g in groups])
    counts = np.array([g.size for g in groups], dtype=np.float64)
    rng = np.random.default_rng(seed)
    w = rng.multinomial(len(groups), np.full(len(groups), 1.0 / len(groups)), size=resamples)
    means = (w @ sums) / (w @ counts)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Estimate(float(values.mean()), float(lo), float(hi), int(values.size))


def from_models(target: Callable, draft: Callable, width: int, depth: int,
                contexts: Sequence[tuple[int, ...]], rng: np.random.Generator, *,
                calls_per_context: int = 1, children: str = "iid") -> TreeTraces:
    """Tree traces of two sequence models (validated, e.g. ``coupling.TabularLM``): at every
    context, ``calls_per_context`` superset trees drafted from ``draft`` (i.i.d. children, or
    successive draws without replacement), with both laws at every node over the whole
    vocabulary. Where the truth is known, to test what the traces estimate."""
    superset = Tree.from_branching([width] * depth, children)
    V = np.asarray(target(())).size
    drafts, ps, qs, ctx = [], [], [], []
    for c, context in enumerate(contexts):
        for _ in range(calls_per_context):
            tok: list[int] = []
            prefix: list[tuple[int, ...]] = []
            for n, a in enumerate(superset.parent):
                up = prefix[a] if a >= 0 else ()
                q = np.asarray(draft(tuple(context) + up), dtype=np.float64)
                if children == "distinct":        # successive draws: earlier siblings removed
                    q = q.copy()
                    q[[tok[m] for m in superset.kids[a] if m < n]] = 0.0
                tok.append(int(rng.choice(V, p=q / q.sum())))
                prefix.append(up + (tok[-1],))
            rows = [()] + prefix
            ps.append([target(tuple(context) + x) for x in rows])
            qs.append([draft(tuple(context) + x) for x in rows])
            drafts.append(tok)
            ctx.append(c)
    S = len(drafts)
    header = {"version": FORMAT_VERSION, "vocab_size": V, "width": width, "depth": depth,
              "children": children, "sampling": {},
              "models": {"target": repr(target), "draft": repr(draft)}}
    return TreeTraces(header, np.tile(np.arange(V, dtype=np.int32), (S, 1)),
                      np.array(drafts, dtype=np.int32), np.array(ps, dtype=np.float64),
                      np.array(qs, dtype=np.float64), np.array(ctx, dtype=np.int32))
