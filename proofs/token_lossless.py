"""Claim: speculative sampling (the ``token`` rule) is lossless.

For any target ``p`` and draft ``q`` on ``V`` tokens, the law of (draft, output)

    pi(x, y) = min(p_x, q_x) [x = y] + (q_x - p_x)_+ (p_y - q_y)_+ / Z,   Z = sum_y (p_y - q_y)_+,

has row sums ``q`` (the drafts) and column sums ``p`` (the output is exactly ``p``), and its
acceptance (trace) is ``sum_x min(p_x, q_x) = 1 - TV(p, q)``.

Source: Leviathan, Kalman, Matias 2023 ("Fast Inference from Transformers via Speculative
Decoding", Appendix A.1); Chen et al. 2023 ("Accelerating LLM decoding with speculative
sampling", Theorem 1).

Method: symbolic (sympy). For V = 2..5 and every sign pattern (which tokens have
p_x >= q_x), the min/max are replaced by the branch, p_V and q_V are eliminated with
sum p = sum q = 1, and row sum - q_x, column sum - p_y and trace - (1 - TV) are simplified
to 0 identically (rational-function identities in the remaining free variables). The case
Z = 0 (p = q, all tokens in the ">=" pattern with equality) has no rejection mass and
pi = diag(p). The general-V argument is the one identity sum_x (q_x - p_x)_+ = Z, which
holds because sum_x (p_x - q_x) = 0; the sympy check confirms it per pattern. A numeric
cross-check compares the package's ``coupling.RULES["token"].joint`` on random inputs.

Status: verified (symbolic, V = 2..5; identity argument for general V).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import sympy as sp


def check_pattern(V: int, pattern: tuple[bool, ...]) -> bool:
    p = list(sp.symbols(f"p0:{V}", real=True))
    q = list(sp.symbols(f"q0:{V}", real=True))
    p[-1] = 1 - sum(p[:-1])
    q[-1] = 1 - sum(q[:-1])
    mn = [q[i] if pattern[i] else p[i] for i in range(V)]  # pattern[i]: p_i >= q_i
    pos = [p[i] - q[i] if pattern[i] else 0 for i in range(V)]  # (p - q)_+
    neg = [0 if pattern[i] else q[i] - p[i] for i in range(V)]  # (q - p)_+
    Z = sum(pos)
    if sp.simplify(Z) == 0:
        return True  # only possible with p == q in this pattern; pi = diag(min) = diag(p)
    J = [[(mn[x] if x == y else 0) + neg[x] * pos[y] / Z for y in range(V)] for x in range(V)]
    for y in range(V):
        if sp.simplify(sum(J[x][y] for x in range(V)) - p[y]) != 0:
            return False
    for x in range(V):
        if sp.simplify(sum(J[x]) - q[x]) != 0:
            return False
    tvd = sp.Rational(1, 2) * sum(pos[i] + neg[i] for i in range(V))
    return sp.simplify(sum(J[i][i] for i in range(V)) - (1 - tvd)) == 0


def main() -> int:
    ok = True
    for V in range(2, 6):
        for pattern in itertools.product([True, False], repeat=V):
            if not any(pattern) or all(pattern):
                continue  # infeasible for distributions unless p == q (handled: Z = 0)
            if not check_pattern(V, pattern):
                print(f"FAILED: V={V} pattern={pattern}")
                ok = False
        print(f"V={V}: all {2**V - 2} sign patterns verified symbolically")
    try:
        from coupling import RULES

        rng = np.random.default_rng(0)
        for _ in range(200):
            V = int(rng.integers(2, 30))
            p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
            J = RULES["token"].joint(p, q)
            assert 0.5 * np.abs(J.sum(0) - p).sum() < 1e-12 and np.abs(J.sum(1) - q).max() < 1e-12
        print("numeric cross-check of coupling.RULES['token'].joint: 200 random pairs, "
              "TV < 1e-12")
    except ImportError:
        print("coupling not importable: numeric cross-check skipped")
    print("token_lossless:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
