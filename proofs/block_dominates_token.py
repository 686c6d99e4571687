"""Claim: block verification never accepts fewer draft tokens in expectation than token
verification, and for gamma = 1 the two rules are identical.

Source: Sun et al., "Block Verification Accelerates Speculative Decoding" (ICLR 2025,
arXiv:2403.10444), Theorem 2 (block verification is optimal among valid verifiers, and token
verification is one of them).

Method (exact rationals, the package's own code):
1. gamma = 1, identity of the rules: for gamma = 1, h_1 = w_1 = min(1, p_1(x)/q_1(x)) = a_1 and
   both rules correct a rejection with norm(max(p_1 - q_1, 0)) (w_0 = 1), so the per-path laws
   (accepted length and emitted token) coincide. Checked exactly on every path of every pair
   in the grids below; symbolically, sympy confirms h_1 - a_1 == 0 and that the tau = 0
   residual weights agree for symbolic positive p, q.
2. Exhaustive grid, gamma = 2 and 3: every pair of order-1 binary models whose three laws
   (after BOS, a, b) have entries in multiples of 1/3 (4 laws per row, 64 models, 4096 pairs),
   and every pair of context-independent laws over V = 3 in multiples of 1/3 (10 laws, 100
   pairs): E[tau_block] >= E[tau_token] exactly, and we record how often it is strict.

Status: verified (exhaustive exact check over the stated grid; symbolic for gamma = 1).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import sympy as sp
from _block_common import constant_lm, simplex_grid

from coupling import expected_accepted
from coupling.lm import path_laws
from coupling.sequence import path_law


def symbolic_gamma_one() -> bool:
    p, q = sp.symbols("p q", positive=True)
    w1 = sp.Min(1 * p / q, 1)  # w_1 = min(w_0 p/q, 1) with w_0 = 1
    a1 = sp.Min(1, p / q)
    h1 = w1  # h_gamma = w_gamma and gamma = 1
    ok = sp.simplify(h1 - a1) == 0
    x = sp.symbols("x0:3", nonnegative=True)
    y = sp.symbols("y0:3", nonnegative=True)
    res_block = [sp.Max(1 * xi - yi, 0) for xi, yi in zip(x, y, strict=True)]  # w_0 = 1
    res_token = [sp.Max(xi - yi, 0) for xi, yi in zip(x, y, strict=True)]
    ok &= all(sp.simplify(a - b) == 0 for a, b in zip(res_block, res_token, strict=True))
    print(f"gamma = 1 symbolic: h_1 == a_1 and residuals agree: {ok}")
    return ok


def order1_models(V: int, n: int):
    laws = list(simplex_grid(V, n))
    for rows in itertools.product(laws, repeat=V + 1):
        table = {(k,): rows[k] for k in range(V + 1)}

        def lm(ctx=(), table=table):
            return table[(ctx[-1],) if ctx else (V,)]

        yield lm


def main() -> int:
    if not symbolic_gamma_one():
        return 1
    models = list(order1_models(2, 3))
    pairs = [(t, d) for t in models for d in models]
    pairs += [
        (constant_lm(p), constant_lm(q)) for p in simplex_grid(3, 3) for q in simplex_grid(3, 3)
    ]
    n = strict = 0
    for t, d in pairs:
        for x, _, P, Q in path_laws(t, d, 1):
            for a, b in zip(path_law("token", x, P, Q), path_law("block", x, P, Q), strict=True):
                if not np.array_equal(a, b):
                    print("gamma = 1 laws differ")
                    return 1
        for gamma in (2, 3):
            tok = expected_accepted("token", t, d, gamma)
            blk = expected_accepted("block", t, d, gamma)
            if blk < tok:
                print(f"block below token: gamma={gamma} ({blk} < {tok})")
                return 1
            strict += blk > tok
            n += 1
    print(
        f"{len(pairs)} model pairs: gamma = 1 per-path laws identical; "
        f"{n} (pair, gamma in {{2, 3}}) cases with block >= token exactly, {strict} strictly"
    )
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
