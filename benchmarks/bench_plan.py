#!/usr/bin/env python
"""Does a plan from recorded traces predict the measured speed? `coupling plan` on one half
of the demo's prompts, a grid of plans measured on the other half, in one process.

For a real model pair (``--pair smollm2``: SmolLM2-135M-Instruct with the trained 1-layer
draft; ``--pair gemma``: Gemma 3 270M base with its first ``--exit-layer`` layers as the
draft), on the demo's 12 prompts (even ones recorded, odd ones measured; the demo's sampling,
T = 0.7, top-k 50, top-p 0.95):

1. record tree traces on the even prompts (a 3 x 3 i.i.d. superset, and a 1 x 6 chain for the
   chains deeper than 3), profile the call costs (``coupling profile``'s measurement), and plan
   (``coupling.planner.plan``) for ``token``, ``rrs`` and ``traversal``;
2. run a grid on the odd prompts, interleaved (each prompt runs every configuration, the
   order rotated from prompt to prompt, seed = prompt index): plain sampling; the plan's
   recommendation and next best; Sequoia's choice (its knapsack on its positional acceptance
   model, its size chosen by its own predicted speed, ``planner.sequoia_choice``); token
   verification at gamma 3 and 5 (the values vLLM's speculative-decoding examples set for
   ``num_speculative_tokens``; its tree is off by default); the knapsack's ``rrs`` trees of
   2, 5, 9 and 13 nodes, ``traversal`` on 3 and 8, token at gamma 1, 2 and 4;
3. print predicted and measured tokens/s side by side, with tokens per call (predicted from
   the recorded half; exact on traces of the measured half itself, "same", which shows what
   the split costs; measured), milliseconds per call, and the error of the speed-up over
   plain sampling, which a machine running faster or slower during the runs than during the
   profile leaves unchanged (the target's decoding call is timed again after the runs to
   show that drift); then the errors' median and largest, and the recommendation against
   the best measured, against Sequoia's choice and against the defaults (ratios of tokens/s
   with a bootstrap interval over the measured prompts). Hugging Face's assisted generation
   runs too, by transformers itself with its defaults (20 draft tokens, its confidence stop
   at 0.4): measured only, since its gate is not a fixed tree.

Usage::

    python benchmarks/bench_plan.py --pair smollm2
    python benchmarks/bench_plan.py --pair gemma --exit-layer 6
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np


def grid(tree_plan, chain_plan, sequoia):
    """(label, row) of the configurations to measure (module doc), each row a planner Row."""
    from coupling.tree import Tree

    def find(plan, rule, nodes=None, tree=None):
        for r in plan.candidates:
            if r.rule == rule and r.source != "sequoia" and \
                    (r.tree == tree if tree is not None else r.tree.size == nodes):
                return r
        return None

    out = [("recommended", tree_plan.candidates[0]), ("next best", tree_plan.candidates[1]),
           ("sequoia", sequoia)]
    for g in (3, 5):
        out.append((f"default gamma={g}", find(chain_plan, "token", tree=Tree.from_chains(1, g))))
    for g in (1, 2, 4):
        out.append((f"token gamma={g}", find(chain_plan, "token", tree=Tree.from_chains(1, g))))
    for n in (2, 5, 9, 13):
        out.append((f"rrs {n} nodes", find(tree_plan, "rrs", nodes=n)))
    for n in (3, 8):
        out.append((f"traversal {n} nodes", find(tree_plan, "traversal", nodes=n)))
    merged: dict[tuple, list] = {}
    for label, row in out:
        if row is not None:
            merged.setdefault((row.rule, row.tree), [[], row])[0].append(label)
    return [(" = ".join(labels), row) for labels, row in merged.values()]


def shape(tree) -> str:
    """A short name of a tree: ``chain g`` or ``n nodes, depth d``."""
    if tree.size == tree.depth:
        return f"chain {tree.depth}"
    return f"{tree.size} nodes, depth {tree.depth}"


#: Hugging Face assisted generation with its default settings (``num_assistant_tokens`` 20,
#: constant schedule, ``assistant_confidence_threshold`` 0.4), run by transformers itself
HF_DEFAULT = "HF default"


def measure(target, drafter, prompts, rows, *, cfg, tokens, eos):
    """Per configuration (and ``plain``) and per prompt: (tokens, seconds, target calls)."""
    from coupling.llm import engine as E

    names = ["plain", HF_DEFAULT] + [label for label, _ in rows]
    runs = {"plain": lambda p, kw: E.autoregressive(target, p, **kw),
            HF_DEFAULT: lambda p, kw: E.hf_assisted(target, drafter.lm.model, p, gamma=20,
                                                     confidence=0.4, **kw)}
    for label, row in rows:
        runs[label] = (lambda r: lambda p, kw: E.generate(
            target, drafter, p, rule=r.rule, tree=r.tree, record_alpha=False, **kw))(row)
    out = {n: np.zeros((len(prompts), 3)) for n in names}
    for i, p in enumerate(prompts):
        kw = dict(max_new_tokens=tokens, cfg=cfg, seed=i, eos_token_id=eos)
        for n in names[i % len(names):] + names[:i % len(names)]:
            r = runs[n](p, kw)
            out[n][i] = len(r.tokens), r.seconds, r.target_calls
        print(f"prompt {i + 1}/{len(prompts)} measured", file=sys.stderr, flush=True)
    return out


def ratio_interval(a: np.ndarray, b: np.ndarray, reps: int = 2000, seed: int = 0):
    """tokens/s of ``a`` over ``b`` (per-prompt rows of (tokens, seconds, calls)), with a 95%
    bootstrap interval over prompts."""
    speed = lambda m, ix: m[ix, 0].sum() / m[ix, 1].sum()     # noqa: E731
    full = np.arange(len(a))
    rng = np.random.default_rng(seed)
    boot = [speed(a, ix) / speed(b, ix) for ix in
            (rng.integers(0, len(a), len(a)) for _ in range(reps))]
    return speed(a, full) / speed(b, full), *np.quantile(boot, [0.025, 0.975])


def print_grid(cost, rows, got, held_out, inside) -> tuple[list, list]:
    """The table of predicted against measured, per configuration; returns the absolute
    errors of tokens/s (every row) and of the speed-up over plain sampling (speculative
    rows)."""
    from coupling.sequence.traces import tokens_per_call

    # a run pays its prompt's prefill (a target call of the prompt, a draft call) before its
    # first step: the predicted seconds of the measured runs hold it, at the profiled costs
    prefill = sum(cost.call(len(p) - 1) for p in held_out)
    draft_prefill = sum(cost.draft(len(p) - 1) for p in held_out)
    print(f"\n{'configuration':<38}{'rule':<10}{'tree':<18}{'pred tok/call':>15}"
          f"{'same':>7}{'meas':>7}{'pred ms/call':>13}{'meas':>7}{'pred tok/s':>11}{'meas':>7}"
          f"{'error':>8}{'of x plain':>11}")
    errors, rel_errors, base = [], [], None
    table = [("plain", None, 1e3 / cost.plain())] + [(lab, r, r.tokens_per_s) for lab, r in rows]
    for label, row, steady in table:
        m = got[label]
        speed = m[:, 0].sum() / m[:, 1].sum()
        extra = prefill + (0 if row is None else draft_prefill)
        pred = m[:, 0].sum() / (extra / 1e3 + m[:, 0].sum() / steady)
        err = speed / pred - 1
        base = base or (speed, pred)              # plain sampling, the table's first row
        rel = (speed / base[0]) / (pred / base[1]) - 1
        errors.append(abs(err))
        if row is not None:
            rel_errors.append(abs(rel))
        e = row.tokens_per_call if row is not None else None
        step = cost.plain() if row is None else cost.step(row.tree, row.rule)
        same = 1.0 if row is None else tokens_per_call(
            inside[1 if row.tree.size == row.tree.depth and row.rule == "token" else 3],
            row.rule, row.tree).mean
        print(f"{label:<38}{row.rule if row else '':<10}{shape(row.tree) if row else '':<18}"
              + (f"{e.mean:8.3f} ±{(e.high - e.low) / 2:.3f}" if e else f"{1:15.3f}")
              + f"{same:7.3f}{m[:, 0].sum() / m[:, 2].sum():7.3f}{step:13.1f}"
              f"{1e3 * m[:, 1].sum() / m[:, 2].sum():7.1f}{pred:11.1f}{speed:7.1f}"
              f"{100 * err:+7.1f}%" + (f"{100 * rel:+10.1f}%" if row is not None else ""))
    m = got[HF_DEFAULT]
    print(f"{HF_DEFAULT + ' (transformers)':<38}{'token':<10}{'chain 20, gated':<18}{'':>22}"
          f"{m[:, 0].sum() / m[:, 2].sum():7.3f}{'':>13}"
          f"{1e3 * m[:, 1].sum() / m[:, 2].sum():7.1f}{'':>11}"
          f"{m[:, 0].sum() / m[:, 1].sum():7.1f}")
    return errors, rel_errors


def print_verdict(got, errors, *, recommended: bool) -> None:
    """The errors' median and largest, and the plan's choice against the best measured,
    Sequoia's choice, the defaults and plain sampling."""
    errors, rel_errors = errors
    speeds = {n: m[:, 0].sum() / m[:, 1].sum() for n, m in got.items()}
    print(f"prediction error of tokens/s: median {100 * np.median(errors):.1f}%, largest "
          f"{100 * max(errors):.1f}% over {len(errors)} configurations; of the speed-up over "
          f"plain sampling (where the machine's drift between the profile and the runs "
          f"cancels): median {100 * np.median(rel_errors):.1f}%, largest "
          f"{100 * max(rel_errors):.1f}%")
    best = max(speeds, key=speeds.get)
    top = next(n for n in got if n.startswith("recommended")) if recommended else "plain"
    print(f"measured best: {best} ({speeds[best]:.1f} tok/s); the plan's choice ({top}) runs "
          f"{100 * (speeds[top] / speeds[best] - 1):+.1f}% against it")
    for other in [n for n in got if n != top and any(
            w in n for w in ("sequoia", "default", "plain"))]:
        r, lo, hi = ratio_interval(got[top], got[other])
        print(f"{top} / {other}: {r:.3f} [{lo:.3f}, {hi:.3f}] (tokens/s ratio, 95% bootstrap "
              "over prompts)")


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm.pairs import load_pair
    from coupling.llm.record import profile, record
    from coupling.llm.sampling import SamplingConfig
    from coupling.planner import Cost, plan, sequoia_choice

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", choices=("smollm2", "gemma"), default="smollm2")
    ap.add_argument("--exit-layer", type=int, default=6, help="gemma: the draft's layers")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per prompt (96)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SamplingConfig(0.7, 50, 0.95)

    pair = load_pair(args.pair, exit_layer=args.exit_layer if args.pair == "gemma" else None)
    target, drafter, prompts, eos = pair.target, pair.drafter, pair.prompts, pair.eos_token_id
    desc = f"{pair.names['target']} + {pair.names['draft']}"
    recorded, held_out = prompts[0::2], prompts[1::2]
    rec = dict(max_new_tokens=args.tokens, cfg=cfg, seed=0)
    tree_traces = record(target, drafter, recorded, width=3, depth=3, **rec)
    chain_traces = record(target, drafter, recorded, width=1, depth=6, **rec)
    sizes = [1, 2, 3, 4, 5, 7, 9, 11, 14, 17, 25, 33, 41]
    profile(target, drafter, recorded[0], sizes=sizes, repeats=1, rules=("rrs",))  # warm-up
    # the calls timed where a run spends its steps: halfway through its new tokens
    context = int(np.mean([len(p) for p in held_out])) + args.tokens // 2
    raw = profile(target, drafter, recorded[0], sizes=sizes, repeats=9, context=context)
    cost = Cost.from_dict(raw)
    print(json.dumps(raw), file=sys.stderr)
    tree_plan = plan(tree_traces, ["token", "rrs", "traversal"], cost)
    chain_plan = plan(chain_traces, ["token"], cost)
    rows = grid(tree_plan, chain_plan, sequoia_choice(tree_traces, cost))
    print(f"{desc}; {torch.get_num_threads()} threads; traces: {tree_traces.calls} calls "
          f"(3 x 3 superset), {chain_traces.calls} (chain of 6) on {len(recorded)} prompts; "
          f"costs: target {cost.call(1):.1f} ms for 1 token, {cost.call(14):.1f} for 14, "
          f"draft {cost.draft(1):.1f} ms for 1, {cost.draft(9):.1f} for 9, a step's own work "
          f"{cost.overhead('rrs', 2):.1f} ms on 2 nodes, {cost.overhead('rrs', 12):.1f} on 12; "
          "plan "
          f"recommends {'no speculation' if tree_plan.recommended is None else 'speculation'}",
          flush=True)

    # the same traces of the measured prompts: what the prediction would be without the split
    inside = {1: record(target, drafter, held_out, width=1, depth=6, **rec),
              3: record(target, drafter, held_out, width=3, depth=3, **rec)}
    got = measure(target, drafter, held_out, rows, cfg=cfg, tokens=args.tokens, eos=eos)
    after = profile(target, drafter, recorded[0], sizes=[1], repeats=9, context=context,
                    rules=())
    errors = print_grid(cost, rows, got, held_out, inside)
    print(f"\nthe target's decoding call: {cost.call(1):.1f} ms in the profile before the runs, "
          f"{after['target_ms']['1']:.1f} ms after them")
    print_verdict(got, errors, recommended=tree_plan.recommended is not None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
