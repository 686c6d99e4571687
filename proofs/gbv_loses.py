"""Claim: GBV with k > 1 paths can accept fewer tokens than block verification of one path.

Instance (gamma = 1, V = 2, context-free): target p = (3/5, 2/5), draft q = (7/10, 3/10).
Token 1 ranks top (p/q = 4/3 > 6/7), so GBV selects it whenever some path drafted it: the
selected token has law q*(1) = 1 - (7/10)^k, which overshoots p(1) = 2/5, and with one
drafted token block verification accepts sum_y min(p(y), q*(y)) = 1 - TV(p, q*):

    k = 1: 9/10 (block verification),  k = 2: 89/100,  k = 3: 743/1000.

Over-concentration is the cause: the maximum of k draws puts more mass on the top-ranked
token than one draw, and greedy selection cannot undo it. (A second cause, myopia, needs
gamma >= 2: tests/rules/test_gbv.py pins an instance.)

Source: derived here. Thomas & Pal (arXiv:2602.16961) report gains of GBV over single-path
block verification on real model pairs; this instance shows that the greedy selection carries
no guarantee against one path, not that the reported gains are wrong.

Method: exact rational arithmetic on the package's own exact law of a call
(coupling.expected_accepted, every ordered tree of k paths): the instance for k = 1..5 against
the closed form; then every context-free pair over V = 2 with entries in multiples of 1/10
and q > 0 (99 pairs), gamma = 1, k = 2, 3: the package's value equals 1 - TV(p, q*) with the
closed-form q*, and the pairs where GBV is below block are counted (the claim needs one).

Status: verified (exact, on the instance and on the stated grid).
"""

from __future__ import annotations

import sys
from fractions import Fraction as F

from _block_common import constant_lm

from coupling import expected_accepted


def closed_form(p, q, k: int) -> F:
    """1 - TV(p, q*) for gamma = 1, V = 2: q* puts 1 - (1 - q(top))^k on the top-ranked token
    (ranked by min(1, p/q), ties by the larger id)."""
    key = [min(F(1), p[t] / q[t]) for t in (0, 1)]
    top = 1 if key[1] >= key[0] else 0
    star = [F(0), F(0)]
    star[top] = 1 - (1 - q[top]) ** k
    star[1 - top] = 1 - star[top]
    return sum(min(p[t], star[t]) for t in (0, 1))


def main() -> int:
    p, q = [F(3, 5), F(2, 5)], [F(7, 10), F(3, 10)]
    t, d = constant_lm(p), constant_lm(q)
    block = expected_accepted("block", t, d, 1)
    want = {1: F(9, 10), 2: F(89, 100), 3: F(743, 1000)}
    for k in range(1, 6):
        value = expected_accepted("gbv", t, d, 1, k=k)
        if value != closed_form(p, q, k) or (k in want and value != want[k]):
            print(f"instance: k={k} gives {value}, expected {closed_form(p, q, k)}")
            return 1
        print(f"instance: k={k}: GBV accepts {value} (block: {block})")
    if not expected_accepted("gbv", t, d, 1, k=3) < block:
        return 1
    losses, pairs = {2: 0, 3: 0}, 0
    grid = [[F(i, 10), F(10 - i, 10)] for i in range(11)]
    for p in grid:
        for q in grid[1:-1]:
            pairs += 1
            t, d = constant_lm(p), constant_lm(q)
            block = expected_accepted("block", t, d, 1)
            for k in (2, 3):
                value = expected_accepted("gbv", t, d, 1, k=k)
                if value != closed_form(p, q, k):
                    print(f"grid: p={p} q={q} k={k}: {value} != {closed_form(p, q, k)}")
                    return 1
                losses[k] += value < block
    print(f"grid of {pairs} pairs: the package equals 1 - TV(p, q*) exactly; GBV is below block "
          f"verification on {losses[2]} pairs with k = 2 and {losses[3]} with k = 3")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
