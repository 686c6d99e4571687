#!/usr/bin/env python
"""The engine's verification call (``rules_adapter.decide``, B = 1) on laws as the demo makes
them, with the support compression on against off (the baseline), in the same process.

Laws: target logits N(0, 3^2) and draft logits the target's plus N(0, 1), both through the
demo's sampling transforms (T = 0.7, top-k 50, top-p 0.95) at V = 49152, so each law has at
most 50 tokens; drafts sampled from q (shared first-position laws across the k branches,
i.i.d. first tokens, or k distinct ones for ``rrs`` / ``optimal`` with ``replacement=False``).
gamma = 2 as in the
demo. The optimal rules' LP plan cache is cleared before every timed call (real text brings
new laws to every call, so it never hits there). Each configuration alternates the two modes
for ``--repeats`` calls and prints medians and their ratio, with the share of a target step:
the real target's one-token bf16 decoding step at context 100, timed in this process just
before and after each row (``ab_common.TargetStep``; ``--step-ms`` fixes it instead).

Usage::

    python benchmarks/bench_decide.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import TargetStep, demo_laws

    from coupling.llm import rules_adapter
    from coupling.llm.sampling import SamplingConfig
    from coupling.rules import optimal as optimal_rule

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=None,
                    help="a fixed target step in ms (default: timed in this process)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SamplingConfig(0.7, 50, 0.95)
    V, g = 49152, args.gamma
    gen = torch.Generator().manual_seed(0)
    step = None if args.step_ms else TargetStep()
    print(f"V = {V}, gamma = {g}, {args.threads} thread(s), medians of {args.repeats} calls; "
          f"% of a target step " + (f"of {args.step_ms:g} ms" if args.step_ms else
                                     "timed around each row (median of 6)"))
    print(f"{'rule':17s} {'k':>2s} {'full V, ms':>10s} {'compressed, ms':>14s} {'ratio':>6s} "
          f"{'step, ms':>8s} {'% step (compressed)':>20s} {'support':>7s}")
    modes = (False, True)   # compress
    for rule, k, replacement in [("token", 1, True), ("block", 1, True), ("gumbel", 1, True),
                                 ("rrs", 2, True), ("kseq", 2, True), ("optimal", 2, True),
                                 ("rrs", 2, False), ("optimal", 2, False), ("rrs", 4, True),
                                 ("kseq", 4, True)]:
        p, q = demo_laws(k, g, V, cfg, gen)
        if rule == "gumbel":
            drafts = torch.stack([rules_adapter.gumbel_draft(q[:, i], 0, 100 + i)
                                  for i in range(g)], 1)
        else:
            drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(k, g)
            if not replacement:                                 # k distinct first tokens
                drafts[:, 0] = torch.multinomial(q[0, 0], k, replacement=False, generator=gen)
        # the optimal rules cache their LP plan per (p, q); on real text every call brings
        # new laws, so each timed call solves afresh
        fresh = rule == "optimal"
        times: dict[bool, list[float]] = {m: [] for m in modes}
        steps = [step.time_ms() for _ in range(3)] if step else []
        for i in range(args.repeats + 5):
            for compress in modes:
                if fresh:
                    optimal_rule.clear_plan_cache()
                t0 = time.perf_counter()
                rules_adapter.decide(rule, drafts, q, p, 0, 100 + i, replacement=replacement,
                                     compress=compress)
                if i >= 5:
                    times[compress].append(time.perf_counter() - t0)
        steps += [step.time_ms() for _ in range(3)] if step else []
        step_ms = statistics.median(steps) if step else args.step_ms
        full, comp = (1e3 * statistics.median(times[m]) for m in modes)
        U = rules_adapter.support(p, q).numel()
        name = rule + ("" if replacement else " distinct")
        print(f"{name:17s} {k:2d} {full:10.2f} {comp:14.2f} {comp / full:6.2f} {step_ms:8.1f} "
              f"{100 * comp / step_ms:19.1f}% {U:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
