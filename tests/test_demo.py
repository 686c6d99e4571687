"""``coupling demo``'s settings, report and bootstrap interval (no model loaded)."""

from __future__ import annotations

import os

import numpy as np
import pytest


def test_speedup_interval_is_exact_where_the_bootstrap_law_is_known():
    """demo.speedup_interval: prompts that all run r times faster give the point [r, r]; two
    prompts at speedups 1 and 2 (equal tokens and times) resample to "both 1" and "both 2"
    with probability 1/4 each, so the central 95% range is exactly [1, 2], and the 50% range
    lies inside it; the draws are seeded."""
    from coupling.llm.demo import speedup_interval

    assert speedup_interval([10, 20, 5], [1, 2, 0.5], [10, 20, 5], [2, 4, 1]) == \
        pytest.approx((2.0, 2.0), abs=1e-12)
    assert speedup_interval([7], [1.0], [7], [1.5]) == pytest.approx((1.5, 1.5))
    wide = speedup_interval([10, 10], [1, 1], [10, 10], [1, 2])
    assert wide == pytest.approx((1.0, 2.0), abs=1e-12)
    lo, hi = speedup_interval([10, 10], [1, 1], [10, 10], [1, 2], level=0.5)
    assert 1.0 <= lo <= hi <= 2.0 and hi - lo < 1.0
    rng = np.random.default_rng(3)
    t, s, at, as_ = rng.integers(50, 97, 8), rng.uniform(2, 4, 8), np.full(8, 96), \
        rng.uniform(3, 5, 8)
    a, b = speedup_interval(t, s, at, as_), speedup_interval(t, s, at, as_)
    pooled = (t.sum() / s.sum()) / (at.sum() / as_.sum())
    assert a == b and a[0] < pooled < a[1]


@pytest.mark.parametrize("args, kwargs, msg", [
    (([1, 2], [1, 1], [1], [1]), {}, "one entry per prompt"),
    (([], [], [], []), {}, "one entry per prompt"),
    (([1], [0.0], [1], [1]), {}, "seconds finite and > 0"),
    (([1], [1], [1], [float("nan")]), {}, "finite"),
    (([-1], [1], [1], [1]), {}, ">= 0"),
    (([1], [1], [1], [1]), {"level": 1.5}, "level=1.5"),
    (([1], [1], [1], [1]), {"resamples": 0}, "resamples=0")])
def test_speedup_interval_refuses_malformed_runs(args, kwargs, msg):
    from coupling.llm.demo import speedup_interval

    with pytest.raises(ValueError, match=msg):
        speedup_interval(*args, **kwargs)


