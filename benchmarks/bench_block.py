"""Block vs token verification: exact gains over random models, optimality gaps, enumeration cost.

Every number is exact (enumeration of all V**gamma draft blocks), not sampled. The baseline
is token verification on the same model pair, in the same process.

1. Gain: tokens per target call (E[tau] + 1) of block verification divided by token
   verification's, over random TabularLM pairs (context order 1, independent Dirichlet
   tables for target and draft), by vocabulary size V, block length gamma and Dirichlet
   concentration: mean and quantiles of the ratio, and the mean tokens per call of each;
   also the drafter-invariant Gumbel rule relative to token verification (<= 1 always).
2. Bounds (tiny V, gamma): the full-information lossless-verifier LP optimum divided by block
   verification's (expected 1: block is optimal), and the block transport bound
   max E[LCP] + 1 divided by block's (a relaxation no lossless verifier reaches).
3. Cost: wall time (best of 3) of the exact enumeration per model pair and per draft path, by V and
   gamma, for block and token (ratio block/token).

    .venv/bin/python benchmarks/bench_block.py [--models N] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from coupling import (
    TabularLM,
    block_efficiency,
    full_information_accepted,
    optimal_block_efficiency,
)


def models(V: int, gamma: int, conc: float, n: int, order: int = 1):
    for s in range(n):
        seed = 100_000 * V + 1000 * gamma + s
        yield (
            TabularLM(V, order, seed=seed, concentration=conc),
            TabularLM(V, order, seed=seed + 500_000, concentration=conc),
        )


def gain_table(n: int, quick: bool) -> None:
    Vs = (2, 4, 8) if not quick else (2, 4)
    gammas = (1, 2, 3, 4) if not quick else (1, 2, 3)
    concs = (0.3, 1.0, 3.0)
    print("## 1. Block / token tokens per call (exact), random TabularLM pairs, context order 1\n")
    print(f"{n} model pairs per row.\n")
    print(
        "| V | gamma | concentration | token tok/call | block tok/call "
        "| ratio mean | p10 | p50 | p90 | max "
        "| gumbel / token mean |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for V in Vs:
        for g in gammas:
            if V**g > 4096:
                continue
            for conc in concs:
                tok, blk, gum = [], [], []
                for t, d in models(V, g, conc, n):
                    tok.append(block_efficiency("token", t, d, g))
                    blk.append(block_efficiency("block", t, d, g))
                    gum.append(block_efficiency("gumbel", t, d, g))
                r = np.array(blk) / np.array(tok)
                q10, q50, q90 = np.quantile(r, [0.1, 0.5, 0.9])
                print(
                    f"| {V} | {g} | {conc:g} | {np.mean(tok):.4f} | {np.mean(blk):.4f} "
                    f"| {r.mean():.4f} "
                    f"| {q10:.4f} | {q50:.4f} | {q90:.4f} | {r.max():.4f} "
                    f"| {np.mean(np.array(gum) / np.array(tok)):.4f} |"
                )
    print()


def bounds_table(n: int) -> None:
    print(
        "## 2. Optimality: full-information LP and transport bound relative to block (exact LPs)\n"
    )
    print(
        "| V | gamma | concentration | block tok/call | full-info LP / block (max abs dev) "
        "| transport / block mean | transport / block max |"
    )
    print("|---|---|---|---|---|---|---|")
    for V, g in ((2, 2), (2, 3), (3, 2), (3, 3)):
        for conc in (0.3, 1.0, 3.0):
            blk, dev, lcp = [], [], []
            for t, d in models(V, g, conc, n):
                b = block_efficiency("block", t, d, g)
                blk.append(b)
                dev.append(abs(full_information_accepted(t, d, g) + 1 - b))
                lcp.append(optimal_block_efficiency(t, d, g) / b)
            print(
                f"| {V} | {g} | {conc:g} | {np.mean(blk):.4f} | 1 ({max(dev):.1e}) "
                f"| {np.mean(lcp):.4f} | {np.max(lcp):.4f} |"
            )
    print()


def cost_table(quick: bool) -> None:
    print("## 3. Cost of the exact enumeration (one model pair, context order 2, V**gamma paths)\n")
    print("| V | gamma | paths | block [s] | block [us/path] | block / token time |")
    print("|---|---|---|---|---|---|")
    grid = [(2, 4), (2, 8), (2, 12), (4, 4), (4, 6), (8, 3), (8, 4), (16, 3), (32, 2), (64, 2)]
    if quick:
        grid = [c for c in grid if c[0] ** c[1] <= 4096]
    for V, g in grid:
        t, d = TabularLM(V, 2, seed=1), TabularLM(V, 2, seed=2)
        times = {}
        for rule in ("token", "block"):
            best = float("inf")
            for _ in range(3):  # best of 3: the first call also pays imports and warm-up
                t0 = time.perf_counter()
                block_efficiency(rule, t, d, g)
                best = min(best, time.perf_counter() - t0)
            times[rule] = best
        paths = V**g
        print(
            f"| {V} | {g} | {paths} | {times['block']:.3f} | {1e6 * times['block'] / paths:.1f} "
            f"| {times['block'] / times['token']:.2f} |"
        )
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", type=int, default=20, help="model pairs per row (default 20)")
    ap.add_argument("--quick", action="store_true", help="smaller grid")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gain_table(args.models, args.quick)
    bounds_table(min(args.models, 10))
    cost_table(args.quick)
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
