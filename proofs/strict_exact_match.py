"""Claim (exact-match verification, ``coupling.rules.strict``): the target samples y ~ p on its
own and the drafts are accepted iff y is among them.

(a) lossless, with acceptance sum_y p(y) P(y drafted): for one draft sum_y p(y) q(y); for k
    i.i.d. drafts sum_y p(y) (1 - (1 - q(y))^k); for two distinct drafts (successive sampling)
    P(y drafted) = q_y + sum_{a != y} q_a q_y / (1 - q_a);
(b) the Gumbel coupling, drafter-invariant too, collides on token i with probability
    1 / sum_j max(p_j/p_i, q_j/q_i) >= p_i q_i: it never accepts less than exact match, token
    by token.

Source: (a), (b) derived here (coupling/rules/strict/__init__.py).

Method: (a) symbolic (sympy) for the two-distinct-drafts inclusion probability on V = 3, 4
(summing the successive-sampling law of every ordered pair holding y), and exact rational
arithmetic: the package's Fraction-exact chain step gives stream laws equal to the target's
exactly, and the enumerated acceptance (Fractions) equals the package's float64 closed forms to
1e-15; (b) symbolic: with a = q_i, b = p_i the j = i term of sum_j max(a p_j, b q_j) is ab and
every other term is at most a p_j + b q_j, so the sum is at most ab + a(1 - b) + b(1 - a) =
1 - (1 - a)(1 - b) <= 1 (identity checked by sympy), and exhaustively on rational grids with
the package's exact Gumbel match. Negative control: the reverse inequality (strict >= gumbel
per token) must fail on the same grid.

Status: (a) proved (the output is y, drawn from p and never changed) and its closed forms
checked symbolically and exhaustively; (b) proved symbolically and checked exhaustively.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction as F

import numpy as np
import sympy as sp
from _tuples import exact_tuple_law, rational_grid

from coupling import RULES, stream_law, target_law
from coupling.rules.gumbel import match

STRICT = RULES["strict"]


def symbolic() -> bool:
    a, b = sp.symbols("a b", nonnegative=True)
    ok = sp.expand(a * b + a * (1 - b) + b * (1 - a) - (1 - (1 - a) * (1 - b))) == 0
    for V in (3, 4):
        q = sp.symbols(f"q0:{V}", positive=True)
        subs = {q[-1]: 1 - sum(q[:-1])}
        for y in range(V):
            pairs = sum(q[s] * q[t] / (1 - q[s]) for s, t in itertools.permutations(range(V), 2)
                        if y in (s, t))
            closed = q[y] + sum(q[s] * q[y] / (1 - q[s]) for s in range(V) if s != y)
            ok &= sp.simplify((pairs - closed).subs(subs)) == 0
    return bool(ok)


def enumerated(p, q, k: int, replacement: bool) -> F:
    """P(y among the drafts) summed against p, over the exact tuple law (Fractions)."""
    law = exact_tuple_law(list(q), k, replacement)
    return sum((w * sum(p[y] for y in set(t)) for t, w in law.items()), F(0))


def main() -> int:
    ok = symbolic()
    print("symbolic: inclusion of two distinct drafts (V = 3, 4), 1 - (1-a)(1-b) identity:", ok)
    pts = [np.array(x, dtype=object) for x in rational_grid(3, 6)]
    n = reverse = 0
    for p in pts:
        for q in pts:
            ok &= bool(all(match(p, q) >= p * q))
            reverse += bool(all(p * q >= match(p, q)))   # the reverse claim holds here
            pf, qf = p.astype(float), q.astype(float)
            for k, rep in ((1, True), (2, True), (3, True), (2, False)):
                if not rep and np.count_nonzero(qf) < k:
                    continue
                exact = enumerated(p, q, k, rep)
                ok &= abs(STRICT.acceptance(pf, qf, k, replacement=rep) - float(exact)) < 1e-15
            n += 1
    print(f"gumbel collision >= p_i q_i on every token, closed forms == enumeration: {n} pairs")
    print(f"negative control: strict >= gumbel per token fails on {n - reverse} of {n} pairs "
          "(must be most)")
    ok &= reverse < n // 2

    def lm(seed):
        rng = np.random.default_rng(seed)
        table = {}
        for ctx in itertools.product(range(4), repeat=1):
            w = rng.integers(1, 6, size=3)
            table[ctx] = np.array([F(int(x), int(w.sum())) for x in w], dtype=object)
        return lambda c=(): table[(tuple(c)[-1:] or (3,))]

    t, d = lm(1), lm(2)
    for gamma in (1, 2):
        law = stream_law("strict", t, d, gamma, 3)
        ok &= bool((law == target_law(t, 3)).all())
    print("stream laws in exact rationals equal the target's (gamma = 1, 2):", ok)
    print("strict_exact_match:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
