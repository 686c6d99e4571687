"""Cost of the batched torch verification kernels (coupling.torch_backend) per call.

For V = 49152 (SmolLM2's vocabulary) and (B, k, gamma) in {(1, 1, 4), (1, 4, 4), (64, 4, 8)}
it times every rule of :data:`coupling.torch_backend.VERIFIERS` on realistic inputs:

* target logits z ~ N(0, 3^2) per (request, branch, position); draft logits z + N(0, 1)
  (a correlated but imperfect drafter); both softmaxed in float32;
* drafts sampled from the draft laws, i.i.d. across branches.

Baseline, in the same process: one float32 ``softmax`` over the ``[B, k, gamma+1, V]``
target logits, the unavoidable cost of producing the probabilities. Columns: median
milliseconds per call (``validate=False``, the engine's hot path, and ``validate=True``),
the ratio to the baseline, and the cost as a fraction of one target forward step of the
real LM (``--target-ms``, default 48 ms: SmolLM2-135M bfloat16 on this CPU costs about
45-52 ms per step; the LLM engineer measures it precisely). Rules that cannot run a
configuration say why (token/block are single-branch; optimal has no exact sampler for
k >= 2 at this vocabulary and raises ValueError).

Run: ``python benchmarks/bench_kernels.py`` (a few minutes on 2 shared cores);
``--quick`` for fewer repeats, ``--threads N`` to set torch's intra-op threads
(default: torch's default), ``--device cuda`` to add a CUDA run when available.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from coupling.torch_backend import VERIFIERS

V = 49152
CONFIGS = ((1, 1, 4), (1, 4, 4), (64, 4, 8))
SEED = 20240315


def make_inputs(B: int, k: int, g: int, device: str, gen: torch.Generator):
    z = torch.randn(B, k, g + 1, V, generator=gen) * 3.0
    zq = z[:, :, :g] + torch.randn(B, k, g, V, generator=gen)
    p = torch.softmax(z, -1)
    q = torch.softmax(zq, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(B, k, g)
    return z.to(device), drafts.to(device), p.to(device), q.to(device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_ms(fn, device: str, reps: int, min_time: float) -> float:
    fn()  # warm-up (and lazy init)
    sync(device)
    ts: list[float] = []
    t_end = time.perf_counter() + min_time
    while len(ts) < reps or (time.perf_counter() < t_end and len(ts) < 50 * reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)


def run(device: str, reps: int, min_time: float, target_ms: float) -> list[str]:
    gen = torch.Generator().manual_seed(SEED)
    lines = []
    hdr = (f"| B | k | gamma | rule | ms/call (validate=False) | x softmax | % of {target_ms:g} ms step "
           "| ms/call (validate=True) |")
    lines += [hdr, "|" + "---|" * 8]
    print("\n".join(lines), flush=True)
    for B, k, g in CONFIGS:
        logits, drafts, p, q = make_inputs(B, k, g, device, gen)
        seeds = torch.arange(B, device=device)
        pos = torch.full((B,), 100, device=device)
        base = median_ms(lambda: torch.softmax(logits, -1), device, reps, min_time)
        lines.append(f"| {B} | {k} | {g} | *baseline: float32 softmax over [B,k,gamma+1,V]* | "
                     f"{base:.3f} | 1.00 | {100 * base / target_ms:.2f}% | |")
        print(lines[-1], flush=True)
        for name, fn in VERIFIERS.items():
            def call(validate: bool, fn=fn):
                return fn(drafts, p, q, seeds=seeds, positions=pos, validate=validate)

            try:
                call(False)
            except ValueError as exc:
                why = str(exc).split(";")[0].split(":")[0][:90]
                lines.append(f"| {B} | {k} | {g} | {name} | n/a: ValueError ({why}) | | | |")
                print(lines[-1], flush=True)
                continue
            r = max(1, reps // (4 if B > 1 else 1))
            t = median_ms(lambda: call(False), device, r, min_time)
            tv = median_ms(lambda: call(True), device, r, min_time)
            lines.append(f"| {B} | {k} | {g} | {name} | {t:.3f} | {t / base:.1f} | "
                         f"{100 * t / target_ms:.2f}% | {tv:.3f} |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, or all (cpu and cuda if present)")
    ap.add_argument("--target-ms", type=float, default=48.0, help="target LM step in ms (CPU)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] if args.device == "cpu" else (
        ["cpu", "cuda"] if args.device == "all" else [args.device])
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    reps, min_time = (3, 0.2) if args.quick else (9, 1.0)
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, V = {V}")
    for d in devices:
        print(f"\n## device: {d}\n")
        run(d, reps, min_time, args.target_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
