"""Claim: SpecHub's draft *set* law is the greedy draft law at k = 2, and its staged plan
(``coupling.rules.spechub``) is lossless and optimal for that law, with acceptance
min(1, p_a + sum_{i != a} min(p_i, m_i)), m_i = q_i / (1 - q_a); hence it equals the greedy
rule's acceptance at k = 2.

Drafts: hub a = argmax q (ties by smaller id); x1 ~ q; x2 = a if x1 != a, else x2 ~ q(. | != a):
pairs (i, a) with mass q_i and (a, i) with mass c_i = q_a q_i / (1 - q_a).

Source: Sun et al., "SpecHub" (EMNLP 2024): the draft law and the verifier as their code states
them; the set-law identity, the acceptance and the optimality are derived in this package.

Method:
1. symbolically (sympy): the set {a, i} has mass q_i + c_i = q_i / (1 - q_a) = m_i, the
   greedy law's g(i) for T = {a}; and stages 1-2 give token i exactly
   min(p_i, q_i) + min(c_i, (p_i - q_i)_+) = min(p_i, m_i), in each of the three orders of
   p_i against q_i and q_i + c_i;
2. exact rational arithmetic on every pair with V = 3 (multiples of 1/6, 784 pairs) and V = 4
   (multiples of 1/4, 1225 pairs) where q has two positive entries: the staged plan is a
   coupling of the hub pair law with p, its acceptance is the closed form, the minimum over
   all cuts of the hub set law equals it (optimality certificate), and the hub set law equals
   the greedy k = 2 set law;
3. the package: ``RULES["spechub"]`` (draft_law, joint, acceptance) matches the exact values to
   1e-12, equals ``RULES["greedy"]``'s acceptance at k = 2 to 1e-15, and its LP ``optimum`` to
   1e-9 on the V = 3 instances;
4. negative control: stage 2 testing i against p_i instead of p'_i = (p_i - q_i)_+ is lossy
   (exact output TV > 0 on some instance).

Status: identities proved symbolically; the plan checked exhaustively (exact rationals).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
import sympy as sp
from _sets import accepted, coupling_errors, grid, min_cut, set_law

from coupling import RULES

ZERO = Fraction(0)


def symbolic() -> bool:
    qa, qi = sp.symbols("q_a q_i", positive=True)
    c = qa * qi / (1 - qa)
    ok = sp.simplify(qi + c - qi / (1 - qa)) == 0
    q, c, t, s = sp.symbols("q c t s", positive=True)
    m = q + c

    def stages(p):
        return sp.Min(p, q) + sp.Min(c, sp.Max(p - q, 0))

    for p in (q - t, q + c - s * c / (1 + s), m + t):      # p <= q, q < p < q + c, p > q + c
        ok &= sp.simplify(stages(p) - sp.Min(p, m)) == 0
    return bool(ok)


def hub_law(q) -> tuple[int, dict[tuple, Fraction]]:
    a = max(range(len(q)), key=lambda y: (q[y], -y))
    rest = sum(q[y] for y in range(len(q)) if y != a)
    law = {}
    for i in range(len(q)):
        if i != a:
            law[(i, a)] = q[i]
            law[(a, i)] = q[a] * q[i] / rest
    return a, dict(sorted(law.items()))


def staged_plan(p, q, broken: bool = False) -> dict[tuple, list]:
    """The plan of the module doc, stage by stage, in Fractions (``broken``: stage 2 tests
    against p instead of p')."""
    a, law = hub_law(q)
    V = len(p)
    p1 = [ZERO if y == a else max(p[y] - q[y], ZERO) for y in range(V)]
    sent = {t: min(m, p[t[0]]) if t[1] == a else min(m, (p if broken else p1)[t[1]])
            for t, m in law.items()}
    L1 = sum(law[t] - sent[t] for t in law if t[1] == a)
    L2 = sum(law[t] - sent[t] for t in law if t[0] == a)
    h2 = min(Fraction(1), p[a] / L2) if L2 > 0 else Fraction(1)
    pa1 = max(p[a] - L2, ZERO)
    h1 = min(Fraction(1), pa1 / L1) if L1 > 0 else Fraction(1)
    pp = [max(p1[y] - law[(a, y)], ZERO) if y != a else max(pa1 - L1, ZERO) for y in range(V)]
    z = sum(pp)
    plan = {}
    for t, m in law.items():
        i, h = (t[0], h1) if t[1] == a else (t[1], h2)
        kept = m - sent[t]
        row = [(1 - h) * kept * v / z if z > 0 else ZERO for v in pp]
        row[i] += sent[t]
        row[a] += h * kept
        plan[t] = row
    return plan


def check(p, q, with_lp: bool) -> list[str]:
    a, law = hub_law(q)
    plan = staged_plan(p, q)
    errs = coupling_errors(plan, law, p)
    rest = 1 - q[a]
    closed = min(Fraction(1), p[a] + sum(min(p[i], q[i] / rest) for i in range(len(p)) if i != a))
    if accepted(plan) != closed:
        errs.append(f"acceptance {accepted(plan)} != closed form {closed}")
    if min_cut(p, set_law(law)) != closed:
        errs.append("min cut differs")
    greedy_sets = {frozenset((a, x)): q[x] / rest for x in range(len(q)) if x != a}
    if set_law(law) != greedy_sets:
        errs.append("hub set law != greedy k = 2 set law")
    pf, qf = np.array(p, dtype=float), np.array(q, dtype=float)
    hub = RULES["spechub"]
    tuples, probs = hub.draft_law(qf, 2, replacement=False)
    if [tuple(t) for t in tuples.tolist()] != list(law) \
            or np.abs(probs - np.array(list(law.values()), dtype=float)).max() > 1e-12:
        errs.append("package draft_law differs")
    J = hub.joint(pf, qf, 2, replacement=False)
    if np.abs(J - np.array(list(plan.values()), dtype=float)).max() > 1e-12:
        errs.append("package joint differs")
    acc = hub.acceptance(pf, qf, 2, replacement=False)
    if abs(acc - float(closed)) > 1e-12 \
            or abs(acc - RULES["greedy"].acceptance(pf, qf, 2, replacement=False)) > 1e-15:
        errs.append("package acceptance differs")
    lp = hub.optimum(pf, qf, 2, replacement=False, solver="pot") if with_lp else None
    if with_lp and abs(lp - float(closed)) > 1e-9:
        errs.append("package LP optimum differs")
    return errs


def main() -> int:
    sym = symbolic()
    cases = [(p, q, True) for p in grid(3, 6) for q in grid(3, 6)]
    cases += [(p, q, False) for p in grid(4, 4) for q in grid(4, 4)]
    cases = [c for c in cases if sum(v > 0 for v in c[1]) >= 2]
    bad, broken = [], 0
    for p, q, with_lp in cases:
        errs = check(p, q, with_lp)
        if errs:
            bad.append((p, q, errs))
        plan = staged_plan(p, q, broken=True)
        broken += [sum(row[y] for row in plan.values()) for y in range(len(p))] != list(p)
    for p, q, errs in bad[:5]:
        print("FAILED", [str(v) for v in p], [str(v) for v in q], errs[:3])
    print(f"spechub: identities {'proved' if sym else 'NOT proved'} symbolically; "
          f"{len(cases) - len(bad)}/{len(cases)} pairs verified exactly (coupling, closed form, "
          f"min-cut certificate, greedy set law, package values); negative control lossy on "
          f"{broken}")
    return 0 if sym and not bad and broken > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
