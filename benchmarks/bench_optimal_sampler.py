#!/usr/bin/env python
"""The optimal rule's exact samplers per call at V = 49152: the race through the min cut
(:mod:`coupling.rules.optimal.race`, i.i.d. drafts, k = 2, 4, 8) against one ``np.argsort`` of
V float64s, and against the k = 2 plan through the cut (:class:`coupling.rules.optimal.CutPlan`)
on the supports it can take, all in one process.

Laws: target ``softmax(N(0, s^2))`` over V = 49152 tokens, draft the target perturbed by N(0, 1)
in log space; ``s = 2.5`` puts about 10^4 tokens in the min cut. Full supports (where the k = 2
plan cannot run: its pair sets grow as U^2) and top-m truncations of the same laws (where it
can). Every call builds a fresh plan (on real text every call brings new laws).

Rows, each timed as a median of ``--repeats`` blocks of 4 calls:

* ``argsort``: ``np.argsort`` of V random float64s (the baseline);
* ``race, plan + verify``: the race's plan (ratio sort, cut, both parts' join times and weights)
  and one verification (what a call pays when it does not reject);
* ``race, + residual``: also the exact loads and the residual law (what a rejected call adds);
* ``rule.verify``: ``RULES["optimal"].verify`` as a caller makes it (validation, the support,
  the plan cache cleared first);
* top-64 (k = 2) and top-16 (k = 3) supports: the race and the cut plan
  (``Optimal(sampler="plan")``: with three drafts it enumerates the tuples, so only small
  supports fit).

Both clocks are printed: process CPU time (what the machine's other jobs do not inflate) and
wall time. Ratios are to the argsort in the same process and the same clock.

Usage::

    python benchmarks/bench_optimal_sampler.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

from coupling import RULES
from coupling.rules import optimal as opt
from coupling.rules.optimal import Optimal, race_plan

V = 49152


def laws(rng: np.random.Generator, scale: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    z = rng.normal(size=V) * scale
    p = np.exp(z - z.max())
    p /= p.sum()
    q = np.exp(np.log(p) + rng.normal(size=V))
    return p, q / q.sum()


def top(x: np.ndarray, m: int = 64) -> np.ndarray:
    keep = np.argsort(-x)[:m]
    y = np.zeros_like(x)
    y[keep] = x[keep]
    return y / y.sum()


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median milliseconds per call, ``(cpu, wall)``."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(4):
            fn()
        cpu.append((time.process_time() - c0) / 4 * 1e3)
        wall.append((time.perf_counter() - w0) / 4 * 1e3)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(11)
    p, q = laws(rng)
    x = rng.random(V)
    print(f"V = {V}, {platform.processor() or platform.machine()}, numpy {np.__version__}; "
          f"median of {args.repeats} x 4 calls; ms per call (x argsort in the same clock)")
    base = timed(lambda: np.argsort(x), args.repeats)
    rows = [("argsort of V float64", base)]
    for k in (2, 4, 8):
        d = rng.choice(V, size=k, p=q)
        u = rng.random(k + 1)
        rows.append((f"race k={k}: plan + verify",
                     timed(lambda d=d, u=u, k=k: race_plan(p, q, k).verify(d, u), args.repeats)))
        rows.append((f"race k={k}: + residual",
                     timed(lambda k=k: race_plan(p, q, k).residual, args.repeats)))

        def rule_call(d=d, u=u):
            opt.clear_plan_cache()
            return RULES["optimal"].verify(p, q, d, u)

        rows.append((f"RULES['optimal'].verify k={k}", timed(rule_call, args.repeats)))
    for k, m in ((2, 64), (3, 16)):
        pt, qt = top(p, m), top(q, m)
        d = rng.choice(V, size=k, p=qt)
        u = rng.random(k + 1)
        for sampler in ("race", "plan"):
            rule = Optimal(sampler=sampler)

            def call(rule=rule, d=d, u=u, pt=pt, qt=qt):
                opt.clear_plan_cache()
                return rule.verify(pt, qt, d, u)

            rows.append((f"top-{m} supports k={k}: {sampler}", timed(call, args.repeats)))
    print(f"{'':38}{'CPU ms':>9}{'x':>7}{'wall ms':>10}{'x':>7}")
    for name, (c, w) in rows:
        print(f"{name:38}{c:9.3f}{c / base[0]:7.1f}{w:10.3f}{w / base[1]:7.1f}")


if __name__ == "__main__":
    main()
