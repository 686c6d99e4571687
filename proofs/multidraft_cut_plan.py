"""Claim (an optimal multi-draft plan through the min cut; coupling.rules.optimal.CutPlan):

Let H minimise value(H) = p(H^c) + P(some draft in H) (multidraft_mincut.py). Then
(a) the sets of drafts that hit H can place all their mass on their tokens in H with no token
    x of H receiving more than p_x -- Hall's condition: for every T subset of H,
    P(hit H, miss H minus T) <= p(T);
(b) the sets inside H^c can give every token x of H^c exactly p_x -- Hall's condition: for
    every T subset of H^c, p(T) <= P(hit T, miss H);
(c) any such pair of flows, completed by sending each set's leftover to H in proportion to
    r = p - (load from (a)), is a coupling of (Q, p) that accepts value(H), the LP optimum;
    and feasible flows for a cut that is *not* minimal cannot exist (weak duality: a flow
    never exceeds a cut's value), so the package refuses such a cut.

Source: max-flow/min-cut complementary slackness on the membership graph (the LP of SpecTr,
Sun et al. 2023; the subset dual of Hu et al. 2025). (a) and (b) are the cut inequalities
value(H) <= value(H minus T) and value(H) <= value(H plus T), rewritten.

Method:
* (a), (b) symbolic: with P the tuple law as a sum of indicator masses, sympy checks the two
  identities value(H minus T) - value(H) = p(T) - P(hit H, miss H minus T) and
  value(H plus T) - value(H) = P(hit T, miss H) - p(T) on symbolic masses for every
  (H, T) pattern of V = 4 tokens and k = 2 i.i.d. drafts (the identities are set algebra:
  the same holds for any V, k and any tuple law).
* (a), (b) exhaustive, exact: 300 random rational instances (V = 2..6, k = 1..3, both modes,
  zeros and ties mixed in): the package's prefix-scan cut, evaluated in Fractions, is
  minimal over all 2^V subsets, and every Hall inequality holds over all subsets T.
* (c) numerical: coupling.rules.optimal.cut_plan on the same instances (float64) is a coupling to
  1e-12 and accepts the optimum to 1e-12; with its closed forms switched off (every part by
  LP) the same holds; and for a non-minimal cut the package raises (negative control).

Status: (a), (b) proved symbolically (as identities) and checked exhaustively in exact
arithmetic; (c) checked numerically, with the negative control.
"""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction

import numpy as np
import sympy as sp
from _tuples import exact_tuple_law


def _subsets(items):
    items = list(items)
    return (set(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r))


def _hit_miss(law, hit, miss, zero):
    """P(some draft in ``hit``, none in ``miss``) under ``law`` {tuple: mass}."""
    return sum((m for t, m in law.items() if set(t) & hit and not set(t) & miss), zero)


def symbolic() -> bool:
    V = 4
    q = sp.symbols(f"q0:{V}", nonnegative=True)
    p = sp.symbols(f"p0:{V}", nonnegative=True)
    law = {t: q[t[0]] * q[t[1]] for t in itertools.product(range(V), repeat=2)}
    zero = sp.Integer(0)

    def value(H):
        return sum((p[x] for x in range(V) if x not in H), zero) + _hit_miss(law, H, set(), zero)

    ok = True
    for H in _subsets(range(V)):
        for T in _subsets(H):
            a = value(H - T) - value(H) - (sum(p[x] for x in T) - _hit_miss(law, H, H - T, zero))
            ok &= sp.expand(a) == 0
        for T in _subsets(set(range(V)) - H):
            b = value(H | T) - value(H) - (_hit_miss(law, T, H, zero) - sum(p[x] for x in T))
            ok &= sp.expand(b) == 0
    return bool(ok)


def _rational_instance(rng):
    V = int(rng.integers(2, 7))
    k = int(rng.integers(1, 4))
    rep = bool(rng.integers(0, 2))
    w = [rng.integers(0, 6, size=V) for _ in range(2)]
    if rng.random() < 0.1:
        w[1] = w[0].copy()
    if w[0].sum() == 0 or w[1].sum() == 0 or (not rep and np.count_nonzero(w[1]) < k):
        return None
    p = [Fraction(int(a), int(w[0].sum())) for a in w[0]]
    q = [Fraction(int(a), int(w[1].sum())) for a in w[1]]
    return V, k, rep, p, q


def exhaustive_and_package(n: int = 300) -> bool:
    from coupling import SolverError, tuple_law
    from coupling.lp.draftsets import group_by_set, padded_sets
    from coupling.rules.optimal import CutPlan, cut_plan, optimal_cut

    rng = np.random.default_rng(7)
    done = refused = 0
    worst = 0.0
    while done < n:
        inst = _rational_instance(rng)
        if inst is None:
            continue
        V, k, rep, p, q = inst
        law = exact_tuple_law(q, k, rep)
        zero = Fraction(0)

        def value(H, p=p, law=law, V=V, zero=zero):
            return sum((p[x] for x in range(V) if x not in H), zero) + _hit_miss(law, H, set(),
                                                                                  zero)

        pf, qf = np.array([float(x) for x in p]), np.array([float(x) for x in q])
        _, H = optimal_cut(pf, qf, k, replacement=rep)
        H = set(H.tolist())
        best = min(value(S) for S in _subsets(range(V)))
        if value(H) != best:
            print(f"FAILED: the package's cut {H} is not minimal ({value(H)} > {best})")
            return False
        for T in _subsets(H):
            if _hit_miss(law, H, H - T, zero) > sum((p[x] for x in T), zero):
                print(f"FAILED (a): V={V} k={k} rep={rep} H={H} T={T}")
                return False
        for T in _subsets(set(range(V)) - H):
            if sum((p[x] for x in T), zero) > _hit_miss(law, T, H, zero):
                print(f"FAILED (b): V={V} k={k} rep={rep} H={H} T={T}")
                return False
        # (c) the package's plan, with its closed forms and with every part by LP
        tuples, probs = tuple_law(qf, k, replacement=rep)
        _, mass, members = group_by_set(tuples, probs, V)
        sets = padded_sets(members)
        for closed in (True, False):
            forms = ("A", "B") if closed else ()
            plan = cut_plan(pf, qf, k, rep, sets, mass, closed_forms=forms).dense()
            err = max(np.abs(plan.sum(axis=1) - mass).max(), 0.5 * np.abs(plan.sum(0) - pf).sum(),
                      abs(plan[members].sum() - float(best)), -plan.min())
            if err > 1e-12:
                print(f"FAILED (c): V={V} k={k} rep={rep} closed={closed} error {err:.3g}")
                return False
            worst = max(worst, err)
        # negative control: a cut of larger value must be refused
        worse = [S for S in _subsets(range(V)) if value(S) > best]
        if worse:
            S = worse[int(rng.integers(len(worse)))]
            try:
                cut = np.array(sorted(S), dtype=np.int64)
                CutPlan(pf, qf, k, rep, sets, mass, cut=cut).dense()
            except SolverError:
                refused += 1
            else:
                print(f"FAILED (control): the non-minimal cut {S} was accepted")
                return False
        done += 1
    print(f"exhaustive: {n} instances, Hall (a) and (b) exact; plan error <= {worst:.1e}; "
          f"{refused} non-minimal cuts refused")
    return refused > 0


def main() -> int:
    s = symbolic()
    print("symbolic identities (a), (b) (V = 4, k = 2):", s)
    e = exhaustive_and_package()
    ok = s and e
    print("multidraft_cut_plan:", "VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
