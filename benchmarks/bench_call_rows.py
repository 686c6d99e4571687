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

``--activations float,int16`` builds one target per setting (``int16``: the ``w8a16`` target,
each product's input rows rounded to int16 and summed in integers, ``int8_kernel.int16_rows``)
and interleaves all their calls, so the two kernels are timed in the same minutes.

Usage::

    python benchmarks/bench_call_rows.py --threads 2
    python benchmarks/bench_call_rows.py --threads 2 --context 300 --rows 1,2,3,5
    python benchmarks/bench_call_rows.py --threads 2 --context 90 --activations float,int16
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
    ap.add_argument("--activations", type=str, default="float",
                    help="comma-separated: float (the int8 target), int16 (the w8a16 target)")
    args = ap.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    acts = args.activations.split(",")
    if args.threads < 1 or args.context < 1 or args.rounds < 2 or min(rows) < 1:
        ap.error("--threads, --context and every --rows entry must be >= 1, --rounds >= 2")
    if not set(acts) <= {"float", "int16"}:
        ap.error(f"--activations {args.activations}: use float and/or int16")
    torch.set_num_threads(args.threads)
    targets = {a: models.quantize_target_int8(models.load_target("bfloat16"), a) for a in acts}
    linears = {a: [m for m in t.modules() if isinstance(m, models.Int8Linear)]
               for a, t in targets.items()}
    kernels = {m.kernel for ms in linears.values() for m in ms}
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

    for ms in linears.values():
        for m in ms:
            m._avx2 = timed(m._avx2)
    # one cache per (target, row count), each holding the same random context (seed 0)
    cells = [(a, n) for a in acts for n in rows]
    steps = {(a, n): TargetStep(new=n, ctx=args.context, model=targets[a]) for a, n in cells}

    def call(cell: tuple[str, int]) -> tuple[float, float]:
        kernel_s[0] = 0.0
        ms = steps[cell].time_ms()
        return ms, 1e3 * kernel_s[0]

    for cell in cells:                                         # warm-up
        call(cell)
    total: dict[tuple[str, int], list[float]] = {c: [] for c in cells}
    kernel: dict[tuple[str, int], list[float]] = {c: [] for c in cells}
    for r in range(args.rounds):
        for cell in cells[r % len(cells):] + cells[: r % len(cells)]:
            ms, kernel_ms = call(cell)
            total[cell].append(ms)
            kernel[cell].append(kernel_ms)
    med = {c: statistics.median(total[c]) for c in cells}
    kmed = {c: statistics.median(kernel[c]) for c in cells}
    rest = {c: statistics.median([t - k for t, k in zip(total[c], kernel[c], strict=True)])
            for c in cells}
    n0, a0 = rows[0], acts[0]
    print(f"int8 targets (bf16 activations into the products, {len(linears[a0])} int8 products "
          f"a call), context {args.context}, {args.threads} thread(s), {args.rounds} rounds, "
          "ms per call")
    print(f"{'products':<9}{'rows':>4} {'p10':>7} {'p50':>7} {'p90':>7} {'vs ' + str(n0):>7} "
          f"{'vs ' + a0:>9} | {'kernel':>7} {'+':>6} | {'rest':>7} {'+':>6}")
    for a, n in cells:
        c, c0 = (a, n), (a, n0)
        print(f"{a:<9}{n:>4} {percentile(total[c], 10):>7.2f} {med[c]:>7.2f} "
              f"{percentile(total[c], 90):>7.2f} {med[c] / med[c0]:>6.3f}x "
              f"{med[c] / med[(a0, n)]:>8.3f}x | {kmed[c]:>7.2f} {kmed[c] - kmed[c0]:>+6.2f} | "
              f"{rest[c]:>7.2f} {rest[c] - rest[c0]:>+6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
