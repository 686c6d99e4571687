"""Claim (Gumbel-max list sampling, ``coupling.rules.gls``): with ``K`` shared Gumbel columns,
drafts X_c = argmax(log q + G_c) and output Y = argmax(log p + max_c G_c), when the drafts of
``m <= K`` of the columns are seen,

(a) the package's exact joint law of (the m seen drafts, Y) has column sums p and row sums the
    i.i.d. law of m drafts, exactly (lossless; the exponential-race derivation is right);
(b) its collision probability P(Y among the seen drafts), the package's closed form, equals the
    joint's trace exactly;
(c) K = m = 1 is the Gumbel coupling's collision law, 1 / sum_j max(p_j/p_i, q_j/q_i), exactly;
(d) list matching: the collision probability of K drafts is at least
    sum_i K p_i / (K + phi(r_i)) (the winning column's own draft), which is at least
    sum_i (1/p_i + 1/(K q_i))^-1 (phi(r_i) <= r_i), exactly;
(e) the package's float64 laws (closed forms and quadrature) agree with the exact values.

Source: Rowan, Phan, Khisti, arXiv 2506.05632 (the construction; the paper's body, and so its
list matching lemma's exact statement, is not in the reference store); every formula here is
derived in coupling/rules/gls/laws.py.

Method: exact rational arithmetic (Fractions, through the package's own exponential-sum code,
which is exact on Fraction laws) on every pair of laws over V = 3 with probabilities multiples
of 1/4 and 40 random rational pairs over V = 4, K = 1..3 and every m <= K; symbolic (sympy)
for the two elementary facts the derivation rests on: int_0^oo e^{-st} e^{-lt} dt = 1/(s + l)
and the maximum of K i.i.d. standard Gumbels is a standard Gumbel shifted by log K. A negative
control (the winning column treated as any other) must break (a).

Status: checked exhaustively in exact arithmetic on the stated grids; (d)'s first inequality
is immediate (a sub-event), its second is proved by phi(r_i) <= r_i.
"""

from __future__ import annotations

import itertools
import random
import sys
from fractions import Fraction as F

import numpy as np
import sympy as sp
from _tuples import rational_grid

from coupling.rules.gls import acceptance, laws
from coupling.rules.gumbel import match


def symbolic() -> bool:
    t, s, lam, x = sp.symbols("t s lambda x", positive=True)
    K = sp.symbols("K", positive=True, integer=True)
    ok = sp.simplify(sp.integrate(sp.exp(-s * t) * sp.exp(-lam * t), (t, 0, sp.oo))
                     - 1 / (s + lam)) == 0
    # P(max of K standard Gumbels <= x) = exp(-e^{-x})^K = exp(-e^{-(x - log K)})
    ok &= sp.simplify(sp.exp(-sp.exp(-x)) ** K - sp.exp(-sp.exp(-(x - sp.log(K))))) == 0
    return bool(ok)


def tuples(V: int, m: int) -> np.ndarray:
    return np.array(list(itertools.product(range(V), repeat=m)), dtype=np.int64)


def exact_case(p: np.ndarray, q: np.ndarray, K: int, m: int, *, broken: bool = False) -> bool:
    V = p.size
    tup = tuples(V, m)
    J = _broken_joint(p, q, tup, K) if broken else laws.joint(p, q, tup, K)
    rows = np.array([np.prod([q[x] for x in t]) for t in tup], dtype=object)
    if not (all(J.sum(axis=0) == p) and all(J.sum(axis=1) == rows)):
        return False
    if broken:
        return True
    coll = laws.collision(p, q, m, K, method="exact")
    trace = sum(J[i, y] for i, t in enumerate(tup) for y in set(t.tolist()))
    if coll.sum() != trace:
        return False
    if K == m == 1 and any(coll != match(p, q)):
        return False
    if K == m:
        race = laws.Race(p, q)
        own = sum(K * p[i] / (K + race.lam[race.pos[i]]) for i in race.tok)
        lml = sum(1 / (1 / p[i] + 1 / (K * q[i])) for i in range(V) if p[i] and q[i])
        if not (lml <= own <= trace):
            return False
    pf, qf = p.astype(float), q.astype(float)
    err = abs(acceptance(pf, qf, K, observed=m) - float(trace))
    if m >= 2:
        err = max(err, abs(acceptance(pf, qf, K, observed=m, method="quad") - float(trace)))
    return err < 1e-12


def _broken_joint(p, q, tup, K):
    """The negative control: the winning column drafts like any other column (b, not g):
    P(x, i) = p_i K int e^{-Kt} prod_c b_{x_c}(t) dt, with the exponential sums multiplied
    out here."""
    race = laws.Race(p, q)
    J = np.zeros((len(tup), p.size), dtype=object)
    for t, row in enumerate(tup.tolist()):
        if any(q[x] == 0 for x in row):
            continue
        terms = [(F(1), F(0))]                     # (coefficient, rate) pairs of the product
        for x in row:
            c, r = race.b(x)
            terms = [(a * ci, la + ri) for a, la in terms for ci, ri in zip(c, r, strict=True)]
        integral = sum(a / (K + la) for a, la in terms)
        for i in np.flatnonzero(p != 0):
            J[t, i] = p[i] * K * integral
    return J


def main() -> int:
    ok = symbolic()
    print("symbolic pieces (Laplace transform of an exponential, max of K Gumbels):", ok)
    pts = [np.array(x, dtype=object) for x in rational_grid(3, 4)]
    pairs = [(p, q) for p in pts for q in pts]
    rnd = random.Random(0)
    for _ in range(40):
        a, b = [rnd.randint(0, 7) for _ in range(4)], [rnd.randint(0, 7) for _ in range(4)]
        if sum(a) and sum(b):
            pairs.append((np.array([F(x, sum(a)) for x in a], dtype=object),
                          np.array([F(x, sum(b)) for x in b], dtype=object)))
    n = 0
    for p, q in pairs:
        for K in (1, 2, 3):
            for m in range(1, K + 1):
                if p.size == 4 and K == 3 and m == 3:
                    continue                     # 64 tuples x 4 outputs: the V = 3 grid has it
                if not exact_case(p, q, K, m):
                    print("FAILED on", p.tolist(), q.tolist(), K, m)
                    ok = False
                n += 1
    print(f"exact joints, collisions and bounds: {n} cases (V = 3 grid, V = 4 random), K <= 3")
    p = np.array([F(1, 2), F(1, 3), F(1, 6)], dtype=object)
    q = np.array([F(1, 6), F(1, 6), F(2, 3)], dtype=object)
    control = exact_case(p, q, 2, 2, broken=True)
    print("negative control (winning column drafted like the others) keeps the marginals:",
          control, "(must be False)")
    ok &= not control
    print("gls_list_collision:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
