"""Exact (Fraction) pieces shared by the proofs on draft-set laws: rational grids, couplings
checked entry by entry, and the min cut that bounds every lossless verifier of a set law."""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction
from pathlib import Path

# the package of this checkout, not an installed copy
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def grid(V: int, N: int):
    """Every law on ``V`` tokens whose probabilities are multiples of ``1/N``."""
    for cc in itertools.product(range(N + 1), repeat=V - 1):
        if sum(cc) <= N:
            yield [Fraction(x, N) for x in cc] + [Fraction(N - sum(cc), N)]


def set_law(tuples: dict[tuple[int, ...], Fraction]) -> dict[frozenset, Fraction]:
    """The law of the set of drafted tokens, from a law of draft tuples."""
    out: dict[frozenset, Fraction] = {}
    for t, pr in tuples.items():
        s = frozenset(t)
        out[s] = out.get(s, Fraction(0)) + pr
    return out


def min_cut(p, sets: dict[frozenset, Fraction]) -> Fraction:
    r""":math:`\min_H p(H^c) + P(S \cap H \ne \emptyset)` over every token set ``H``: an upper
    bound on the acceptance of any coupling of the set law with ``p`` (the mass accepted into
    ``H`` comes from sets that meet it, the rest is at most ``p(H^c)``), equal to the LP
    optimum by max-flow/min-cut."""
    V = len(p)
    best = None
    for r in range(V + 1):
        for H in itertools.combinations(range(V), r):
            h = set(H)
            value = sum(p[y] for y in range(V) if y not in h) \
                + sum(m for s, m in sets.items() if s & h)
            best = value if best is None else min(best, value)
    return best


def coupling_errors(plan: dict[tuple, list], tuples: dict[tuple, Fraction], p) -> list[str]:
    """What keeps ``plan`` (tuple -> output law times its probability, Fractions) from being a
    coupling of the tuple law with ``p``: negative entries, wrong row or column sums."""
    errs = []
    cols = [Fraction(0)] * len(p)
    for t, row in plan.items():
        if any(v < 0 for v in row):
            errs.append(f"negative entry in row {t}")
        if sum(row) != tuples[t]:
            errs.append(f"row {t} sums to {sum(row)}, not {tuples[t]}")
        cols = [c + v for c, v in zip(cols, row, strict=True)]
    if cols != list(p):
        errs.append(f"output law {cols} != p {list(p)}")
    return errs


def accepted(plan: dict[tuple, list]) -> Fraction:
    """The membership acceptance of a plan: its mass on outputs among the row's drafts."""
    return sum((row[y] for t, row in plan.items() for y in set(t)), Fraction(0))


def token_row(p, g, x: int, mass: Fraction) -> list:
    """Speculative sampling's row for draft ``x`` of proposal ``g`` (times ``mass``): accept
    with probability min(1, p/g), else the residual (p - g)_+ / sum."""
    a = min(Fraction(1), p[x] / g[x]) if g[x] > 0 else Fraction(0)
    d = [max(pi - gi, Fraction(0)) for pi, gi in zip(p, g, strict=True)]
    z = sum(d)
    row = [mass * (1 - a) * v / z if z > 0 else Fraction(0) for v in d]
    row[x] += mass * a
    return row