@pytest.mark.parametrize("argv, msg", [
    (["--prompts", "0"], "--prompts 0"), (["--prompts", "1000"], "--prompts 1000"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"), (["--gamma", "-3"], "--gamma -3"),
    (["--threads", "-1"], "--threads -1"), (["--draft-confidence", "1.5"], "--draft-confidence"),
    (["--seed", str(2**64)], "--seed"), (["--methods", ""], "--methods"),
    (["--json", "/"], "is a directory"), (["--draft-head", "-5"], "--draft-head -5"),
    (["--draft-logit-scale", "-1"], "--draft-logit-scale"),
    (["--draft-logit-scale", "inf"], "--draft-logit-scale"),
    (["--draft-logit-scale", "nan"], "--draft-logit-scale"),
    (["--tree", "3,x"], "--tree 3,x"), (["--tree", "eagle:99"], "--tree eagle:99"),
    (["--tree", "3,2", "--tree-rule", "rrs,block"], "--tree-rule block"),
    (["--tree", "3,2", "--tree-rule", ","], "--tree-rule: empty"),
    (["--first-prompt", "10"], "--first-prompt 10"), (["--plan", "/nonexistent"], "--plan"),
    (["--tree", "3,2", "--tree-rule", "typical"], "lossless")])
def test_demo_refuses_settings_before_loading_models(argv, msg):
    """Settings the run would otherwise replace (--prompts 0 by 8 prompts, --gamma -3 by plain
    sampling in the "token" row) or trip over after the whole run (--json on a directory) are
    refused before any model loads."""
    from coupling.llm import demo

    with pytest.raises(ValueError, match=msg):
        demo.check_args(demo.build_parser().parse_args(argv))
    demo.check_args(demo.build_parser().parse_args([]))        # the defaults pass


def test_demo_states_what_parallel_verification_cost():
    """The demo's line on the price of a verification call: the token rule's call over a
    decoding call, and the bound BE / c on any rule verifying gamma drafted tokens; it says
    that no such rule can win when the best BE does not exceed c (the n-gram drafter, whose
    calls often score fewer tokens, is left out of that claim)."""
    from coupling.llm.demo import verification_price

    def res(call_ms, bes):
        rules = {"token": {"target_call_ms": call_ms, "block_efficiency": bes[0],
                           "drafter": "trained"},
                 "block_feature": {"target_call_ms": call_ms, "block_efficiency": bes[1],
                                   "drafter": "feature"},
                 "token_ngram": {"target_call_ms": 60.0, "block_efficiency": 9.0,
                                 "drafter": "ngram"}}
        return {"rules": rules, "autoregressive_target_call_ms": 50.0,
                "settings": {"gamma": 2}, "models": {"target_quant": quant}}

    quant = "none"
    cheap = verification_price(res(51.0, (1.3, 1.55)))
    assert "1.02x a decoding call" in cheap and "none of them" not in cheap
    assert "--target-quant" not in cheap
    dear = verification_price(res(88.0, (1.38, 1.55)))
    assert "1.76x" in dear and "best such BE of this run, 1.55" in dear and "none of them" in dear
    assert "--target-quant int8" in dear   # the way out on a CPU without native bf16
    quant = "int8"
    assert "--target-quant" not in verification_price(res(88.0, (1.38, 1.55)))
    assert verification_price({"rules": {}, "autoregressive_target_call_ms": 50.0}) is None


def test_an_unset_gamma_is_two_and_gated_only_on_the_int8_target(monkeypatch):
    """An unset ``--gamma``: 2, gated at a first-law peak of ``INT8_DRAFT_CONFIDENCE`` on the
    int8 target and ungated on the bf16 one; explicit values are kept (an explicit gamma is
    not gated unless asked) and each choice made here is said. The defaults do not depend on
    the CPU: torch reporting another instruction set changes nothing."""
    import torch

    from coupling.llm.demo import INT8_DRAFT_CONFIDENCE, auto_settings, build_parser, resolve_auto

    gamma, conf, why = auto_settings("int8", None)
    assert (gamma, conf) == (2, INT8_DRAFT_CONFIDENCE) == (2, 0.8)
    assert len(why) == 1 and "0.8" in why[0]
    assert auto_settings("none", None) == (2, None, ["--gamma 2"])
    assert auto_settings("int8", None, 0.5)[:2] == (2, 0.5)
    assert auto_settings("int8", 3) == (3, None, [])
    assert auto_settings("none", 2) == (2, None, [])
    args = build_parser().parse_args(["--target-quant", "none", "--gamma", "4"])
    assert args.target_quant == "none" and args.gamma == 4
    resolve_auto(args)
    assert (args.target_quant, args.gamma, args.draft_confidence, args.auto) == \
        ("none", 4, None, [])
    args = build_parser().parse_args(["--gamma", "1", "--draft-confidence", "0.6"])
    assert resolve_auto(args).draft_confidence == 0.6
    from coupling.llm import accel

    for capability in (*accel.CAPABILITIES, "DEFAULT"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        args = resolve_auto(build_parser().parse_args([]))
        assert (args.target_quant, args.gamma, args.draft_confidence) == ("none", 2, None)
        assert args.auto == ["--gamma 2"]
    args = resolve_auto(build_parser().parse_args(["--target-quant", "int8"]))
    assert (args.gamma, args.draft_confidence) == (2, 0.8)
    args.gamma = 5
    assert resolve_auto(args).gamma == 5                      # resolved once


def test_demo_methods_are_specs_of_lossless_rules():
    """A method is (rule, k, replacement, drafter) over the registry's lossless rules; its
    label is derived from the spec, and what the rule does not take is refused by name."""
    from coupling.llm.demo import FULL, QUICK, Method

    labels = [m.label for m in FULL]
    assert len(set(labels)) == len(labels) and set(QUICK) <= set(labels)
    assert Method("engine", "rrs", 2, replacement=False, drafter="feature").label == \
        "rrs_k2_distinct_feature"
    for spec, msg in ((dict(rule="typical"), "lossless"), (dict(rule="relaxed", k=2), "lossless"),
                      (dict(rule="rrs_wor", k=2), "lossless"),
                      (dict(rule="kseq", k=2, replacement=False), "replacement=False"),
                      (dict(rule="token", drafter="oracle"), "drafter=")):
        with pytest.raises(ValueError, match=msg):
            Method("engine", **spec)


def test_a_tree_adds_its_line_and_reports_its_nodes():
    """--tree adds the --tree-rule line on that tree to the methods asked for; the table shows
    its node count in the k column and the header describes the tree."""
    from coupling.llm.demo import Method, build_parser
    from coupling.llm.demo.report import format_table, header
    from coupling.llm.demo.run import select_methods

    args = build_parser().parse_args(["--methods", "token", "--tree", "eagle:16",
                                      "--tree-rule", "rrs,traversal"])
    methods = select_methods(args)
    assert [m.label for m in methods] == ["autoregressive", "token", "rrs_tree",
                                          "traversal_tree"]
    assert methods[2] == Method("engine", "rrs", tree="eagle:16")
    assert methods[-1].topology().size == 16
    row = {"k": 1, "block_efficiency": 1.6, "predicted_block_efficiency": 1.55,
           "acceptance_rate": 0.04, "target_calls": 10, "tokens_per_s": 20.0,
           "speedup_vs_autoregressive": 1.1, "speedup_ci95": [1.0, 1.2], "drafter": "trained",
           "tree": {"spec": "eagle:16", "nodes": 16, "depth": 3, "parent": []}}
    table = format_table({"baselines": {}, "rules": {"rrs_tree": row}})
    assert table.splitlines()[-1].split()[:3] == ["rrs_tree", "16", "1.60"]
    res = {"settings": {"temperature": 0.7, "top_k": 50, "top_p": 0.95, "gamma": 2,
                        "prompts": 1, "max_new_tokens": 8, "seed": 0, "torch_threads": 1},
           "models": {"target": "t", "target_params": 1e6, "dtype": "bfloat16",
                      "device": "cpu", "draft": "d", "draft_own_params": 1e5,
                      "draft_quant": "none", "draft_logit_scale": 1.0, "target_quant": "none"},
           "rules": {"rrs_tree": row}}
    assert any(line.startswith("tree eagle:16: 16 nodes, depth 3") for line in header(res))


def test_a_busy_machine_is_flagged_and_said_so(tmp_path):
    """The demo measures the CPU time other processes take during its timed runs: a busy
    loop in another process (a simulated busy machine) makes the run's timings unreliable,
    the JSON carries the flag and its reason, and the report warns; without /proc/stat the
    flag is None and says why."""
    import subprocess
    import sys
    import time

    from coupling.llm.demo import load
    from coupling.llm.demo.report import timings_line

    first = load.snapshot()
    if first.busy is None:
        pytest.skip("no /proc/stat on this system")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        other = load.other_cores(first, load.snapshot())
    finally:
        busy.kill()
        busy.wait()
    assert other > 0.5                           # the loop held most of a core
    reliable, why = load.verdict(other, 2)
    assert reliable is False and "not trustworthy" in why
    res = {"timings_reliable": reliable, "timings_reason": why}
    assert timings_line(res).startswith("WARNING: timings: other processes kept")
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 900 5 0 0 10 0 0\ncpu0 1 2 3\n")
    assert load._busy_seconds(stat) == pytest.approx(160 / os.sysconf("SC_CLK_TCK"))
    assert load._busy_seconds(tmp_path / "missing") is None
    assert load.verdict(None, 2)[0] is None and "/proc/stat" in load.verdict(None, 2)[1]


def test_a_plan_adds_its_candidates_with_their_predictions(tmp_path):
    """--plan: the plan's best candidates run as tree lines labelled by rank, their JSON rows
    carry the predicted tokens/s, and the report sets it against the measurement."""
    import json

    from coupling.llm.demo import build_parser
    from coupling.llm.demo.report import plan_lines
    from coupling.llm.demo.run import select_methods

    plan = {"recommended": None, "plain_tokens_per_s": 23.0, "candidates": [
        {"rule": "rrs", "tree": [[0], [1], [2]], "children": "iid",
         "predicted_tokens_per_s": 26.4},
        {"rule": "rrs", "tree": [[0], [1]], "children": "distinct",
         "predicted_tokens_per_s": 26.1},
        {"rule": "token", "tree": [[0], [0, 0]], "predicted_tokens_per_s": 25.2}]}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    args = build_parser().parse_args(["--methods", "token", "--plan", str(path),
                                      "--plan-top", "2"])
    methods = select_methods(args)
    assert [m.label for m in methods] == ["autoregressive", "token", "rrs_tree_plan1",
                                          "rrs_tree_plan2"]
    assert methods[2].topology().size == 3 and methods[3].topology().children == "distinct"
    res = {"rules": {"rrs_tree_plan1": {"predicted_tokens_per_s": 26.4, "tokens_per_s": 26.7},
                     "token": {"predicted_tokens_per_s": None, "tokens_per_s": 25.0}}}
    assert plan_lines(res) == ["plan: rrs_tree_plan1 predicted 26.4 tokens/s, measured 26.7 "
                               "(+1.1%)"]
