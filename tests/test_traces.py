"""Tree traces (:mod:`coupling.sequence.traces`): one recorded superset tree per call tells
what any sub-tree would have been worth.

* exact: over every filling of the superset, weighted by its probability, the per-call value
  of a sub-tree is the sub-tree's exact tokens per call (``coupling.block_efficiency``), for
  i.i.d. and distinct children and every rule with an exact conditional value;
* sampled: traces recorded on many contexts estimate it within their bootstrap interval;
* the file format round-trips, and a wrong vocabulary, sampling setting or version, or a
  tree outside the superset, is a ``ValueError`` that says so.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import coupling
from coupling import TabularLM, Tree
from coupling.lm import check_models
from coupling.sequence.topology import fillings
from coupling.sequence.traces import (
    FORMAT_VERSION,
    TreeTraces,
    call_tokens,
    embed,
    from_models,
    tokens_per_call,
)


def pair(V: int, seed: int):
    return (TabularLM(V, order=1, seed=seed, concentration=0.6),
            TabularLM(V, order=1, seed=seed + 1, concentration=0.6))


def every_filling(t, d, width: int, depth: int,
                  children: str = "iid") -> tuple[TreeTraces, np.ndarray]:
    """Traces holding every filling of the superset once, and the fillings' probabilities."""
    superset = Tree.from_branching([width] * depth, children)
    T, D, ctx = check_models(t, d, ())
    rows, probs = [], []
    for tokens, prob in fillings(D, superset, ctx):
        rows.append(tokens)
        probs.append(prob)
    drafts = np.array(rows, dtype=np.int32)
    prefixes = [[()] + [tuple(int(x[m]) for m in superset.path_to(n))
                        for n in range(superset.size)] for x in drafts]
    P = np.array([[T(ctx + r) for r in pre] for pre in prefixes])
    Q = np.array([[D(ctx + r) for r in pre] for pre in prefixes])
    V = P.shape[-1]
    header = {"version": FORMAT_VERSION, "vocab_size": V, "width": width, "depth": depth,
              "children": children}
    S = len(rows)
    traces = TreeTraces(header, np.tile(np.arange(V, dtype=np.int32), (S, 1)), drafts, P, Q,
                        np.zeros(S, dtype=np.int32))
    return traces, np.array(probs)


@pytest.mark.parametrize("rule, tree", [
    ("rrs", Tree.from_branching([2, 1])),
    ("rrs", Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])),
    ("token", Tree.chain(3)),
    ("traversal", Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (1, 1)])),
    ("rrs", Tree.from_branching([2, 1], children="distinct")),
])
def test_a_sub_tree_of_the_superset_has_its_exact_value(rule, tree):
    """Weighted by the probability of each filling of the superset (width 2, depth 3 over
    V = 2; depth 2 over V = 3 without replacement), the sub-tree's per-call values average to
    its exact tokens per call."""
    t, d = pair(3 if tree.children == "distinct" else 2, 5)
    traces, probs = every_filling(t, d, 2, 3 if tree.children == "iid" else 2, tree.children)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    value = float(probs @ call_tokens(traces, rule, tree))
    assert value == pytest.approx(coupling.block_efficiency(rule, t, d, tree=tree), abs=1e-12)


def test_recorded_traces_estimate_the_value_within_their_interval():
    """Sampled supersets on 27 contexts: the estimate lies within its bootstrap interval over
    contexts and within 4 standard errors of the exact value on those contexts."""
    t, d = pair(3, 8)
    contexts = [(a, b, c) for a in range(3) for b in range(3) for c in range(3)]
    traces = from_models(t, d, 2, 2, contexts, np.random.default_rng(0), calls_per_context=40)
    tree = Tree.from_branching([2, 1])
    est = tokens_per_call(traces, "rrs", tree)
    exact = np.mean([coupling.block_efficiency("rrs", t, d, tree=tree, context=c)
                     for c in contexts])
    values = call_tokens(traces, "rrs", tree)
    assert est.low <= exact <= est.high and est.calls == 27 * 40
    assert abs(est.mean - exact) < 4 * values.std() / np.sqrt(values.size)


