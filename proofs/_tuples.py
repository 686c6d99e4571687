"""Exact (Fraction) law of k drafts and rational grids of laws, shared by the proofs that
enumerate them."""

from __future__ import annotations

import itertools
from fractions import Fraction


def exact_tuple_law(q, k: int, replacement: bool) -> dict[tuple[int, ...], Fraction]:
    """``{tuple: probability}`` of ``k`` drafts from ``q`` (Fractions): i.i.d., or by successive
    sampling without replacement; in ``itertools.product`` / ``permutations`` order."""
    V = len(q)
    draws = (itertools.product(range(V), repeat=k) if replacement
             else itertools.permutations(range(V), k))
    out = {}
    for t in draws:
        pr, used = Fraction(1), Fraction(0)
        for x in t:
            if replacement:
                pr *= q[x]
            else:
                pr = pr * q[x] / (1 - used) if 1 - used > 0 else Fraction(0)
                used += q[x]
        out[t] = pr
    return out


def rational_grid(V: int, N: int):
    """Every law over ``V`` tokens whose probabilities are multiples of ``1/N`` (Fractions)."""
    for c in itertools.product(range(N + 1), repeat=V - 1):
        if sum(c) <= N:
            yield [Fraction(x, N) for x in c] + [Fraction(N - sum(c), N)]
