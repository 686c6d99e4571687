#!/usr/bin/env python
"""What one more scored token costs a real target call, and how much of it is the int8 kernel.

The speedup of a speculative rule over plain sampling is its block efficiency times the ratio
of a decoding call (1 new token) to the rule's verification call (2-3 new tokens at the demo's
gated gamma = 2), less the step's own work. On the int8 target of this CPU the verification
call's premium over a decoding call moves from run to run, and the measured speedups move with
it (``docs/RESULTS.md``, stop 27). This script measures the premium and splits it:

* the whole call: the int8 SmolLM2 target as the demo runs it (bf16 activations, weight-only
  int8 projections and head on :mod:`coupling.llm.int8_kernel`, ``models.GROUPED_SDPA``), a
  context of ``--context`` random tokens, fed n = 1, 2, 3 new tokens that are cropped away
  again; the row counts alternate call by call, ``--rounds`` rounds;
* the int8 kernel inside it: every ``Int8Linear``'s product wrapped with a timer (211 products
  a call), summed per call;
* the rest (attention, norms, rotary, casts, the cache), the difference of the two.

Printed per n: the call's 10th / 50th / 90th percentiles, the kernel's and the rest's medians,
and each one's change from n = 1. Timers add about a microsecond to each of the 211 products,
the same for every n.

Usage::

    python benchmarks/bench_call_rows.py --threads 2
    python benchmarks/bench_call_rows.py --threads 2 --context 300 --rows 1,2,3,5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def percentile(v: list[float], q: int) -> float:
    return statistics.quantiles(v, n=100, method="inclusive")[q - 1] if len(v) > 1 else v[0]


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import TargetStep

    from coupling.llm import models

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=150)
    ap.add_argument("--rows", type=str, default="1,2,3")
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    if args.threads < 1 or args.context < 1 or args.rounds < 2 or min(rows) < 1:
        ap.error("--threads, --context and every --rows entry must be >= 1, --rounds >= 2")
    torch.set_num_threads(args.threads)
    target = models.load_target("bfloat16")
    models.quantize_target_int8(target)
    linears = [m for m in target.modules() if isinstance(m, models.Int8Linear)]
    kernels = {m.kernel for m in linears}
    if kernels != {"avx2"}:
        print(f"the int8 products take {sorted(kernels)} here, not this package's AVX2 kernel: "
              "nothing to split")
        return 0

    kernel_s = [0.0]

    def timed(fn):
        def product(x, w, s):
            t0 = time.perf_counter()
            y = fn(x, w, s)
            kernel_s[0] += time.perf_counter() - t0
            return y
        return product

    for m in linears:
        m._avx2 = timed(m._avx2)
    # one cache per row count, each holding the same random context (seed 0)
    steps = {n: TargetStep(new=n, ctx=args.context, model=target) for n in rows}

    def call(n: int) -> tuple[float, float]:
        kernel_s[0] = 0.0
        ms = steps[n].time_ms()
        return ms, 1e3 * kernel_s[0]

    for n in rows:                                             # warm-up
        call(n)
    total: dict[int, list[float]] = {n: [] for n in rows}
    kernel: dict[int, list[float]] = {n: [] for n in rows}
    for r in range(args.rounds):
        for n in rows[r % len(rows):] + rows[: r % len(rows)]:
            ms, kernel_ms = call(n)
            total[n].append(ms)
            kernel[n].append(kernel_ms)
    med = {n: statistics.median(total[n]) for n in rows}
    kmed = {n: statistics.median(kernel[n]) for n in rows}
    rest = {n: statistics.median([t - k for t, k in zip(total[n], kernel[n], strict=True)])
            for n in rows}
    n0 = rows[0]
    print(f"int8 target (bf16 activations, {len(linears)} int8 products a call), context "
          f"{args.context}, {args.threads} thread(s), {args.rounds} rounds, ms per call")
    print(f"{'rows':>4} {'p10':>7} {'p50':>7} {'p90':>7} {'vs ' + str(n0):>7} | {'kernel':>7} "
          f"{'+':>6} | {'rest':>7} {'+':>6}")
    for n in rows:
        print(f"{n:>4} {percentile(total[n], 10):>7.2f} {med[n]:>7.2f} "
              f"{percentile(total[n], 90):>7.2f} {med[n] / med[n0]:>6.3f}x | {kmed[n]:>7.2f} "
              f"{kmed[n] - kmed[n0]:>+6.2f} | {rest[n]:>7.2f} {rest[n] - rest[n0]:>+6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
