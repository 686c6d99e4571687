"""Cost of the batched torch verification kernels (coupling.torch_backend) per call.

For V = 49152 (SmolLM2's vocabulary) and (B, k, gamma) in {(1, 1, 4), (1, 4, 4), (64, 4, 8)}
it times every rule of :data:`coupling.torch_backend.VERIFIERS` on realistic inputs:

* target logits z ~ N(0, 3^2) per (request, branch, position); draft logits z + N(0, 1)
  (a correlated but imperfect drafter); both softmaxed in float32;
* drafts sampled from the draft laws, i.i.d. across branches; for ``gumbel`` the drafts are
  the drafter's side of the coupling, ``gumbel_draft(q, seed, position)``, so that its
  acceptance is the coupling's.

Baseline, in the same process: one float32 ``softmax`` over the ``[B, k, gamma+1, V]``
target logits, the unavoidable cost of producing the probabilities. Columns: median
milliseconds per call (``validate=False``, the engine's hot path, and ``validate=True``),
the ratio to the baseline, the mean accepted length of the timed instance (early exit
makes a call cheaper when it stops early), and the cost as a fraction of one target
forward step of the real LM (``--target-ms``, default 48 ms: the target model in bfloat16
on this CPU costs about 45-52 ms per step; docs/RESULTS.md (real LLM section) has the
measured value). Rules that cannot run a
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

from coupling.torch_backend import VERIFIERS, gumbel_draft, gumbel_noise

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


def pct(ms: float, B: int, target_ms: float) -> str:
    # the step time is for one request; a B = 64 step costs far more, so no percentage there
    return f"{100 * ms / target_ms:.2f}%" if B == 1 else "-"


def run(device: str, reps: int, min_time: float, target_ms: float, configs=CONFIGS) -> list[str]:
    gen = torch.Generator().manual_seed(SEED)
    lines = []
    hdr = (
        f"| B | k | gamma | rule | ms/call (validate=False) | x softmax "
        f"| % of {target_ms:g} ms step | mean accepted "
        "| ms/call (validate=True) |"
    )
    lines += [hdr, "|" + "---|" * 9]
    print("\n".join(lines), flush=True)
    for B, k, g in configs:
        logits, drafts, p, q = make_inputs(B, k, g, device, gen)
        seeds = torch.arange(B, device=device)
        pos = torch.full((B,), 100, device=device)
        base = median_ms(lambda z=logits: torch.softmax(z, -1), device, reps, min_time)
        lines.append(
            f"| {B} | {k} | {g} | *baseline: float32 softmax over [B,k,gamma+1,V]* | "
            f"{base:.3f} | 1.00 | {pct(base, B, target_ms)} | | |"
        )
        print(lines[-1], flush=True)
        for name, fn in VERIFIERS.items():
            d = drafts
            if name == "gumbel":  # shared-noise drafts: x_i = argmax(log q_i + G(seed, t + i))
                t_i = pos.view(B, 1, 1) + torch.arange(g, device=device).view(1, 1, g)
                d = gumbel_draft(q, seeds.view(B, 1, 1), t_i)

            def call(validate: bool, fn=fn, args=(d, p, q), s=seeds, t=pos):
                return fn(*args, seeds=s, positions=t, validate=validate)

            try:
                acc = float(call(False).accepted.double().mean())
            except ValueError as exc:
                why = str(exc).split(";")[0].split(":")[0][:90]
                lines.append(f"| {B} | {k} | {g} | {name} | n/a: ValueError ({why}) | | | | |")
                print(lines[-1], flush=True)
                continue
            r = max(1, reps // (4 if B > 1 else 1))
            t = median_ms(lambda: call(False), device, r, min_time)
            tv = median_ms(lambda: call(True), device, r, min_time)
            lines.append(
                f"| {B} | {k} | {g} | {name} | {t:.3f} | {t / base:.1f} | "
                f"{pct(t, B, target_ms)} | {acc:.2f} | {tv:.3f} |"
            )
            print(lines[-1], flush=True)
            if name == "gumbel":
                # the drafter hashed G(seed, t + i) for its g positions to draft at all; a
                # deployment hands those vectors on (noise=) and hashes the bonus position's
                t_all = pos.view(B, 1) + torch.arange(g + 1, device=device).view(1, g + 1)
                noise = gumbel_noise(seeds.view(B, 1), t_all, V, dtype=torch.float64,
                                     device=device)

                def shared(noise=noise, d=d, s=seeds, t=pos, fn=fn, g=g, p=p, q=q):
                    bonus = gumbel_noise(s, t + g, V, dtype=torch.float64, device=device)
                    noise[:, g] = bonus
                    return fn(d, p, q, seeds=s, positions=t, validate=False, noise=noise)

                ts = median_ms(shared, device, r, min_time)
                lines.append(
                    f"| {B} | {k} | {g} | gumbel, the drafter's noise passed on (bonus "
                    f"position hashed) | {ts:.3f} | {ts / base:.1f} | {pct(ts, B, target_ms)} "
                    f"| {acc:.2f} | |"
                )
                print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, or all (cpu and cuda if present)")
    ap.add_argument("--target-ms", type=float, default=48.0, help="target LM step in ms (CPU)")
    ap.add_argument(
        "--configs",
        default=None,
        help='subset of "B,k,gamma" triples separated by ";" (default: all three)',
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = (
        ["cpu"]
        if args.device == "cpu"
        else (["cpu", "cuda"] if args.device == "all" else [args.device])
    )
    devices = [d for d in devices if d == "cpu" or torch.cuda.is_available()]
    reps, min_time = (3, 0.2) if args.quick else (15, 2.0)
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, V = {V}")
    for d in devices:
        print(f"\n## device: {d}\n")
        configs = (
            CONFIGS
            if args.configs is None
            else tuple(tuple(int(v) for v in c.split(",")) for c in args.configs.split(";"))
        )
        run(d, reps, min_time, args.target_ms, configs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
