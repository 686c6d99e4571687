#!/usr/bin/env python
"""The optimal rule's exact sampler per call at full vocabulary, with fresh laws every call,
against one ``np.argsort`` of V float64 values in the same process.

Laws: ``p`` and ``q`` independent Dirichlet(0.05) draws over V tokens (``--laws dirichlet``,
the default: peaked, with thousands of tokens below 1e-30), or the softmax of N(0, 3^2) logits
with the draft perturbed by N(0, 1) in log space (``--laws softmax``). Each call brings a new
pair, as serving does (``--cases`` pairs, more than the rule's plan cache holds, and the cache
is cleared anyway), and ``k`` drafts drawn from ``q``.

Rows, medians over ``--repeats`` calls:

* ``argsort``: ``np.argsort`` of V random float64s (the baseline);
* ``RULES['optimal'].sample``: one exact verification of ``k`` i.i.d. drafts as a caller makes
  it (validation, the union support, the race through the min cut, and the residual draw
  when the race rejects: about 90% of calls with Dirichlet laws, whose acceptance is ~0.1);
* ``plan alone`` and ``+ residual``: the race's plan (ratio sort, cut, part B's join times and
  weights) and, in addition, both parts' exact loads and the residual law;
* minor page faults per call (``getrusage``): fresh memory that glibc maps in after returning
  a freed heap top to the system. ``--top-pad MB`` first asks glibc to keep that much freed
  heap mapped (``mallopt(M_TOP_PAD)``, what ``MALLOC_TOP_PAD_`` in a serving process's
  environment does): the faults' share of a call.

Then, on top-64 (k = 2) and top-16 (k = 3) supports, the race against the plan through the
cut (``Optimal(sampler="plan")``, which enumerates tuples, so only small supports fit).

Both clocks are printed: process CPU time and wall time; ratios are to the argsort in the
same process and clock.

Usage::

    python benchmarks/bench_optimal_sampler.py [--vocab 49152,262144] [--laws dirichlet]
                                               [--top-pad 256]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import resource
import statistics
import time

import numpy as np

from coupling import RULES
from coupling.rules import optimal as opt
from coupling.rules.optimal import Optimal, race_plan


def laws(rng: np.random.Generator, V: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind == "dirichlet":
        return rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))
    z = rng.normal(size=V) * 3.0
    p = np.exp(z - z.max())
    p /= p.sum()
    q = np.exp(np.log(p) + rng.normal(size=V))
    return p, q / q.sum()


def top(x: np.ndarray, m: int) -> np.ndarray:
    keep = np.argsort(-x)[:m]
    y = np.zeros_like(x)
    y[keep] = x[keep]
    return y / y.sum()


def timed(fn, calls: int) -> tuple[float, float, float]:
    """Median milliseconds per call ``(cpu, wall)`` and minor page faults per call; ``fn(i)``
    makes call ``i``."""
    cpu, wall = [], []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(calls):
        c0, w0 = time.process_time(), time.perf_counter()
        fn(i)
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return statistics.median(cpu), statistics.median(wall), faults / calls


def full_vocabulary(V: int, kind: str, repeats: int, cases: int,
                    rng: np.random.Generator) -> list[tuple[str, tuple]]:
    pairs = [laws(rng, V, kind) for _ in range(cases)]
    x = rng.random(V)
    rows = [(f"V={V} argsort of V float64", timed(lambda i: np.argsort(x), repeats))]
    rule = RULES["optimal"]
    for k in (2, 4, 8):
        drafts = [rng.choice(V, size=k, p=q) for _, q in pairs]

        def sample(i, k=k, drafts=drafts):
            opt.clear_plan_cache()
            p, q = pairs[i % cases]
            return rule.sample(p, q, drafts[i % cases], rng)

        rows.append((f"  k={k} RULES['optimal'].sample", timed(sample, repeats)))
        rows.append((f"  k={k} plan alone", timed(
            lambda i, k=k: race_plan(*pairs[i % cases], k), repeats)))
        rows.append((f"  k={k} plan + residual", timed(
            lambda i, k=k: race_plan(*pairs[i % cases], k).residual, repeats)))
    return rows


def small_supports(repeats: int, rng: np.random.Generator) -> list[tuple[str, tuple]]:
    rows = []
    p, q = laws(rng, 49152, "softmax")
    for k, m in ((2, 64), (3, 16)):
        pt, qt = top(p, m), top(q, m)
        d = rng.choice(pt.size, size=k, p=qt)
        u = rng.random(k + 1)
        for sampler in ("race", "plan"):
            rule = Optimal(sampler=sampler)

            def call(i, rule=rule, d=d, u=u, pt=pt, qt=qt):
                opt.clear_plan_cache()
                return rule.verify(pt, qt, d, u)

            rows.append((f"top-{m} supports k={k}: {sampler}", timed(call, repeats)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", default="49152,262144")
    ap.add_argument("--laws", choices=("dirichlet", "softmax"), default="dirichlet")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--top-pad", type=int, default=0, metavar="MB",
                    help="keep this much freed heap mapped (glibc mallopt(M_TOP_PAD))")
    args = ap.parse_args()
    if args.top_pad:
        M_TOP_PAD = -2                                   # glibc's malloc.h
        if not ctypes.CDLL("libc.so.6").mallopt(M_TOP_PAD, args.top_pad << 20):
            raise SystemExit("--top-pad: glibc's mallopt refused M_TOP_PAD")
    rng = np.random.default_rng(11)
    print(f"{platform.processor() or platform.machine()}, numpy {np.__version__}; {args.laws} "
          f"laws, fresh every call; median of {args.repeats} calls; ms per call "
          "(x the argsort of the same V, in the same clock); glibc top pad "
          f"{args.top_pad} MB")
    print(f"{'':38}{'CPU ms':>9}{'x':>7}{'wall ms':>10}{'x':>7}{'faults':>8}")
    for V in (int(v) for v in args.vocab.split(",")):
        rows = full_vocabulary(V, args.laws, args.repeats, args.cases, rng)
        base = rows[0][1]
        for name, (c, w, f) in rows:
            print(f"{name:38}{c:9.3f}{c / base[0]:7.1f}{w:10.3f}{w / base[1]:7.1f}{f:8.0f}")
    rows = small_supports(args.repeats, rng)
    print("\nsmall supports (a plan fits): ms per call, race against the plan")
    for name, (c, w, f) in rows:
        print(f"{name:38}{c:9.3f}{'':7}{w:10.3f}{'':7}{f:8.0f}")


if __name__ == "__main__":
    main()
