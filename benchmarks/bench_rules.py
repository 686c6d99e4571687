"""Acceptance and cost of every single-step rule, and of the exact optimum.

For V in {100, 5000, 49152} and k in {1, 2, 4, 8} on two realistic (p, q) families with a
fixed seed:

* ``gauss``: target logits z ~ N(0, 3^2) at temperature 1; draft logits z + N(0, 1)
  (a correlated but imperfect drafter), both softmaxed;
* ``zipf``: target p(rank r) ~ r^-1.1 over a random token order; the draft ranks the tokens
  by r * exp(N(0, 0.7^2)) (a multiplicatively noisy ranking) and puts q ~ rank^-1.0 on it.

Columns: acceptance (closed form), its ratio to the exact optimum (``optimal_acceptance``
for the same k and mode), closed-form time and sampler time per call (median of repeats),
all in the same process. The last table gives ``optimal_acceptance``'s cost as a ratio to
one ``np.argsort`` of V float64 values measured in the same process (the baseline).

Run: ``python benchmarks/bench_rules.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import sys
import time
from functools import partial

import numpy as np

from coupling import RULES, check_pair, optimal_acceptance
from coupling.lp.cut import scan

SEED = 20231023
VS = (100, 5000, 49152)
KS = (1, 2, 4, 8)


def gauss_pair(V: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    z = rng.normal(scale=3.0, size=V)
    p = np.exp(z - z.max())
    zq = z + rng.normal(size=V)
    q = np.exp(zq - zq.max())
    return p / p.sum(), q / q.sum()


def zipf_pair(V: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    perm = rng.permutation(V)
    r = np.arange(1, V + 1, dtype=float)
    p = np.empty(V)
    p[perm] = r**-1.1
    noisy = np.argsort(r * np.exp(rng.normal(scale=0.7, size=V)))  # draft's ranking of perm
    q = np.empty(V)
    q[perm[noisy]] = r**-1.0
    return p / p.sum(), q / q.sum()


def timeit(fn, min_time: float = 0.05, max_reps: int = 200) -> float:
    """Median seconds per call over repeats lasting about ``min_time``."""
    ts = []
    t_end = time.perf_counter() + min_time
    while len(ts) < 3 or (time.perf_counter() < t_end and len(ts) < max_reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def draft(q: np.ndarray, k: int, rep: bool, rng: np.random.Generator) -> np.ndarray:
    if rep:
        return rng.choice(q.size, size=k, p=q)
    with np.errstate(divide="ignore"):
        return np.argsort(-(np.log(q) + rng.gumbel(size=q.size)))[:k]


def main() -> int:
    rng = np.random.default_rng(SEED)
    rows = []
    cost_rows = []
    for fam, make in (("gauss", gauss_pair), ("zipf", zipf_pair)):
        for V in VS:
            p, q = make(V, rng)
            t_sort = timeit(partial(np.argsort, p))
            for rep in (True, False):
                for k in KS:
                    if not rep and k == 1:
                        continue
                    try:
                        t_opt = timeit(partial(optimal_acceptance, p, q, k, replacement=rep))
                        opt = optimal_acceptance(p, q, k, replacement=rep)
                        pa, qa = check_pair(p, q)
                        t_scan = timeit(partial(scan, pa, qa, k, rep))
                    except ValueError:
                        opt, t_opt, t_scan = float("nan"), float("nan"), float("nan")
                    t_val = timeit(partial(check_pair, p, q))
                    cost_rows.append(
                        (fam, V, k, "iid" if rep else "wor", opt, t_opt, t_scan, t_val, t_sort)
                    )
                    for name, rule in RULES.items():
                        if rule.unit != "token" or not rule.supports(k, rep):
                            continue
                        try:
                            a = rule.acceptance(p, q, k, replacement=rep)
                            t_a = timeit(
                                partial(rule.acceptance, p, q, k, replacement=rep), 0.02, 20
                            )
                        except ValueError:
                            a, t_a = float("nan"), float("nan")
                        d = draft(q, k, rep, rng)
                        try:
                            rule.sample(p, q, d, rng, replacement=rep)  # warm caches (LP plan)
                            t_s = timeit(
                                partial(rule.sample, p, q, d, rng, replacement=rep), 0.02, 50
                            )
                        except ValueError:
                            t_s = float("nan")
                        rows.append(
                            (fam, V, k, "iid" if rep else "wor", name, a, a / opt, t_a, t_s)
                        )
    print("## Acceptance and cost per rule (closed form; sampler per call)\n")
    print("| pair | V | k | drafts | rule | acceptance | / OPT | closed form (ms) | sample (ms) |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|")
    for fam, V, k, mode, name, a, r, ta, ts in rows:
        f = lambda x: "n/a" if x != x else f"{x * 1e3:.3f}"  # noqa: E731
        print(
            f"| {fam} | {V} | {k} | {mode} | {name} | "
            f"{'n/a' if a != a else f'{a:.4f}'} | {'n/a' if r != r else f'{r:.3f}'} | "
            f"{f(ta)} | {f(ts)} |"
        )
    print("\n## optimal_acceptance cost vs one np.argsort of V floats (same process)\n")
    print("`scan` is the prefix scan on validated arrays; `validate` is coupling.check_pair")
    print("(both inputs), which the public call adds.\n")
    print(
        "| pair | V | k | drafts | OPT | optimal_acceptance (ms) | scan (ms) | validate (ms) "
        "| argsort (ms) | call / argsort | scan / argsort |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for fam, V, k, mode, opt, t_opt, t_scan, t_val, t_sort in cost_rows:
        if t_opt != t_opt:
            print(
                f"| {fam} | {V} | {k} | {mode} | n/a (k >= 3 without replacement: enumeration "
                f"only) | | | {t_val * 1e3:.3f} | {t_sort * 1e3:.3f} | | |"
            )
            continue
        print(
            f"| {fam} | {V} | {k} | {mode} | {opt:.4f} | {t_opt * 1e3:.3f} | {t_scan * 1e3:.3f} | "
            f"{t_val * 1e3:.3f} | {t_sort * 1e3:.3f} | "
            f"{t_opt / t_sort:.1f}x | {t_scan / t_sort:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
