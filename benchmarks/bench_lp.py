"""LP oracle: run time of each exact solver at the target sizes.

Targets (issue 2): with the default solver ("pot"), k=1 up to V=5000, k=2 up to V=200,
k=3 up to V=30, each within about 10 s. HiGHS and cvxpy are cross-checks at small V;
their times are printed as ratios to POT's on the same instance, in the same process.

    .venv/bin/python benchmarks/bench_lp.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from coupling import optimal_acceptance, solve_coupling, tv


def realistic_pair(V: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Softmax of correlated Gaussian logits: the draft is a noisy copy of the target."""
    logits = rng.normal(size=V) * 2.0
    p = np.exp(logits - logits.max())
    q = np.exp(logits + rng.normal(size=V) * 0.8 - logits.max())
    return p / p.sum(), q / q.sum()


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    solve_coupling([0.5, 0.5], [0.5, 0.5], 1, solver="pot")  # keep POT's import out of the timings
    cases = [(1, 100), (1, 1000), (1, 5000), (2, 50), (2, 100), (2, 200), (3, 10), (3, 20), (3, 30)]
    cross = {(1, 100), (1, 1000), (2, 50), (2, 100), (3, 10), (3, 20)}
    if args.quick:
        cases = [c for c in cases if c[1] <= 100]
    header = ("k", "V", "pot [s]", "highs/pot", "cvxpy/pot", "acceptance", "max |diff|")
    widths = (2, 5, 9, 10, 10, 14, 11)
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    print("(max |diff|: spread of the acceptance over the solvers run, the min-cut scan,")
    print(" and 1 - TV at k = 1)")
    for k, V in cases:
        p, q = realistic_pair(V, rng)
        ref, t_pot = timed(solve_coupling, p, q, k, solver="pot")
        ratios, accs = {}, [ref.acceptance]
        for solver in ("highs", "cvxpy"):
            if (k, V) in cross:
                c, t = timed(solve_coupling, p, q, k, solver=solver)
                ratios[solver] = f"{t / t_pot:10.3f}"
                accs.append(c.acceptance)
            else:
                ratios[solver] = f"{'-':>10}"
        accs.append(optimal_acceptance(p, q, k))  # closed-form min-cut scan
        if k == 1:
            accs.append(1 - tv(p, q))
        print(
            f"{k:>2} {V:>5} {t_pot:9.3f} {ratios['highs']} {ratios['cvxpy']} "
            f"{ref.acceptance:14.10f} {max(accs) - min(accs):11.2e}"
        )


if __name__ == "__main__":
    main()
