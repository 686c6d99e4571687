#!/usr/bin/env python
"""Each compiled path of :mod:`coupling.llm.accel` against its pure-torch fallback, on the
default demo's best rules, in one process.

A compiled path keeps its place only if it changes the default demo's best-rule tokens/s by at
least 3% (``--keep``). This script measures that: the demo's models, settings and prompts
(``coupling demo``'s defaults: 8 prompts x 96 new tokens, the same generation calls through
:func:`coupling.llm.demo.run_method`), run under several *arms*, each with its own copy of the
models built and run inside ``accel.disabled(...)``:

* ``all``: every compiled path serves;
* ``-P`` for each path P: every path but P;
* ``none``: torch everywhere (what ``COUPLING_ACCEL=off`` runs), for the paths' joint effect.

For each round (``--rounds``) and prompt, every (arm, method) runs once with the same seed
(round r, prompt i: seed 1000 r + i, so round 0 samples the demo's own text and later rounds
other text, which a path that rounds differently would otherwise tilt), the arms' order
rotated from prompt to prompt and round to round, so a machine that speeds up or slows down
hits every arm alike; the totals pool all rounds. Generations run without the demo's per-step
analysis (it is not timed there either), and are timed twice: wall clock (the demo's
tokens/s) and this process's CPU time (tokens per CPU second: what an idle machine's wall
clock would show at one thread, steady where other jobs share the cores). Printed: tokens/s
and block efficiency per arm and method, then per path the ratio of the best method's tokens/s
with the path to without it, per clock, pooled and per round, and whether the CPU-time ratio
reaches ``--keep``.

Usage::

    python benchmarks/bench_accel.py --threads 1              # the demo's best rules, 2 rounds
    python benchmarks/bench_accel.py --methods token_feature --rounds 1 --prompts 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: the rules that run fastest in the default demo (``coupling demo``; docs/RESULTS.md)
BEST = "token_feature,rrs_k2_distinct_feature"


def arms(names: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Arm label -> the paths it switches off."""
    return {"all": (), **{f"-{name}": (name,) for name in names}, "none": names}


def ratios(best: dict[str, float], names: tuple[str, ...]) -> dict[str, tuple[float, str, str]]:
    """Path -> (best tokens/s with / without it, arm with, arm without)."""
    return {name: (best["all"] / best[f"-{name}"], "all", f"-{name}") for name in names}


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm import accel, demo
    from coupling.llm.models import chat_prompt
    from coupling.llm.sampling import SamplingConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default=BEST, help=f"demo methods to time (default {BEST})")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    ap.add_argument("--keep", type=float, default=1.03)
    args = ap.parse_args(argv)
    if accel.status() != "compiled":
        print(f"no compiled paths here: {accel.status()}")
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    dargs = demo.resolve_auto(demo.build_parser().parse_args(
        ["--methods", args.methods, "--prompts", str(args.prompts),
         "--max-new-tokens", str(args.max_new_tokens)]))
    cfg = SamplingConfig(dargs.temperature, dargs.top_k, dargs.top_p)
    by_label = {m.label: m for m in demo.FULL}
    methods = [by_label[m] for m in args.methods.split(",")]
    feature = any(m.drafter == "feature" for m in methods)
    plan = arms(accel.NAMES)
    loaded = {}
    for arm, off in plan.items():
        with accel.disabled(*off):
            loaded[arm] = demo.load_models(dargs, feature=feature)
    prompts = [chat_prompt(loaded["all"].tok, t) for t in demo.load_prompts()[:args.prompts]]

    def one(arm: str, m, prompt: list[int], seed: int, n: int):
        with accel.disabled(*plan[arm]):
            t0 = time.process_time()
            res = demo.run_method(loaded[arm], m, prompt, seed, n, dargs, cfg, True,
                                  predict=False)
            return res, time.process_time() - t0

    for arm in plan:                              # warm-up: first calls allocate
        for m in methods:
            one(arm, m, prompts[0], 12345, 8)
    tot = {(arm, m.label): [0, 0.0, 0, 0.0] for arm in plan for m in methods}
    rounds = []
    order = list(plan)
    for r in range(args.rounds):
        rounds.append({key: [0, 0.0, 0, 0.0] for key in tot})
        for i, prompt in enumerate(prompts):
            shift = (r * len(prompts) + i) % len(order)
            for arm in order[shift:] + order[:shift]:
                for m in methods:
                    res, cpu = one(arm, m, prompt, 1000 * r + i, args.max_new_tokens)
                    for t in (tot[(arm, m.label)], rounds[-1][(arm, m.label)]):
                        t[0] += len(res.tokens)
                        t[1] += res.seconds
                        t[2] += res.target_calls
                        t[3] += cpu
            print(f"round {r + 1}/{args.rounds}, prompt {i + 1}/{len(prompts)} done",
                  file=sys.stderr, flush=True)
    report(tot, rounds, plan, methods, accel.NAMES, args.keep)
    return 0


def best_rates(tot, plan, methods, clock: int) -> dict[str, float]:
    """Arm -> the best method's tokens per second of ``clock`` (1: wall, 3: CPU time)."""
    return {arm: max(tot[(arm, m.label)][0] / tot[(arm, m.label)][clock] for m in methods)
            for arm in plan}


def report(tot, rounds, plan, methods, names, keep: float) -> None:
    width = max(len(a) for a in plan) + 2
    print(f"{'arm':{width}s} {'method':24s} {'block eff':>9s} {'tok/s':>7s} {'tok/cpu-s':>9s}")
    for arm in plan:
        for m in methods:
            n, s, c, cpu = tot[(arm, m.label)]
            print(f"{arm:{width}s} {m.label:24s} {n / c:9.3f} {n / s:7.2f} {n / cpu:9.2f}")
    for clock, unit in ((3, "tokens per CPU second"), (1, "tokens/s, wall clock")):
        best = best_rates(tot, plan, methods, clock)
        per_round = [ratios(best_rates(t, plan, methods, clock), names) for t in rounds]
        print(f"\nbest-rule {unit}, with / without each path, pooled and per round"
              + (f" (keep at >= {keep:g}):" if clock == 3 else ":"))
        for name, (ratio, with_arm, without) in ratios(best, names).items():
            verdict = ("keep" if ratio >= keep else "delete") if clock == 3 else ""
            each = " ".join(f"{r[name][0]:.3f}" for r in per_round)
            print(f"{name:14s} {ratio:6.3f}  ({with_arm} {best[with_arm]:.2f} / {without} "
                  f"{best[without]:.2f}; rounds {each})  {verdict}")
        each = " ".join(f"{b['all'] / b['none']:.3f}" for b in
                        (best_rates(t, plan, methods, clock) for t in rounds))
        print(f"{'all paths':14s} {best['all'] / best['none']:6.3f}  (all / none; rounds {each})")


if __name__ == "__main__":
    sys.exit(main())
