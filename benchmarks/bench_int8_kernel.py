#!/usr/bin/env python
"""The AVX2 int8 kernel (:mod:`coupling.llm.int8_kernel`) against torch's
``_weight_int8pack_mm`` (the baseline), both in this process, on the whole int8 target.

Two copies of the weight-only int8 target (``models.quantize_target_int8``), one built with
``COUPLING_INT8_KERNEL=torch`` and one with ``avx2`` (the same int8 weights), are timed on
``n`` new tokens at context 100 (``ab_common.TargetStep``: a forward, then the cache rolled
back), round by round, the order of the copies reversed every other round so that a machine
that speeds up or slows down does not favour one; each cell is the median over rounds of a
median of ``--repeats`` calls. Then a 100-token prefill of each. Printed: ms per call, the
ratio AVX2 / torch for the same ``n``, and each kernel's ``t(n) / t(1)`` (what a
verification call of ``n`` tokens costs in decoding calls).

Usage::

    python benchmarks/bench_int8_kernel.py --threads 2 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import TargetStep, int8_target

    from coupling.llm import int8_kernel

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sizes", type=str, default="1,2,3,5,9")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(n) for n in args.sizes.split(",")]

    targets = {kernel: int8_target(kernel) for kernel in ("torch", "avx2")}
    for kernel, target in targets.items():
        if target.lm_head.kernel != kernel:
            raise SystemExit(f"no {kernel} kernel here: {int8_kernel.status()}")
    steps = [(k, n, TargetStep(new=n, seed=n, model=m)) for k, m in targets.items() for n in sizes]
    cells: dict[tuple[str, int], list[float]] = {(k, n): [] for k, n, _ in steps}
    for r in range(args.rounds):
        for k, n, step in steps if r % 2 == 0 else reversed(steps):
            cells[(k, n)].append(statistics.median(step.time_ms() for _ in range(args.repeats)))
    ms = {key: statistics.median(v) for key, v in cells.items()}

    ids = torch.randint(0, targets["torch"].config.vocab_size, (1, 100),
                        generator=torch.Generator().manual_seed(0))
    prefill = {k: [] for k in targets}
    with torch.no_grad():
        for _ in range(3):
            for k, m in targets.items():
                t0 = time.perf_counter()
                m(ids)
                prefill[k].append(1e3 * (time.perf_counter() - t0))

    print(f"int8 target call, ms (median over {args.rounds} rounds of a median of "
          f"{args.repeats} calls; context 100; {args.threads} thread(s))")
    print(f"{'n new tokens':<14}{'torch':>9}{'AVX2':>9}{'AVX2/torch':>12}"
          f"{'torch t(n)/t(1)':>17}{'AVX2 t(n)/t(1)':>16}")
    for n in sizes:
        a, b = ms[("torch", n)], ms[("avx2", n)]
        print(f"{n:<14}{a:9.1f}{b:9.1f}{b / a:12.2f}{a / ms[('torch', sizes[0])]:17.2f}"
              f"{b / ms[('avx2', sizes[0])]:16.2f}")
    a, b = (statistics.median(prefill[k]) for k in ("torch", "avx2"))
    print(f"{'prefill 100':<14}{a:9.1f}{b:9.1f}{b / a:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
