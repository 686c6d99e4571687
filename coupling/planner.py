"""``coupling plan``: the draft tree and rule to run, from recorded tree traces and call costs.

For every rule asked for, the candidates are the best tree of each size the superset holds
(the tree knapsack on ``rrs``'s node values, :func:`coupling.sequence.plan.best_tree`),
Sequoia's tree of each size (the same knapsack on its positional acceptance model,
:func:`coupling.sequence.plan.positional_values`) and the chains the superset holds, each
scored exactly on the traces (tokens per call with a bootstrap interval over contexts,
:func:`coupling.sequence.traces.tokens_per_call`). With call costs, ``predicted tokens/s =
E[tokens per call] / (target call(N + 1 tokens) + the draft calls of its levels + the rule's
own work on N nodes)`` (:meth:`Cost.step`), against plain sampling's ``1 / (target call(1
token) + its own work per token)``; without them the table ranks tokens per call alone, which
always favours the largest tree.

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

__all__ = ["Cost", "Row", "Plan", "plan", "sequoia_choice", "main", "HELP"]

#: the line ``coupling --help`` shows for this command
HELP = "choose a draft tree and rule from recorded tree traces and call costs"


Points = tuple[tuple[int, float], ...]


def _points(table, what: str) -> Points:
    """``{n: ms}`` (or one number, the same at every ``n``) as sorted ``(n, ms)`` points."""
    if isinstance(table, (int, float)) and not isinstance(table, bool):
        table = {1: table}
    if not isinstance(table, dict) or not table:
        raise ValueError(f"{what}: give milliseconds, or a table {{tokens: ms}}")
    points = tuple(sorted((int(n), float(ms)) for n, ms in table.items()))
    if any(n < 0 or ms < 0 for n, ms in points):
        raise ValueError(f"{what}: milliseconds and sizes must be >= 0, got {dict(points)}")
    return points


def _interp(points: Points, n: int) -> float:
    xs, ys = zip(*points, strict=True)
    return float(np.interp(n, xs, ys))


@dataclass(frozen=True)
class Cost:
    """What a step costs, in milliseconds, each a table read piecewise linearly (constant
    beyond its points): a target call scoring ``n`` tokens (``target_ms``), a draft call
    feeding ``n`` tokens (``draft_ms``), and per rule what a speculative step on a tree of
    ``n`` nodes spends beyond its model calls (``overhead_ms``: the laws of every node, the
    rule, the caches; a rule missing from it reads the first rule's); and what plain sampling
    spends per token beyond its target call (``plain_overhead_ms``: the law, the draw)."""

    target_ms: Points
    draft_ms: Points = ((1, 0.0),)
    overhead_ms: tuple[tuple[str, Points], ...] = (("", ((1, 0.0),)),)
    plain_overhead_ms: float = 0.0
    #: per batch size ``B``: the target's and the draft's call tables on ``B`` rows
    batches: tuple[tuple[int, Points, Points], ...] = ()
    #: the pair the table was measured on (``coupling profile``'s ``models``), as items
    models: tuple[tuple[str, str], ...] = ()

    def at_batch(self, rows: int) -> Cost:
        """The costs per request when ``rows`` requests share every call: the calls' tables
        measured at that batch size, and the per-row work (the laws, the rule, the draw)
        ``rows`` times over (it runs row by row)."""
        if rows == 1:
            return self
        tables = {B: (t, d) for B, t, d in self.batches}
        if rows not in tables:
            raise ValueError(f"--batch {rows}: the cost table holds batch sizes "
                             f"{sorted(tables) or 'none'}; profile with --batches {rows}")
        over = tuple((r, tuple((n, rows * ms) for n, ms in pts)) for r, pts in self.overhead_ms)
        return Cost(tables[rows][0], tables[rows][1], over, rows * self.plain_overhead_ms,
                    models=self.models)

    @classmethod
    def load(cls, path: str) -> Cost:
        """The JSON ``coupling profile`` writes."""
        with open(path) as f:
            data = json.load(f)
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: dict) -> Cost:
        """What ``coupling profile`` measures (:func:`coupling.llm.record.profile`)."""
        try:
            over = data.get("step_overhead_ms", 0.0)
            over = over if isinstance(over, dict) and all(
                isinstance(v, dict) for v in over.values()) else {"": over}
            batched = data.get("target_ms_batch", {})
            return cls(_points(data["target_ms"], "target_ms"),
                       _points(data["draft_ms"], "draft_ms"),
                       tuple((rule, _points(t, f"step_overhead_ms[{rule!r}]"))
                             for rule, t in over.items()),
                       float(data.get("plain_overhead_ms", 0.0)),
                       tuple((int(B), _points(t, "target_ms_batch"),
                              _points(data["draft_ms_batch"][B], "draft_ms_batch"))
                             for B, t in batched.items()),
                       tuple(sorted((str(k), str(v))
                                    for k, v in data.get("models", {}).items())))
        except (KeyError, TypeError, AttributeError):
            raise ValueError("not a cost table (coupling profile writes one)") from None

    @classmethod
    def parse(cls, target: str, draft: float = 0.0, overhead: float = 0.0) -> Cost:
        """From the command line: ``tokens:ms`` pairs for the target, one number for a draft
        call and one for a step's own work."""
        try:
            points = tuple(sorted((int(a), float(b)) for a, b in
                                  (pair.split(":") for pair in target.split(","))))
        except ValueError:
            raise ValueError(f"--target-ms {target!r}: give tokens:ms pairs such as "
                             "1:39.1,3:40.2,17:45.3") from None
        if not points or any(n < 1 or ms <= 0 for n, ms in points) or draft < 0 \
                or overhead < 0:
            raise ValueError("call costs must be positive, with token counts >= 1")
        return cls(points, ((1, float(draft)),), (("", ((1, float(overhead)),)),))

    def call(self, tokens: int) -> float:
        """A target call scoring ``tokens`` tokens."""
        return _interp(self.target_ms, tokens)

    def plain(self) -> float:
        """A token of plain sampling: a decoding call and its own work."""
        return self.call(1) + self.plain_overhead_ms

    def draft(self, tokens: int) -> float:
        """A draft call feeding ``tokens`` tokens."""
        return _interp(self.draft_ms, tokens)

    def overhead(self, rule: str, nodes: int) -> float:
        """A speculative step's own work for ``rule`` on a tree of ``nodes`` nodes."""
        table = dict(self.overhead_ms)
        return _interp(table.get(rule, self.overhead_ms[0][1]), nodes)

    def step(self, tree: Tree, rule: str = "") -> float:
        """A speculative call: the target on ``N + 1`` tokens; the draft once on the text
        accepted last (counted as one token) and once per level above the deepest on that
        level's nodes; and the step's own work."""
        levels = np.bincount(np.asarray(tree.depths), minlength=tree.depth + 1)[1:tree.depth]
        return (self.call(tree.size + 1) + self.draft(1) + sum(self.draft(int(w))
                for w in levels) + self.overhead(rule, tree.size))


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

    @property
    def tokens_per_s_interval(self) -> tuple[float, float] | None:
        """The tokens-per-call interval over contexts, at the step's cost."""
        if self.tokens_per_s is None:
            return None
        scale = self.tokens_per_s / self.tokens_per_call.mean
        return self.tokens_per_call.low * scale, self.tokens_per_call.high * scale

    def to_dict(self) -> dict:
        e = self.tokens_per_call
        return {"rule": self.rule, "source": self.source,
                "tree": [list(p) for p in self.tree.paths()],
                "children": self.tree.children, "nodes": self.tree.size,
                "depth": self.tree.depth, "gamma": self.tree.depth,
                "k": len(self.tree.kids[-1]),
                "predicted_tokens_per_call": [e.mean, e.low, e.high],
                "predicted_tokens_per_s": self.tokens_per_s,
                "predicted_tokens_per_s_interval": self.tokens_per_s_interval}


@dataclass(frozen=True)
class Plan:
    """The candidates, best first (by tokens/s with costs, else tokens per call), plain
    sampling's tokens/s and the tree Sequoia's planner would run (:func:`sequoia_choice`;
    both ``None`` without costs)."""

    candidates: tuple[Row, ...]
    plain_tokens_per_s: float | None
    sequoia: Row | None = None

    @property
    def recommended(self) -> Row | None:
        """The best candidate, or ``None`` where plain sampling is faster."""
        best = self.candidates[0]
        if self.plain_tokens_per_s is not None and best.tokens_per_s is not None \
                and best.tokens_per_s <= self.plain_tokens_per_s:
            return None
        return best

    def plot(self, ax=None):
        """Predicted tokens/s (tokens per call without costs) against tree size, one line per
        rule through its best candidate of each size, with plain sampling's level; returns
        the matplotlib axes."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 3.5))[1]
        speed = self.plain_tokens_per_s is not None
        for rule in dict.fromkeys(r.rule for r in self.candidates):
            best: dict[int, float] = {}
            for r in self.candidates:
                if r.rule == rule:
                    y = r.tokens_per_s if speed else r.tokens_per_call.mean
                    best[r.tree.size] = max(best.get(r.tree.size, -np.inf), y)
            sizes = sorted(best)
            ax.plot(sizes, [best[n] for n in sizes], marker="o", ms=3, label=rule)
        ax.axhline(self.plain_tokens_per_s if speed else 1.0, color="grey", ls="--",
                   label="plain sampling")
        ax.set_xlabel("draft tree nodes")
        ax.set_ylabel("predicted tokens/s" if speed else "tokens per target call")
        ax.legend(frameon=False)
        return ax

    def to_json(self) -> str:
        rec = self.recommended
        return json.dumps({"recommended": rec.to_dict() if rec else "no speculation",
                           "plain_tokens_per_s": self.plain_tokens_per_s,
                           "sequoia": self.sequoia.to_dict() if self.sequoia else None,
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
        rows.append(Row(rule, tree, est, 1e3 * est.mean / cost.step(tree, rule) if cost else None,
                        source))
    rows.sort(key=lambda r: -(r.tokens_per_s if cost else r.tokens_per_call.mean))
    if cost is None:
        return Plan(tuple(rows), None)
    return Plan(tuple(rows), 1e3 / cost.plain(), sequoia_choice(traces, cost))


def sequoia_choice(traces: TreeTraces, cost: Cost, rule: str = "rrs") -> Row:
    """The tree Sequoia's planner would run (Chen et al., arXiv:2402.12374): its knapsack on
    the positional acceptance model (:func:`~coupling.sequence.plan.positional_values`) gives
    a tree and a predicted value for each size, and it keeps the size of the best predicted
    speed ``value / cost.step(tree)``. Returned scored exactly on the traces, as a
    candidate of :func:`plan` is."""
    sup = traces.superset
    model = positional_values(node_values(traces, "rrs"), sup)
    tree, _ = max(best_trees(model, sup, sup.size),
                  key=lambda tv: tv[1] / cost.step(tv[0], rule))
    est = tokens_per_call(traces, rule, tree)
    return Row(rule, tree, est, 1e3 * est.mean / cost.step(tree, rule), "sequoia")


def _same_pair(traces: TreeTraces, cost: Cost, cost_path: str) -> None:
    """Refuse costs measured on another pair than the traces' (where both name theirs)."""
    theirs = dict(cost.models)
    ours = {str(k): str(v) for k, v in (traces.header.get("models") or {}).items()}
    if theirs and ours and theirs != ours:
        raise ValueError(f"{cost_path} measures {theirs}, the traces record {ours}: profile "
                         "the pair you recorded")


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
    ap.add_argument("--batch", type=int, default=1,
                    help="requests sharing every call (the cost table's --batches; 1)")
    ap.add_argument("--top", type=int, default=10, help="candidates to print (10)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        traces = TreeTraces.load(args.traces)
        cost = (Cost.load(args.cost) if args.cost else
                Cost.parse(args.target_ms, args.draft_ms, args.overhead_ms) if args.target_ms
                else None)
        if args.cost:
            _same_pair(traces, cost, args.cost)
        if args.batch != 1:
            if cost is None:
                raise ValueError("--batch needs --cost (a table with that batch size)")
            cost = cost.at_batch(args.batch)
        result = plan(traces, [r.strip() for r in args.rules.split(",") if r.strip()], cost)
    except (ValueError, OSError) as exc:
        print(f"coupling plan: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(result.to_json())
        return 0
    print(f"{traces.calls} recorded calls, superset {traces.superset.size} nodes "
          f"({traces.superset.children} children); tokens per call [95% interval over "
          "contexts]" + ("; tokens/s from the call costs" if cost else "")
          + (f", per request, {args.batch} requests sharing every call" if args.batch > 1
             else ""))
    for r in result.candidates[:args.top]:
        e = r.tokens_per_call
        speed = f"  {r.tokens_per_s:7.1f} tok/s" if r.tokens_per_s is not None else ""
        print(f"{r.rule:<10}{r.source:<9}{r.tree.size:>4} nodes, depth {r.tree.depth}  "
              f"{e.mean:.3f} [{e.low:.3f}, {e.high:.3f}]{speed}  {r.tree.paths()}")
    rec = result.recommended
    if cost:
        seq = result.sequoia
        print(f"plain sampling: {result.plain_tokens_per_s:.1f} tok/s; Sequoia's choice: "
              f"{seq.rule} on {seq.tree.size} nodes, {seq.tokens_per_s:.1f} tok/s; "
              "recommended: " + (f"{rec.rule} on {rec.tree.paths()}" if rec else
                                 "no speculation"))
    return 0
