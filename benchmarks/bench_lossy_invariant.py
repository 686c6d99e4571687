#!/usr/bin/env python
"""Exact acceptance on seeded laws: what the drafter-invariant rules cost, and what the lossy
rules buy with their distortion. No sampling: every number is a closed form or an LP.

1. Drafter invariance. ``strict`` (exact match), ``gumbel`` (k = 1) and ``gls`` (k drafts)
   keep the target's own stream under a seed; ``token`` (k = 1) and ``rrs`` (k drafts) do not,
   and the optimum (``optimal``, the LP of the i.i.d. draft law) bounds them all. Laws:
   Dirichlet pairs over V = 50 (concentrations 0.3, 1, 5) and softmax pairs over V = 49152
   (``q`` the target perturbed in log space). The script asserts gls >= strict on every row
   (proved for k = 1; verified, not proved, for k >= 2).
2. Lossy rules. ``typical`` (Medusa's defaults eps = 0.09, delta = 0.3) and ``relaxed``
   (top-10 within 0.6, greedy fallback): acceptance, exact distortion TV(output law, p), the
   lossless optimum and, on V = 6, the best acceptance any coupling reaches at the same
   distortion (``coupling.lp.solve.optimal_lossy_acceptance``: a lossy rule that stays below it
   spends its distortion badly). At V = 49152 the same closed forms.

Usage::

    python benchmarks/bench_lossy_invariant.py
"""

from __future__ import annotations

import numpy as np

from coupling import RULES, optimal_acceptance
from coupling.lp.solve import optimal_lossy_acceptance

SEED = 21


def softmax_pair(rng, V: int, scale: float, noise: float):
    z = rng.normal(size=V) * scale
    p = np.exp(z - z.max())
    p /= p.sum()
    q = np.exp(np.log(p) + noise * rng.normal(size=V))
    return p, q / q.sum()


def law_rows(rng):
    for conc in (0.3, 1.0, 5.0):
        yield f"Dir({conc}) V=50", rng.dirichlet(np.full(50, conc)), rng.dirichlet(np.full(50,
                                                                                        conc))
    for scale, noise in ((1.0, 0.5), (3.0, 1.0)):
        yield (f"softmax s={scale} V=49152", *softmax_pair(rng, 49152, scale, noise))


def invariance_table(rng) -> None:
    print("1. drafter-invariant rules against token / rrs and the optimum (i.i.d. drafts)")
    print(f"{'law':>24} {'k':>2} {'strict':>8} {'gumbel/gls':>11} {'token/rrs':>10} "
          f"{'optimum':>8}")
    for name, p, q in law_rows(rng):
        for k in (1, 2, 4):
            s = RULES["strict"].acceptance(p, q, k)
            g = RULES["gumbel" if k == 1 else "gls"].acceptance(p, q, k)
            t = RULES["token" if k == 1 else "rrs"].acceptance(p, q, k)
            o = optimal_acceptance(p, q, k)
            assert s <= g + 1e-12 and g <= o + 1e-9 and t <= o + 1e-9, (name, k)
            print(f"{name:>24} {k:>2} {s:8.4f} {g:11.4f} {t:10.4f} {o:8.4f}")
    print("   gls (gumbel at k = 1) >= strict on every row; both below the optimum\n")


def lossy_table(rng) -> None:
    print("2. lossy rules: acceptance bought with distortion (i.i.d. drafts)")
    print(f"{'law':>24} {'rule':>8} {'k':>2} {'accept':>7} {'TV(nu,p)':>9} {'lossless OPT':>13} "
          f"{'OPT at same TV':>15}")
    small = [(f"Dir(1.0) V=6 #{i}", rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6)))
             for i in range(3)]
    for name, p, q in small + list(law_rows(rng))[3:]:
        for rule in ("typical", "relaxed"):
            for k in (1, 2, 4):
                a = RULES[rule].acceptance(p, q, k)
                d = RULES[rule].distortion(p, q, k)
                o = optimal_acceptance(p, q, k)
                best = optimal_lossy_acceptance(p, q, k, distortion=d) if p.size <= 6 \
                    and k <= 2 else float("nan")
                assert not best < a - 1e-9, (name, rule, k)
                print(f"{name:>24} {rule:>8} {k:>2} {a:7.4f} {d:9.4f} {o:13.4f} {best:15.4f}")
    print("   OPT at same TV: the best acceptance of any coupling whose output law is within "
          "the rule's distortion of p (LP; nan where the LP is too large)")


def main() -> None:
    rng = np.random.default_rng(SEED)
    invariance_table(rng)
    lossy_table(rng)


if __name__ == "__main__":
    main()
