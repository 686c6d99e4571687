"""Exact (Fraction) law of k drafts, shared by the proofs that enumerate draft tuples."""

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
