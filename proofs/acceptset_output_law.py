"""Claim (accept-set rules, ``coupling.rules.acceptset``: the LOSSY ``typical`` and
``relaxed``): a rule that outputs the acceptable draft of highest p (set A, ties by lower id)
and otherwise a draw from a fallback law f has, for k drafts,

    output law  nu = sum_j (h_j - h_{j-1}) delta_{a_j} + (1 - h_|A|) f,
    acceptance  h_|A| + sum_{y not in A} f(y) P(no draft in A, y drafted),

with a_1, a_2, ... the acceptable tokens by priority and h_j = P(some draft in a_1..a_j)
(= 1 - (1 - q(a_1..a_j))^k for i.i.d. drafts); its distortion is TV(nu, p).

Source: derived here (coupling/rules/acceptset.py).

Method: exact rational arithmetic. For every law pair over V = 3 with probabilities multiples
of 1/4, every acceptable set A and two fallback laws (the argmax, and p restricted to A^c or
p itself), k = 1..3, i.i.d. and distinct drafts, the closed forms (h by the formula, or by the
exact law of the first acceptable rank without replacement) equal the law and acceptance
enumerated draft tuple by draft tuple, exactly; the package's float64 output laws of typical
and relaxed equal the exact ones to 1e-15. Negative control: the first acceptable draft (not
the likeliest) gives another law, which the same comparison must reject.

Status: checked exhaustively in exact arithmetic on the stated grid.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction as F

import numpy as np
from _tuples import exact_tuple_law, rational_grid

from coupling import RULES


def tuple_law(q: list[F], k: int, replacement: bool):
    return ((t, w) for t, w in exact_tuple_law(q, k, replacement).items() if w)


def enumerated(p, q, k, rep, accept, f, *, first: bool = False):
    V = len(p)
    nu, acc = [F(0)] * V, F(0)
    for t, w in tuple_law(q, k, rep):
        ok = [x for x in t if accept[x]]
        if ok:
            y = ok[0] if first else min(ok, key=lambda x: (-p[x], x))
            nu[y] += w
            acc += w
        else:
            for y in range(V):
                nu[y] += w * f[y]
                acc += w * f[y] * (y in t)
    return nu, acc


def closed(p, q, k, rep, accept, f):
    V = len(p)
    chain = sorted((x for x in range(V) if accept[x]), key=lambda x: (-p[x], x))
    h = [F(0)]
    for j in range(1, len(chain) + 1):
        S = set(chain[:j])
        h.append(1 - (1 - sum(q[x] for x in S)) ** k if rep else
                 sum(w for t, w in tuple_law(q, k, False) if S & set(t)))
    nu = [(1 - h[-1]) * f[y] for y in range(V)]
    for j, a in enumerate(chain):
        nu[a] += h[j + 1] - h[j]
    A = set(chain)
    extra = sum(w * sum(f[y] for y in set(t)) for t, w in tuple_law(q, k, rep)
                if not A & set(t))
    return nu, h[-1] + extra


def main() -> int:
    ok, n, caught = True, 0, 0
    pts = list(rational_grid(3, 4))
    for p in pts:
        for q in pts:
            top = max(range(3), key=lambda x: (p[x], -x))
            for mask in itertools.product([False, True], repeat=3):
                accept = [m and p[x] > 0 for x, m in enumerate(mask)]
                for f in ([F(int(x == top)) for x in range(3)], p):
                    for k, rep in ((1, True), (2, True), (3, True), (2, False)):
                        if not rep and sum(x > 0 for x in q) < k:
                            continue
                        want = enumerated(p, q, k, rep, accept, f)
                        ok &= closed(p, q, k, rep, accept, f) == want
                        caught += enumerated(p, q, k, rep, accept, f, first=True)[0] != want[0]
                        n += 1
    print(f"closed-form output law and acceptance == enumeration, exactly: {n} cases")
    print(f"negative control (first acceptable draft) differs on {caught} cases (must be > 0)")
    ok &= caught > 0
    worst = 0.0
    for p in pts:
        for q in pts:
            pf, qf = np.array(p, dtype=float), np.array(q, dtype=float)
            for name in ("typical", "relaxed"):
                rule = RULES[name]
                accept = rule.accept_set(pf) & (pf > 0)
                f = [F(float(x)) for x in rule.fallback_law(pf)]
                for k in (1, 2, 3):
                    nu, _ = enumerated(p, q, k, True, accept.tolist(), f)
                    got = rule.output_law(pf, qf, k)
                    worst = max(worst, max(abs(float(a) - b) for a, b in zip(nu, got,
                                                                             strict=True)))
    print(f"typical and relaxed: float64 output laws vs exact: max error {worst:.1e}")
    ok &= worst < 1e-15
    print("acceptset_output_law:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
