"""Claim: GBV's skewed laws q* are exactly the conditional laws of the path greedy selection
picks from k i.i.d. paths.

With the per-node rank orders (key min(1, p/q) or p/q, ties by token id, q = 0 lowest) and F
the draft's lexicographic CDF, the selected path X* is the largest of k i.i.d. paths, so
P(X* <= x) = F(x)^k, and along the selected prefix u (A: the draft mass of the prefixes of
its depth ranked below u, m = Q(u), F^-(t): the draft mass ranked below t at u)

    q*(t | u) = [(A + m F^-(t) + m q(t))^k - (A + m F^-(t))^k] / [(A + m)^k - A^k].

The package computes it as a ratio of sums of non-negative terms (coupling.rules.gbv.skew).
Since block verification is lossless whenever it is given the drafted path's true
conditional laws, this is what makes GBV lossless.

Source: Thomas & Pal, arXiv:2602.16961 (the reference implementation's compute_skew; the
paper's full text was not available); the formula is re-derived here.

Method: exhaustive check in exact rational arithmetic: for every ordered tree of k i.i.d.
paths (coupling.rules.trie.draft_trees, exact probabilities) the package's selection
(coupling.rules.gbv.select) and its q* along the selected path; then for every path x,
P(X* = x) summed over the trees equals prod_d q*_d(x_d), and each q* equals the closed form
above. Cases: V = 2, 3; gamma = 1, 2, 3; k = 1, 2, 3 (at most 729 ordered trees); both
ranks; random rational models with weights below 4 (frequent ties) of context order 0, 1
(with zeros) and 2. The check can fail: selecting the first-appearing child among tied keys
(the reference code's rule, control "first_child_ties") must break the equality on some
case.

Status: verified (exhaustive exact check over the stated cases).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
from _tree_common import tree_cases

from coupling.rules import gbv
from coupling.rules.trie import draft_trees


def closed_form(p_nodes, q_nodes, path, k: int, rank: str) -> list[np.ndarray]:
    """q* along ``path`` by the power-difference formula, node laws given."""
    A, m, out = Fraction(0), Fraction(1), []
    for d, (p, q) in enumerate(zip(p_nodes, q_nodes, strict=True)):
        order = gbv.rank_order(p, q, rank)
        below, acc = {}, Fraction(0)
        for t in order:
            below[int(t)] = acc
            acc += q[t]
        den = (A + m) ** k - A**k
        out.append(np.array([((A + m * below[t] + m * q[t]) ** k - (A + m * below[t]) ** k)
                             / den for t in range(q.size)], dtype=object))
        t = path[d]
        A, m = A + m * below[t], m * q[t]
    return out


def check(t, d, gamma: int, k: int, rank: str, control=None) -> bool:
    picked: dict = {}
    skewed: dict = {}
    for x, pr, P, Q in draft_trees(t, d, gamma, k):
        b, q_star = gbv.select(x, P, Q, rank=rank, control=control)
        path = tuple(int(v) for v in x[b])
        picked[path] = picked.get(path, 0) + pr
        if path not in skewed:
            if control is None:
                want = closed_form(P[b, :gamma], Q[b], path, k, rank)
                if any((a != w).any() for a, w in zip(q_star, want, strict=True)):
                    return False
            skewed[path] = np.prod([q_star[i][path[i]] for i in range(gamma)])
    return picked == skewed


def main() -> int:
    checked = 0
    control_fails = False
    for V, gamma, k, t, d, _ in tree_cases((1, 2, 3), 6000, denom=4):
        for rank in gbv.RANKS:
            if not check(t, d, gamma, k, rank):
                print(f"skew differs: V={V} gamma={gamma} k={k} rank={rank} {t.describe}")
                return 1
            checked += 1
        if k > 1 and not control_fails:
            control_fails = not check(t, d, gamma, k, "capped", "first_child_ties")
    print(f"{checked} (models, gamma, k, rank) cases: the law of the greedily selected path is "
          "prod q*, and q* is the closed form, exactly")
    if not control_fails:
        print("the first-child tie rule never broke the equality: the check cannot fail")
        return 1
    print("the reference code's tie rule breaks it (the check can fail)")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