def test_the_format_round_trips_and_refuses_what_it_cannot_answer(tmp_path):
    t, d = pair(3, 2)
    traces = from_models(t, d, 2, 2, [(0,), (1,)], np.random.default_rng(1))
    path = tmp_path / "t.npz"
    traces.save(path)
    back = TreeTraces.load(path)
    assert back.header == traces.header and np.array_equal(back.p, traces.p)
    assert list(embed(back.superset, Tree.from_branching([2, 1]))) == [0, 1, 2, 4]
    traces.check(vocab_size=3, sampling={})
    cases = [(lambda: traces.check(vocab_size=5), "recorded over 3 tokens"),
             (lambda: traces.check(sampling={"temperature": 0.7}), "sampling settings"),
             (lambda: call_tokens(traces, "rrs", Tree.from_branching([3])), "not in the "
              "recorded superset"),
             (lambda: call_tokens(traces, "strict", Tree.named("medusa", size=3)), "top-k"),
             (lambda: call_tokens(traces, "rrs", Tree.from_branching([2], children="distinct")),
              "its own law"),
             (lambda: call_tokens(traces, "kseq", Tree.from_branching([2])), "try_law"),
             (lambda: TreeTraces({**traces.header, "version": 99}, traces.idx, traces.drafts,
                                 traces.p, traces.q, traces.context), "version 99")]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    np.savez(tmp_path / "bad.npz", header=np.array(json.dumps(traces.header)))
    with pytest.raises(ValueError, match="not a tree trace"):
        TreeTraces.load(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------- the knapsack
def _closed_subtrees(superset: Tree, n: int):
    """Every sub-tree of n nodes closed under parents and earlier siblings (brute force)."""
    import itertools

    rank = {c: r for a in range(-1, superset.size) for r, c in enumerate(superset.kids[a])}
    for combo in itertools.combinations(range(superset.size), n):
        chosen = set(combo)
        if all((superset.parent[v] < 0 or superset.parent[v] in chosen)
               and all(c in chosen for c in superset.kids[superset.parent[v]][:rank[v]])
               for v in chosen):
            yield chosen


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_the_knapsack_finds_the_best_closed_sub_tree(n):
    """Against exhaustive search over every closed sub-tree of a width-3 depth-2 superset,
    with random node values (not monotone, so the greedy choice is no shortcut)."""
    from coupling.sequence.plan import best_tree

    superset = Tree.from_branching([3, 2])
    values = np.random.default_rng(n).random(superset.size)
    tree, value = best_tree(values, superset, n)
    brute = max(sum(values[v] for v in s) for s in _closed_subtrees(superset, n))
    assert value == pytest.approx(1 + brute, abs=1e-12) and tree.size == n
    index = {path: v for v, path in enumerate(superset.paths())}
    assert 1 + sum(values[index[path]] for path in tree.paths()) == pytest.approx(value)


def test_the_best_tree_without_replacement_is_worth_what_the_knapsack_says():
    """Children without replacement: the value adds over nodes, so the knapsack's value of
    its tree is the tree's tokens per call on the traces, and no other tree of that size
    scores more."""
    from coupling.sequence.plan import best_tree, node_values, rank

    t, d = pair(3, 12)
    contexts = [(a, b) for a in range(3) for b in range(3)]
    traces = from_models(t, d, 2, 3, contexts, np.random.default_rng(4), calls_per_context=5,
                         children="distinct")
    values = node_values(traces, "rrs")
    for n in (2, 4, 6):
        tree, value = best_tree(values, traces.superset, n)
        assert tokens_per_call(traces, "rrs", tree).mean == pytest.approx(value, abs=1e-12)
        others = [Tree.from_paths(sorted((traces.superset.paths()[v] for v in s),
                                         key=lambda x: (len(x), x)), "distinct")
                  for s in _closed_subtrees(traces.superset, n)]
        best = rank(traces, [("rrs", o) for o in others])[0]
        assert best.tokens_per_call.mean == pytest.approx(value, abs=1e-12)


# ----------------------------------------------------------------------------- coupling plan
def test_plan_ranks_exact_candidates_and_says_when_plain_sampling_wins(tmp_path, capsys):
    """coupling plan: every candidate scored on the traces; with call costs the ranking is by
    tokens/s, a plan that loses to plain sampling recommends no speculation, and the JSON
    names its parts."""
    from coupling.planner import Cost, main, plan

    t, d = pair(3, 3)
    contexts = [(a, b) for a in range(3) for b in range(3)]
    traces = from_models(t, d, 2, 2, contexts, np.random.default_rng(2), calls_per_context=8)
    path = tmp_path / "t.npz"
    traces.save(path)
    free = plan(traces, ["rrs", "traversal"])
    means = [r.tokens_per_call.mean for r in free.candidates]
    assert means == sorted(means, reverse=True) and free.recommended is free.candidates[0]
    assert {r.rule for r in free.candidates} == {"rrs", "traversal"}
    cheap = plan(traces, ["rrs"], Cost.parse("1:40,7:41", 0.5))
    assert cheap.recommended is not None and cheap.recommended.tokens_per_s > 25.0
    dear = plan(traces, ["rrs"], Cost.parse("1:40,7:200", 20.0))        # a busy batch on CPU
    assert dear.recommended is None
    assert json.loads(dear.to_json())["recommended"] == "no speculation"
    assert main([str(path), "--rules", "rrs,token", "--target-ms", "1:40,7:41", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"recommended", "plain_tokens_per_s", "sequoia", "candidates"}
    first = out["candidates"][0]
    assert {"rule", "tree", "k", "gamma", "predicted_tokens_per_call", "predicted_tokens_per_s",
            "predicted_tokens_per_s_interval"} <= set(first)
    low, high = first["predicted_tokens_per_s_interval"]
    assert low <= first["predicted_tokens_per_s"] <= high
    assert out["sequoia"]["source"] == "sequoia"
    assert main([str(path), "--target-ms", "1:x"]) == 2
    assert "tokens:ms pairs" in capsys.readouterr().err


def test_the_exact_knapsack_never_loses_to_sequoias_positional_model():
    """Sequoia's tree of each size (its positional acceptance model, read off the same traces)
    scored exactly: never above the knapsack's tree, which is exact without replacement; and
    the planner lists it as its own source."""
    from coupling.planner import plan
    from coupling.sequence.plan import best_trees, node_values, positional_values

    t, d = pair(3, 14)
    contexts = [(a, b) for a in range(3) for b in range(3)]
    traces = from_models(t, d, 2, 3, contexts, np.random.default_rng(6), calls_per_context=4,
                         children="distinct")
    values = node_values(traces, "rrs")
    ours = best_trees(values, traces.superset, traces.superset.size)
    theirs = best_trees(positional_values(values, traces.superset), traces.superset,
                        traces.superset.size)
    gaps = [tokens_per_call(traces, "rrs", a).mean - tokens_per_call(traces, "rrs", b).mean
            for (a, _), (b, _) in zip(ours, theirs, strict=True)]
    assert min(gaps) > -1e-12 and max(gaps) > 1e-4
    assert {r.source for r in plan(traces, ["rrs"]).candidates} >= {"knapsack", "sequoia"}


def test_sequoias_choice_follows_its_own_speed_model():
    """Sequoia's planner keeps the size its positional model predicts fastest: the whole
    superset when a bigger call costs nothing more, one node when every scored token costs a
    decoding call; either way scored exactly on the traces."""
    from coupling.planner import Cost, sequoia_choice

    t, d = pair(3, 3)
    contexts = [(a, b) for a in range(3) for b in range(3)]
    traces = from_models(t, d, 2, 2, contexts, np.random.default_rng(4), calls_per_context=4)
    flat = sequoia_choice(traces, Cost.parse("1:40,7:40", 0.0))
    steep = sequoia_choice(traces, Cost.parse("1:40,7:4000", 0.0))
    assert flat.tree.size == traces.superset.size and steep.tree.size == 1
    for row in (flat, steep):
        assert row.source == "sequoia"
        assert row.tokens_per_call.mean == pytest.approx(
            tokens_per_call(traces, "rrs", row.tree).mean, abs=1e-12)


@pytest.mark.parametrize("name, vocab", [("tree_traces_smollm2.npz", 49152),
                                         ("tree_traces_gemma3.npz", 262144)])
def test_the_shipped_tree_traces_plan_their_pair(name, vocab):
    """The recorded traces of the shipped pairs load, say which pair and settings they hold,
    and plan: every candidate exact on them, the knapsack's best tree of each size never
    below Sequoia's by more than the i.i.d. approximation allows."""
    from pathlib import Path

    from coupling.planner import Cost, plan

    path = Path(coupling.__file__).parent / "data" / name
    traces = TreeTraces.load(path)
    from coupling.llm.sampling import SamplingConfig

    traces.check(vocab_size=vocab, sampling=SamplingConfig(0.7, 50, 0.95).as_dict())
    assert set(traces.header["models"]) == {"target", "draft"}
    assert traces.superset == Tree.from_branching([3, 3, 3]) and traces.calls >= 100
    result = plan(traces, ["token", "rrs", "traversal"], Cost.parse("1:40,13:44", 2.0, 4.0))
    for row in result.candidates[:5]:
        assert row.tokens_per_call.mean == pytest.approx(
            tokens_per_call(traces, row.rule, row.tree).mean, abs=1e-12)
        assert 1.0 <= row.tokens_per_call.low <= row.tokens_per_call.mean <= \
            row.tokens_per_call.high <= 1 + row.tree.depth
    assert result.sequoia is not None and result.sequoia.source == "sequoia"


def test_the_plan_plots_speed_against_tree_size():
    """One line per rule through its best candidate of each size, and plain sampling's
    level; without costs the axis is tokens per call."""
    import matplotlib

    matplotlib.use("Agg")
    from coupling.planner import Cost, plan

    t, d = pair(3, 3)
    traces = from_models(t, d, 2, 2, [(0, 1), (2, 2)], np.random.default_rng(1),
                         calls_per_context=4)
    ax = plan(traces, ["rrs", "traversal"], Cost.parse("1:40,7:44", 1.0)).plot()
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == {"rrs", "traversal", "plain sampling"}
    assert ax.get_ylabel() == "predicted tokens/s"
    assert lines["plain sampling"].get_ydata()[0] == pytest.approx(1e3 / 40)
    assert plan(traces, ["rrs"]).plot().get_ylabel() == "tokens per target call"


def test_plan_refuses_costs_of_another_pair(tmp_path, capsys):
    from coupling.planner import main

    t, d = pair(3, 3)
    traces = from_models(t, d, 2, 1, [(0, 1)], np.random.default_rng(1), calls_per_context=2)
    traces.header["models"] = {"target": "T", "draft": "D"}
    traces.save(tmp_path / "t.npz")
    cost = {"target_ms": {"1": 40.0, "3": 41.0}, "draft_ms": {"1": 1.0}}
    for models, code in (({"target": "T", "draft": "D"}, 0), ({"target": "T", "draft": "E"}, 2)):
        (tmp_path / "c.json").write_text(json.dumps({**cost, "models": models}))
        assert main([str(tmp_path / "t.npz"), "--cost", str(tmp_path / "c.json")]) == code
    assert "profile the pair you recorded" in capsys.readouterr().err
