"""Claim: the drafter-invariant (shared-Gumbel) block rule is lossless; its per-position match
probability is c(b) = 1 / sum_j max(p_j / p_b, q_j / q_b); it never accepts more than token
verification, and equals it for a binary vocabulary.

Rule (coupling.RULES["gumbel"], coupling/rules/gumbel/): drafter and verifier share Gumbel
noise G_i per position; X_i = argmax log q_i + G_i, Y_i = argmax log p_i + G_i along the
drafted path; accept while X_i = Y_i, emit Y at the first disagreement (or the bonus
Y_{gamma+1}).
Sources: Gumbel-max trick; the exponential-race form of the Gumbel coupling (e.g. Daliri et
al., "Coupling without Communication and Drafter-Invariant Speculative Decoding", 2024).

Method:
1. Symbolic (sympy): with E_j = exp(-G_j) i.i.d. Exp(1), X = Y = b iff E_j > E_b m_j for all
   j != b, m_j = max(p_j/p_b, q_j/q_b); sympy integrates the joint density for V = 2, 3, 4
   with symbolic positive m_j and gets 1 / (1 + sum_{j != b} m_j).
2. Exact rationals: on every pair of laws on a grid (V = 3, multiples of 1/4) the package's
   per-token match probabilities (coupling.rules.gumbel.match, an O(V log V) sort by p/q)
   equal the closed form 1 / sum_j max(p_j / p_b, q_j / q_b) exactly, and c(b) <=
   min(p_b, q_b), so the rule's disagreement masses p_b - c(b) are non-negative; the
   exact stream law (coupling.stream_law, L = 4) equals the target law for random
   rational context-dependent models, V = 2, 3, gamma = 1, 2, 3 (the broken control that
   emits the draft at a disagreement is found lossy); E[tau_gumbel] <= E[tau_token] on the
   same models, with equality whenever V = 2.

Status: verified (symbolic for the match probability; exhaustive exact check otherwise).
"""

from __future__ import annotations

import sys

import numpy as np
import sympy as sp
from _block_common import rational_lm, simplex_grid

from coupling import NEGATIVE_CONTROLS, expected_accepted, stream_law, target_law
from coupling.rules.gumbel import match


def symbolic() -> bool:
    ok = True
    for V in (2, 3, 4):
        t = sp.symbols("t", positive=True)
        m = sp.symbols(f"m1:{V}", positive=True)
        # P(E_j > t m_j for all j | E_b = t) = prod exp(-t m_j); integrate against e^{-t}
        integrand = sp.exp(-t) * sp.prod([sp.exp(-t * mj) for mj in m])
        val = sp.integrate(integrand, (t, 0, sp.oo), conds="none")
        diff = sp.simplify(val - 1 / (1 + sum(m)))
        print(f"V={V}: integral - 1/(1 + sum m_j) = {diff}")
        ok &= diff == 0
    return ok


def closed_form(p, q) -> list:
    """c(b) = 1 / sum_j max(p_j / p_b, q_j / q_b), 0 where p_b q_b = 0 (the definition)."""
    return [0 * p[b] if p[b] == 0 or q[b] == 0
            else 1 / sum(max(p[j] / p[b], q[j] / q[b]) for j in range(len(p)))
            for b in range(len(p))]


def exact() -> bool:
    laws = list(simplex_grid(3, 4))
    for p in laws:
        for q in laws:
            c = match(p, q)
            if list(c) != closed_form(p, q):
                print(f"match != closed form: p={list(p)} q={list(q)}: {list(c)}")
                return False
            if any(c[b] > min(p[b], q[b]) for b in range(3)) or any(v < 0 for v in c):
                print(f"c exceeds min(p, q): p={list(p)} q={list(q)}")
                return False
    print(f"match == closed form exactly and c(b) <= min(p_b, q_b) on all {len(laws) ** 2} "
          "grid pairs")
    n = 0
    control = False
    for V in (2, 3):
        for gamma in (1, 2, 3):
            for k in range(6):
                t = rational_lm(V, k % 3, seed=300 + 10 * V + gamma + 100 * k)
                d = rational_lm(V, k % 3, seed=600 + 10 * V + gamma + 100 * k)
                want = target_law(t, 4)
                if not np.array_equal(stream_law("gumbel", t, d, gamma, 4), want):
                    print(f"LOSSY: {t.describe} gamma={gamma}")
                    return False
                bad = stream_law(NEGATIVE_CONTROLS["gumbel_emit_draft"], t, d, gamma, 4)
                control |= not np.array_equal(bad, want)
                g, tok = (
                    expected_accepted("gumbel", t, d, gamma),
                    expected_accepted("token", t, d, gamma),
                )
                if g > tok or (V == 2 and g != tok):
                    print(f"gumbel vs token fails: {g} vs {tok} (V={V})")
                    return False
                n += 1
    print(
        f"{n} instances: gumbel stream law == target law exactly; gumbel <= token (equal for V = 2)"
    )
    if not control:
        print("negative control not detected")
        return False
    print("negative control (emit the draft at a disagreement) detected as lossy")
    return True


if __name__ == "__main__":
    ok = symbolic() and exact()
    print("VERIFIED" if ok else "FAILED")
    sys.exit(0 if ok else 1)
