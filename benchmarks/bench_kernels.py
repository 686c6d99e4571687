"""Cost of the batched torch verification kernels (coupling.torch_backend) per call.

For V = 49152 (SmolLM2's vocabulary) and (B, k, gamma) in {(1, 1, 4), (1, 4, 4), (64, 4, 8)}
it times every rule's batched twin (``coupling.RULES[name].torch.verify``) on realistic inputs:

* target logits z ~ N(0, 3^2) per (request, branch, position); draft logits z + N(0, 1)
  (a correlated but imperfect drafter); both softmaxed in float32;
* drafts sampled from the draft laws, i.i.d. across branches; for ``gumbel`` the drafts are
  the drafter's side of the coupling, ``coupling.rules.gumbel.torch.draft(q, seed,
  position)``, so that its acceptance is the coupling's.

Baseline, in the same process: one float32 ``softmax`` over the ``[B, k, gamma+1, V]``
target logits, the unavoidable cost of producing the probabilities. Columns: median
milliseconds per call (``validate=False``, the engine's hot path, and ``validate=True``),
the ratio to the baseline, the mean accepted length of the timed instance (early exit
makes a call cheaper when it stops early), and, for B = 1, the cost as a fraction of one
decoding step of the real target (SmolLM2-135M, bf16, one token at context 100), timed in
this process just before and after the row's kernel calls (``ab_common.TargetStep``): on
a shared CPU both move by 1.5-4x between phases, so a step cost from another run would
make the percentage meaningless (``--target-ms`` fixes it instead). Rules that cannot run a
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

from coupling import RULES
from coupling.rules.gumbel.torch import draft as gumbel_draft
from coupling.torch_backend import gumbel_noise

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


class Step:
    """The target step the percentages divide by: timed in this process around each row's
    kernel calls (``ab_common.TargetStep``: on a CPU a one-token decoding step, for B = 1 rows only;
    on CUDA the ``[B k, gamma + 1]`` verification call of the row's tree), or a fixed
    ``--target-ms``."""

    def __init__(self, fixed_ms: float | None, device: str, B: int, k: int, g: int):
        self.fixed = fixed_ms
        self.timer = None
        self.applies = device != "cpu" or B == 1
        if fixed_ms is None and self.applies:
            from ab_common import TargetStep

            self.timer = (TargetStep("cpu") if device == "cpu"
                          else TargetStep(device, batch=B * k, new=g + 1))
        self.row: list[float] = []

    def tick(self) -> None:
        if self.timer is not None:
            self.row.append(self.timer.time_ms())

    def take(self) -> float | None:
        """The median step over the row just timed (and start a new row); None where no
        percentage applies."""
        if not self.applies:
            return None
        ms = self.fixed if self.timer is None else statistics.median(self.row)
        self.row = []
        return ms


def median_ms(fn, device: str, reps: int, min_time: float, step: Step | None = None) -> float:
    """Median ms of ``fn`` called back to back; with ``step``, three target steps are timed
    before and after (the same phase of the machine, but not between the calls: a step
    between two calls evicts their inputs from the caches, which in the engine the softmax
    that makes ``p`` has just written)."""
    for _ in range(3 if step is not None else 0):
        step.tick()
    fn()  # warm-up (and lazy init)
    sync(device)
    ts: list[float] = []
    t_end = time.perf_counter() + min_time
    while len(ts) < reps or (time.perf_counter() < t_end and len(ts) < 50 * reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    for _ in range(3 if step is not None else 0):
        step.tick()
    return 1e3 * statistics.median(ts)


def pct(ms: float, step_ms: float | None) -> str:
    return "-" if step_ms is None else f"{100 * ms / step_ms:.2f}%"


def fmt_step(step_ms: float | None) -> str:
    return "-" if step_ms is None else f"{step_ms:.1f}"


def run(device: str, reps: int, min_time: float, target_ms: float | None,
        configs=CONFIGS) -> list[str]:
    gen = torch.Generator().manual_seed(SEED)
    lines = []
    hdr = (
        "| B | k | gamma | rule | ms/call (validate=False) | x softmax "
        "| target step, ms | % of step | mean accepted "
        "| ms/call (validate=True) |"
    )
    lines += [hdr, "|" + "---|" * 10]
    print("\n".join(lines), flush=True)
    for B, k, g in configs:
        logits, drafts, p, q = make_inputs(B, k, g, device, gen)
        seeds = torch.arange(B, device=device)
        pos = torch.full((B,), 100, device=device)
        # a CPU step is one request's: a B = 64 step costs far more, so no percentage there
        step = Step(target_ms, device, B, k, g)
        on_step = step if step.applies else None
        base = median_ms(lambda z=logits: torch.softmax(z, -1), device, reps, min_time, on_step)
        st = step.take()
        lines.append(
            f"| {B} | {k} | {g} | *baseline: float32 softmax over [B,k,gamma+1,V]* | "
            f"{base:.3f} | 1.00 | {fmt_step(st)} | {pct(base, st)} | | |"
        )
        print(lines[-1], flush=True)
        for name, rule in RULES.items():
            fn = rule.torch.verify
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
                lines.append(f"| {B} | {k} | {g} | {name} | n/a: ValueError ({why}) | | | | | |")
                print(lines[-1], flush=True)
                continue
            r = max(1, reps // (4 if B > 1 else 1))
            t = median_ms(lambda: call(False), device, r, min_time, on_step)
            st = step.take()
            tv = median_ms(lambda: call(True), device, r, min_time)
            lines.append(
                f"| {B} | {k} | {g} | {name} | {t:.3f} | {t / base:.1f} | "
                f"{fmt_step(st)} | {pct(t, st)} | {acc:.2f} | {tv:.3f} |"
            )
            print(lines[-1], flush=True)
            if name == "gumbel":
                # the drafter hashed G(seed, t + i) for its g positions to draft at all and
                # hands them on (noise=); the call hashes the bonus position's where reached
                t_all = pos.view(B, 1) + torch.arange(g, device=device).view(1, g)
                noise = gumbel_noise(seeds.view(B, 1), t_all, V, dtype=torch.float64,
                                     device=device)

                def shared(noise=noise, d=d, s=seeds, t=pos, fn=fn, p=p, q=q):
                    return fn(d, p, q, seeds=s, positions=t, validate=False, noise=noise)

                ts = median_ms(shared, device, r, min_time, on_step)
                st = step.take()
                lines.append(
                    f"| {B} | {k} | {g} | gumbel, the drafter's noise passed on (the bonus "
                    f"position's hashed if reached) | {ts:.3f} | {ts / base:.1f} | "
                    f"{fmt_step(st)} | {pct(ts, st)} | {acc:.2f} | |"
                )
                print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, or all (cpu and cuda if present)")
    ap.add_argument("--target-ms", type=float, default=None,
                    help="a fixed target step in ms for the percentages (default: time the "
                    "real target's step in this process, interleaved with the kernel calls)")
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
