"""``coupling plan``: the draft tree and rule to run, from recorded tree traces and call costs.

For every rule asked for, the candidates are the best tree of each size the superset holds
(the tree knapsack on ``rrs``'s node values, :func:`coupling.sequence.plan.best_tree`),
Sequoia's tree of each size (the same knapsack on its positional acceptance model,
:func:`coupling.sequence.plan.positional_values`) and the chains the superset holds, each
scored exactly on the traces (tokens per call with a bootstrap
interval over contexts, :func:`coupling.sequence.traces.tokens_per_call`). With call costs,
``predicted tokens/s = E[tokens per call] / (target call(N + 1 tokens) + depth x draft call
+ a step's own work)``, against plain sampling's ``1 / target call(1 token)``; without them
the table ranks tokens per call alone, which always favours the largest tree.

    coupling profile --out cost.json            # or --target-ms 1:39.1,17:45.3 --draft-ms 2
    coupling plan traces.npz --rules rrs,traversal --cost cost.json
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np

from .sequence.plan import best_trees, node_values, positional_values
from .sequence.traces import Estimate, TreeTraces, tokens_per_call
from .tree import Tree

__all__ = ["Cost", "Row", "Plan", "plan", "main", "HELP"]

#: the line ``coupling --help`` shows for this command
HELP = "choose a draft tree and rule from recorded tree traces and call costs"


@dataclass(frozen=True)
class Cost:
    """Milliseconds of a target call scoring ``n`` tokens (piecewise linear through the
    measured points, constant beyond them), of one draft call, and of what a speculative
    step spends beyond its model calls (``overhead_ms``: the laws, the rule, the caches)."""

    target_ms: tuple[tuple[int, float], ...]
    draft_ms: float
    overhead_ms: float = 0.0

    @classmethod
    def load(cls, path: str) -> Cost:
        """The JSON ``coupling profile`` writes."""
        with open(path) as f:
            data = json.load(f)
        try:
            points = ",".join(f"{n}:{ms}" for n, ms in data["target_ms"].items())
            return cls.parse(points, float(data["draft_ms"]),
                             float(data.get("step_overhead_ms", 0.0)))
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{path}: not a cost table (coupling profile writes one)") from None

    @classmethod
    def parse(cls, target: str, draft: float, overhead: float = 0.0) -> Cost:
        try:
            points = tuple(sorted((int(a), float(b)) for a, b in
                                  (pair.split(":") for pair in target.split(","))))
        except ValueError:
            raise ValueError(f"--target-ms {target!r}: give tokens:ms pairs such as "
                             "1:39.1,3:40.2,17:45.3") from None
        if not points or any(n < 1 or ms <= 0 for n, ms in points) or draft < 0 \
                or overhead < 0:
            raise ValueError("call costs must be positive, with token counts >= 1")
        return cls(points, float(draft), float(overhead))

    def call(self, tokens: int) -> float:
        xs, ys = zip(*self.target_ms, strict=True)
        return float(np.interp(tokens, xs, ys))

    def step(self, tree: Tree) -> float:
        """A speculative call: the target on ``N + 1`` tokens, one draft call per level, and
        the step's own work."""
        return self.call(tree.size + 1) + tree.depth * self.draft_ms + self.overhead_ms


