#!/usr/bin/env python
"""What bounds the AVX2 int8 kernel (:mod:`coupling.llm.int8_kernel`): memory or arithmetic?

A verification call of n tokens costs more than a decoding call mostly because the int8 kernel
takes longer for n rows of activations than for one. If the kernel were bound by streaming the
weights from memory, extra rows would ride along for free; if it is bound by the core's own
arithmetic (widening each int8 weight to float32, then one FMA per row), every extra row adds
its FMAs. This script tells the two apart on SmolLM2-135M's shapes (30 layers of q, k, v, o,
gate, up, down, then the 49152-token head: 211 products, 134 M weights), with random int8
weights and the shipped kernel, for 1, 2 and 3 rows:

* ``streamed``: the 211 products on their own weights, 134 MB that no cache holds, as in a
  target call;
* ``cached``: the same 211 products' worth of work (the same shapes and count) on one layer's
  weights used over and over (3.5 MB, held by the L3 cache; the head's share as repeats of the
  layer's largest product).

Round by round (the order of the cells rotated), each cell is the median over rounds. Printed:
ms per pass and each row count's cost over one row. Equal ``streamed`` and ``cached`` times
mean the memory stream is hidden behind the arithmetic, which then sets the price of every
extra row.

Usage::

    python benchmarks/bench_int8_bound.py --threads 2 --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import time

LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))
HEAD = (49152, 576)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm import int8_kernel

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=30)
    args = ap.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.layers < 1:
        ap.error("--threads, --rounds and --layers must be >= 1")
    int8_mm = int8_kernel.kernel()            # the product: (x [M, K], w [N, K], scale [N])
    if int8_mm is None:
        print(f"no AVX2 int8 kernel here: {int8_kernel.status()}")
        return 0
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)

    def weights(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen),
                torch.rand(n, generator=gen) / 64)

    streamed = [weights(*s) for _ in range(args.layers) for s in LAYER] + [weights(*HEAD)]
    one_layer = [weights(*s) for s in LAYER]
    # the head (49152 x 576) as the same number of weights in repeats of the 1536 x 576 product
    head_repeats = HEAD[0] // LAYER[4][0]
    cached = one_layer * args.layers + [one_layer[4]] * head_repeats
    xs = {m: {k: torch.randn(m, k, generator=gen) for k in (576, 1536)} for m in (1, 2, 3)}
    n_weights = sum(w.numel() for w, _ in streamed)

    def one_pass(products, m: int) -> float:
        x = xs[m]
        t0 = time.perf_counter()
        for w, s in products:
            int8_mm(x[w.shape[1]], w, s)
        return time.perf_counter() - t0

    cells = [(name, m) for name in ("streamed", "cached") for m in (1, 2, 3)]
    sets = {"streamed": streamed, "cached": cached}
    for name, m in cells:                                    # warm-up: pages, threads
        one_pass(sets[name], m)
    times: dict[tuple[str, int], list[float]] = {c: [] for c in cells}
    for r in range(args.rounds):
        for name, m in cells[r % len(cells):] + cells[: r % len(cells)]:
            times[(name, m)].append(one_pass(sets[name], m))
    ms = {c: 1e3 * statistics.median(v) for c, v in times.items()}
    print(f"AVX2 int8 kernel, {len(streamed)} products ({n_weights / 1e6:.0f} M int8 weights), "
          f"{args.threads} thread(s), median of {args.rounds} rounds")
    print(f"{'weights':<10}{'rows':>5}{'ms/pass':>9}{'vs 1 row':>10}{'GB/s':>7}")
    for name, m in cells:
        print(f"{name:<10}{m:>5}{ms[(name, m)]:>9.2f}{ms[(name, m)] / ms[(name, 1)]:>9.2f}x"
              f"{n_weights / ms[(name, m)] / 1e6:>7.1f}")
    for m in (1, 2, 3):
        print(f"{m} row(s): cached / streamed = {ms[('cached', m)] / ms[('streamed', m)]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
