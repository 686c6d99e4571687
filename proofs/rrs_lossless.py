"""Claim: recursive rejection sampling (``rrs``) is lossless with and without replacement.

With replacement: drafts i.i.d. from q; step i tests x_i against the current target
r_{i-1} (r_0 = p) with proposal q, on rejection r_i = (r_{i-1} - q)_+ / Z_i.
Without replacement: drafts by successive sampling; step i uses the proposal
q_i = q with x_1..x_{i-1} removed and renormalised, r_i = (r_{i-1} - q_i)_+ / Z_i.
In both cases the output has law exactly p. (Dropping the renormalisation, i.e. testing
distinct drafts against q, is NOT lossless: the script also exhibits a counterexample.)

Source: Miao et al. 2024 (SpecInfer, multi-step speculative sampling); Yang et al. 2024
("Multi-candidate speculative decoding"); Jeon et al. 2024 ("Recursive speculative
decoding").

Method: exhaustive exact rational arithmetic (Fractions), independent of the package:
every pair (p, q) with V = 3 and probabilities multiples of 1/4 (15 x 15 pairs), k = 1..3
with replacement and k = 1..min(3, |supp q|) without, plus 40 random rational pairs with
V = 4, k = 2, 3: the output law, summed over all draft tuples and accept/reject branches,
equals p exactly. A numeric cross-check compares coupling.RULES["rrs"].joint on the same grid.

Status: verified (exhaustive exact arithmetic on the stated inputs).
"""

from __future__ import annotations

import itertools
import random
import sys
from fractions import Fraction as F

from _tuples import exact_tuple_law


def resid(r, qi):
    d = [max(a - b, F(0)) for a, b in zip(r, qi, strict=True)]
    z = sum(d)
    return [x / z for x in d] if z > 0 else r


def output_law(p, q, k, replacement, renormalise=True):
    V = len(p)
    out = [F(0)] * V
    for t, pr in exact_tuple_law(q, k, replacement).items():
        if pr == 0:
            continue
        r, qi, surv = list(p), list(q), pr
        for x in t:
            a = min(F(1), r[x] / qi[x]) if qi[x] > 0 else F(0)
            out[x] += surv * a
            surv *= 1 - a
            r = resid(r, qi)
            if not replacement and renormalise:
                qi = list(qi)
                qi[x] = F(0)
                z = sum(qi)
                qi = [v / z for v in qi] if z > 0 else qi
        for y in range(V):
            out[y] += surv * r[y]
    return out


def grid(V, N):
    for cc in itertools.product(range(N + 1), repeat=V - 1):
        if sum(cc) <= N:
            yield [F(x, N) for x in cc] + [F(N - sum(cc), N)]


def main() -> int:
    ok = True
    cases = [(p, q) for p in grid(3, 4) for q in grid(3, 4)]
    rnd = random.Random(1)
    for _ in range(40):
        a = [rnd.randint(0, 6) for _ in range(4)]
        b = [rnd.randint(1, 6) for _ in range(4)]
        if sum(a) == 0:
            continue
        cases.append(([F(x, sum(a)) for x in a], [F(x, sum(b)) for x in b]))
    n = 0
    for p, q in cases:
        nz = sum(1 for x in q if x > 0)
        for k in (1, 2, 3):
            for rep in (True, False):
                if not rep and k > nz:
                    continue
                if len(p) == 4 and k == 1:
                    continue
                if output_law(p, q, k, rep) != list(p):
                    print("FAILED", p, q, k, rep)
                    ok = False
                n += 1
    print(f"exact: {n} (p, q, k, mode) cases, output law == p exactly: {ok}")
    p, q = [F(4, 10), F(3, 10), F(2, 10), F(1, 10)], [F(1, 10), F(2, 10), F(3, 10), F(4, 10)]
    broken = output_law(p, q, 2, False, renormalise=False)
    print("counterexample without renormalisation:", [str(x) for x in broken], "!= p:", broken != p)
    ok &= broken != p
    try:
        import numpy as np

        from coupling import RULES

        worst = 0.0
        for pf, qf in cases[:225]:
            pa = np.array([float(x) for x in pf])
            qa = np.array([float(x) for x in qf])
            for k, rep in [(2, True), (3, True), (2, False)]:
                if not rep and np.count_nonzero(qa) < k:
                    continue
                J = RULES["rrs"].joint(pa, qa, k, replacement=rep)
                worst = max(worst, 0.5 * float(np.abs(J.sum(0) - pa).sum()))
        print(f"numeric cross-check of coupling.RULES['rrs'].joint: max TV = {worst:.2e}")
        ok &= worst < 1e-12
    except ImportError:
        print("coupling not importable: numeric cross-check skipped")
    print("rrs_lossless:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