@dataclass(frozen=True)
class Row:
    """A candidate: ``source`` says where its tree came from ("knapsack": this planner's
    best tree of its size; "sequoia": Sequoia's, under its positional acceptance model;
    "chain")."""

    rule: str
    tree: Tree
    tokens_per_call: Estimate
    tokens_per_s: float | None
    source: str = "knapsack"

    def to_dict(self) -> dict:
        e = self.tokens_per_call
        return {"rule": self.rule, "source": self.source,
                "tree": [list(p) for p in self.tree.paths()],
                "children": self.tree.children, "nodes": self.tree.size,
                "depth": self.tree.depth,
                "predicted_tokens_per_call": [e.mean, e.low, e.high],
                "predicted_tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class Plan:
    """The candidates, best first (by tokens/s with costs, else tokens per call), and plain
    sampling's tokens/s (``None`` without costs)."""

    candidates: tuple[Row, ...]
    plain_tokens_per_s: float | None

    @property
    def recommended(self) -> Row | None:
        """The best candidate, or ``None`` where plain sampling is faster."""
        best = self.candidates[0]
        if self.plain_tokens_per_s is not None and best.tokens_per_s is not None \
                and best.tokens_per_s <= self.plain_tokens_per_s:
            return None
        return best

    def to_json(self) -> str:
        rec = self.recommended
        return json.dumps({"recommended": rec.to_dict() if rec else "no speculation",
                           "plain_tokens_per_s": self.plain_tokens_per_s,
                           "candidates": [r.to_dict() for r in self.candidates]}, indent=2)


def _candidates(traces: TreeTraces, rules: list[str]) -> list[tuple[str, Tree, str]]:
    """(rule, tree, source) for every rule: the knapsack's tree of each size, Sequoia's tree
    of each size (where it differs), and the chains the superset holds."""
    sup = traces.superset
    values = node_values(traces, "rrs")
    trees: dict[Tree, str] = {}
    for g in range(1, sup.depth + 1):
        if sup.children == "iid":
            trees[Tree.from_chains(1, g)] = "chain"
    for tree, _ in best_trees(positional_values(values, sup), sup, sup.size):
        trees.setdefault(tree, "sequoia")
    for tree, _ in best_trees(values, sup, sup.size):
        trees[tree] = "knapsack"
    return [(rule, tree, source) for rule in rules
            for tree, source in sorted(trees.items(), key=lambda t: t[0].size)
            if rule != "token" or tree.chains() == (1, tree.size, True)]


def plan(traces: TreeTraces, rules: list[str], cost: Cost | None = None) -> Plan:
    """Score every candidate (module doc) and rank them."""
    rows = []
    for rule, tree, source in _candidates(traces, rules):
        est = tokens_per_call(traces, rule, tree)
        rows.append(Row(rule, tree, est, 1e3 * est.mean / cost.step(tree) if cost else None,
                        source))
    rows.sort(key=lambda r: -(r.tokens_per_s if cost else r.tokens_per_call.mean))
    return Plan(tuple(rows), 1e3 / cost.call(1) if cost else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="coupling plan", description=HELP)
    ap.add_argument("traces", help="a .npz file of tree traces (coupling record)")
    ap.add_argument("--rules", default="rrs,traversal",
                    help="rules to plan for (token, rrs: the knapsack is exact for them on "
                         "children without replacement; traversal: scored on the same trees)")
    ap.add_argument("--cost", default=None, help="the JSON of `coupling profile`")
    ap.add_argument("--target-ms", default=None, help="target call cost, tokens:ms pairs")
    ap.add_argument("--draft-ms", type=float, default=0.0, help="one draft call, ms")
    ap.add_argument("--overhead-ms", type=float, default=0.0,
                    help="a speculative step's work beyond its model calls, ms")
    ap.add_argument("--top", type=int, default=10, help="candidates to print (10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        traces = TreeTraces.load(args.traces)
        cost = (Cost.load(args.cost) if args.cost else
                Cost.parse(args.target_ms, args.draft_ms, args.overhead_ms) if args.target_ms
                else None)
        result = plan(traces, [r.strip() for r in args.rules.split(",") if r.strip()], cost)
    except (ValueError, OSError) as exc:
        print(f"coupling plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(result.to_json())
        return 0
    print(f"{traces.calls} recorded calls, superset {traces.superset.size} nodes "
          f"({traces.superset.children} children); tokens per call [95% interval over "
          "contexts]" + ("; tokens/s from the call costs" if cost else ""))
    for r in result.candidates[:args.top]:
        e = r.tokens_per_call
        speed = f"  {r.tokens_per_s:7.1f} tok/s" if r.tokens_per_s is not None else ""
        print(f"{r.rule:<10}{r.source:<9}{r.tree.size:>4} nodes, depth {r.tree.depth}  "
              f"{e.mean:.3f} [{e.low:.3f}, {e.high:.3f}]{speed}  {r.tree.paths()}")
    rec = result.recommended
    if cost:
        print(f"plain sampling: {result.plain_tokens_per_s:.1f} tok/s; recommended: "
              + (f"{rec.rule} on {rec.tree.paths()}" if rec else "no speculation"))
    return 0
