"""Claim: for one draft (k = 1) the optimal acceptance is sum_x min(p_x, q_x) = 1 - TV(p, q),
and speculative sampling attains it.

Source: the coupling inequality / maximal coupling (Lindvall, "Lectures on the Coupling
Method", 1992, Thm I.5.2); for speculative decoding, Sun et al. 2023 (SpecTr, NeurIPS),
Section 3 (k = 1 case of the membership-cost OT).

Method:
1. Upper bound (symbolic, any V): for any coupling pi of (q, p),
   pi(x, x) <= min(sum_y pi(x, y), sum_z pi(z, x)) = min(q_x, p_x); summing over x gives
   P(Y = X) <= sum_x min(p_x, q_x). sympy checks the identity
   sum_x min(p_x, q_x) = 1 - (1/2) sum_x |p_x - q_x| per sign pattern for V = 2..5.
2. Attainment: the token joint has trace sum_x min (proofs/token_lossless.py).
3. Exhaustive exact check: every pair (p, q) on V = 3 with all probabilities multiples of
   1/6 (28 x 28 = 784 pairs): the LP optimum (coupling.solve_coupling, POT and
   HiGHS) equals sum min to 1e-12.

Status: verified.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction

import numpy as np
import sympy as sp


def symbolic() -> bool:
    ok = True
    for V in range(2, 6):
        p = list(sp.symbols(f"p0:{V}", real=True))
        q = list(sp.symbols(f"q0:{V}", real=True))
        p[-1], q[-1] = 1 - sum(p[:-1]), 1 - sum(q[:-1])
        for pat in itertools.product([True, False], repeat=V):
            mn = sum(q[i] if pat[i] else p[i] for i in range(V))
            ab = sum(p[i] - q[i] if pat[i] else q[i] - p[i] for i in range(V))
            ok &= sp.simplify(mn - (1 - ab / 2)) == 0
    return bool(ok)


def grid(V: int, N: int):
    for c in itertools.product(range(N + 1), repeat=V - 1):
        if sum(c) <= N:
            yield [Fraction(x, N) for x in c] + [Fraction(N - sum(c), N)]


def exhaustive() -> bool:
    from coupling import solve_coupling

    pts = list(grid(3, 6))
    worst = 0.0
    for pf in pts:
        for qf in pts:
            exact = sum(min(a, b) for a, b in zip(pf, qf, strict=True))
            p = np.array([float(x) for x in pf])
            q = np.array([float(x) for x in qf])
            for solver in ("pot", "highs"):
                lp = solve_coupling(p, q, 1, solver=solver).acceptance
                worst = max(worst, abs(lp - float(exact)))
    print(
        f"exhaustive: {len(pts) ** 2} pairs on the 1/6 grid (V=3), max |LP - sum min| = {worst:.2e}"
    )
    return worst < 1e-12


def main() -> int:
    s = symbolic()
    print("symbolic sum min = 1 - TV (V = 2..5, all sign patterns):", s)
    e = exhaustive()
    ok = s and e
    print("token_acceptance_optimal:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
