#!/usr/bin/env python
"""Why a few-token target call costs more than a one-token call on some CPUs: the target's
projections alone, by kernel, as the number of rows (tokens scored) grows.

SmolLM2-135M has 30 layers of seven projections (q, k, v, o: 576 -> 576 / 192; gate, up:
576 -> 1536; down: 1536 -> 576). Each row below runs all 210 of them on M rows of random
activations, median of ``--repeats`` passes, and prints the time and its ratio to the same
kernel's one-row pass (the baseline, in the same process):

* ``float32`` and ``bf16``: ``torch.nn.functional.linear`` (MKL / oneDNN as torch picks);
* ``float32, MKL packed``: ``torch.ops.mkl._mkl_linear`` with the weight packed once for M
  rows (what inductor's freezing uses), to see whether per-call packing is the cost;
* ``bf16, int8 weights``: ``models.Int8Linear`` on torch's ``_weight_int8pack_mm`` (gpt-fast's
  weight-only int8 kernel);
* ``bf16, int8 weights, AVX2``: ``models.Int8Linear`` on :mod:`coupling.llm.int8_kernel` (the
  same int8 weights; what ``models.quantize_target_int8`` uses on an AVX2 CPU);
* ``dynamic int8 (fbgemm)``: ``torch.ao.quantization.quantize_dynamic`` (weights *and*
  activations int8), for its speed only: ``bench_target_quant.py --dynamic`` shows what it
  does to the model's laws.

Speculative decoding needs the ratio for M = gamma + 1 rows to stay near 1.

Usage::

    python benchmarks/bench_cpu_matmul.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576),
          (576, 1536)] * 30          # (out_features, in_features) of the 210 projections


def median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm import int8_kernel, models

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--rows", type=str, default="1,2,3,5,9")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=gen) * 0.02 for o, i in SHAPES]
    linears = []
    for w in weights:
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data = w
        linears.append(lin)

    def x_for(m: int, dtype):
        return {i: torch.randn(m, i, generator=gen).to(dtype) for i in (576, 1536)}

    def plain(dtype):
        ws = [w.to(dtype) for w in weights]

        def make(m):
            xs = x_for(m, dtype)
            return lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in ws]
        return make

    def mkl_packed(m):
        packed = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in weights]
        xs = x_for(m, torch.float32)
        return lambda: [torch.ops.mkl._mkl_linear(xs[w.shape[1]], p, w, None, m)
                        for p, w in zip(packed, weights, strict=True)]

    def int8_weights(kernel: str):
        os.environ[int8_kernel.ENV] = kernel
        layers = [models.Int8Linear(w.to(torch.bfloat16)) for w in weights]
        if layers[0].kernel != kernel:
            raise RuntimeError(f"the {kernel} kernel is unavailable: {int8_kernel.status()}")

        def make(m):
            xs = x_for(m, torch.bfloat16)
            return lambda: [q(xs[q.in_features]) for q in layers]
        return make

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # quantize_dynamic's deprecation notice
        dyn = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(*linears),
                                                     {torch.nn.Linear}, dtype=torch.qint8)

    def dynamic(m):
        xs = x_for(m, torch.float32)
        return lambda: [layer(xs[w.shape[1]]) for layer, w in zip(dyn, weights, strict=True)]

    kernels = {"float32": plain(torch.float32), "bf16": plain(torch.bfloat16),
               "float32, MKL packed": mkl_packed}
    for name, kernel in (("bf16, int8 weights", "torch"), ("bf16, int8 weights, AVX2", "avx2")):
        try:
            kernels[name] = int8_weights(kernel)
        except RuntimeError as exc:
            print(f"{name}: {exc}")
    kernels["dynamic int8 (fbgemm)"] = dynamic
    print(f"210 projections of SmolLM2-135M, median of {args.repeats} passes, "
          f"{args.threads} thread(s): ms (ratio to the same kernel's 1-row pass)")
    print(f"{'kernel':<24}" + "".join(f"{f'M={m}':>16}" for m in rows))
    with torch.no_grad():
        for name, make in kernels.items():
            try:
                ms = [median_ms(make(m), args.repeats) for m in rows]
            except (RuntimeError, AttributeError) as exc:   # a kernel this build lacks
                print(f"{name:<24}n/a: {type(exc).__name__}: {str(exc)[:60]}")
                continue
            print(f"{name:<24}" + "".join(f"{t:9.1f} ({t / ms[0]:.2f})" for t in ms),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
