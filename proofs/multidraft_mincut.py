"""Claim (multi-draft optimum by min-cut prefix scan):

(a) alpha*(p, q, k) = min_{H subset [V]} 1 - p(H) + P(some draft in H)   (max-flow/min-cut
    dual of the membership-cost LP);
(b) with replacement (i.i.d. drafts), P(some draft in H) = F(q(H)), F(s) = 1 - (1-s)^k, and
    some minimising H is a prefix of the tokens sorted by p/q decreasing (q = 0 < p first);
(c) without replacement (successive sampling), the same prefix property holds.

Source: Hu et al. 2025, "Towards Optimal Multi-draft Speculative Decoding" (ICLR 2025):
the subset-selection dual (a) and its efficient solution; the exchange argument for (b) is
written out in coupling/lp/cut.py.

Method:
* (b) symbolic (sympy), for k = 1..8: the exchange argument needs
  F(s + t) - F(s) <= t F'(s) and F(s) - F(s - t) >= t F'(s) on [0, 1], which follow from
  F' being non-increasing: with a = 1 - s - t >= 0, b = 1 - s, F'(s) - F'(s+t) =
  k (b^(k-1) - a^(k-1)) = k (b - a) * sum_i b^i a^(k-2-i); sympy checks this factorisation
  and that the cofactor polynomial has only non-negative coefficients (hence >= 0).
* (a), (b), (c) exhaustive: on 400 random instances (V = 2..7, k = 1..3, both modes, with
  zeros and ties mixed in) the minimum over ALL 2^V subsets equals the minimum over the
  V + 1 prefixes, equals coupling.optimal_acceptance, and equals the LP optimum of
  coupling.solve_coupling (POT), to 1e-9.

Status: (a) verified exhaustively (it is LP duality; no symbolic proof here); (b) proven
(symbolic exchange step) and verified exhaustively; (c) verified exhaustively only -- no
symbolic proof.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import sympy as sp


def symbolic_exchange() -> bool:
    a, b = sp.symbols("a b", nonnegative=True)
    ok = True
    for k in range(1, 9):
        m = k - 1
        if m == 0:
            continue  # F linear: equalities
        cof = sp.expand(sp.cancel((b**m - a**m) / (b - a)))
        ok &= sp.expand(cof * (b - a) - (b**m - a**m)) == 0
        coeffs = sp.Poly(cof, a, b).coeffs()
        ok &= all(c >= 0 for c in coeffs)
        # and F'(s) = k (1 - s)^(k-1) indeed
        s = sp.symbols("s")
        Fk = 1 - (1 - s) ** k
        ok &= sp.simplify(sp.diff(Fk, s) - k * (1 - s) ** (k - 1)) == 0
    return bool(ok)


def exhaustive(n: int = 400) -> bool:
    from coupling import optimal_acceptance, solve_coupling, tuple_law
    from coupling.rules.optimal import ratio_order

    rng = np.random.default_rng(2025)
    worst = 0.0
    done = 0
    while done < n:
        V = int(rng.integers(2, 8))
        k = int(rng.integers(1, 4))
        rep = bool(rng.integers(0, 2))
        alpha = rng.choice([0.3, 1.0, 3.0])
        p = rng.dirichlet(np.ones(V) * alpha)
        q = p.copy() if rng.random() < 0.1 else rng.dirichlet(np.ones(V) * alpha)
        if rng.random() < 0.3:
            p[rng.integers(V)] = 0.0
            p /= p.sum()
        if rng.random() < 0.3:
            q[rng.integers(V)] = 0.0
            q /= q.sum()
        if not rep and np.count_nonzero(q) < k:
            continue
        tuples, probs = tuple_law(q, k, replacement=rep)
        member = np.zeros((tuples.shape[0], V), dtype=bool)
        member[np.arange(tuples.shape[0])[:, None], tuples] = True

        def value(H, member=member, probs=probs, p=p):
            hit = member[:, list(H)].any(axis=1) if H else np.zeros(len(probs), bool)
            return 1.0 - p[list(H)].sum() + probs[hit].sum()

        all_min = min(value(S) for r in range(V + 1) for S in itertools.combinations(range(V), r))
        order = ratio_order(p, q)
        pre_min = min(value(tuple(order[:m])) for m in range(V + 1))
        fast = optimal_acceptance(p, q, k, replacement=rep)
        lp = solve_coupling(p, q, k, replacement=rep).acceptance
        err = max(abs(all_min - pre_min), abs(all_min - fast), abs(all_min - lp))
        if err > 1e-9:
            print(
                f"FAILED V={V} k={k} rep={rep} all={all_min} prefix={pre_min} fast={fast} lp={lp}"
            )
            return False
        worst = max(worst, err)
        done += 1
    print(
        f"exhaustive: {n} instances, "
        f"max |all-subsets - prefix|, |.. - fast|, |.. - LP| = {worst:.2e}"
    )
    return True


def main() -> int:
    s = symbolic_exchange()
    print("symbolic exchange inequalities (k = 1..8):", s)
    e = exhaustive()
    ok = s and e
    print("multidraft_mincut:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
