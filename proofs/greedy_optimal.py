"""Claim: the greedy draft law's verifier (``coupling.rules.greedy``) is lossless and attains the
LP optimum of its own draft law, with acceptance p(T) + sum_{y not in T} min(p(y), g(y)); and
drawing the last draft from q itself (instead of from q off the top tokens) never accepts more.

Drafts: T = the k - 1 likeliest tokens of q (ties by smaller id), then x ~ g = q 1[not T] /
q(not T). Verifier: speculative sampling of x against p with proposal g.

Source: Hu et al., "Towards Optimal Multi-draft Speculative Decoding" (ICLR 2025) state that
their greedy draft law has a verifier attaining its optimum; the derivation (min cut) is this
package's, in the module docstring.

Method: exact rational arithmetic (Fractions) on every pair of laws with V = 3, probabilities
multiples of 1/6 (784 pairs), and V = 4, multiples of 1/4 (1225 pairs), for every k = 1..V
that q supports (k tokens of positive mass):
1. the verifier's plan (one token-rule row per value of x) is a coupling of the greedy tuple
   law with p, entry by entry;
2. its acceptance (mass on outputs among the drafts) equals the closed form;
3. the minimum over all 2^V cuts H of p(H^c) + P(set meets H) equals it: a primal-dual
   certificate of optimality for that law;
4. the last draft from q itself: its exact min-cut optimum is never above the closed form;
5. the package: ``RULES["greedy"]`` (draft_law, joint, acceptance) matches the exact values to
   1e-12 on every instance, and its LP oracle ``optimum`` (coupling.solve_draft_law) to 1e-9 on
   the V = 3 instances;
6. negative control: a verifier that tests x against q instead of g is not lossless (exact
   output TV > 0 on some instance).

Status: checked exhaustively (exact rationals on the stated grids).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
from _sets import accepted, coupling_errors, grid, min_cut, set_law, token_row

from coupling import RULES

GREEDY = RULES["greedy"]


def top(q, k: int) -> list[int]:
    return sorted(range(len(q)), key=lambda y: (-q[y], y))[: k - 1]


def greedy_law(q, k: int, last_from_q: bool = False) -> dict[tuple, Fraction]:
    T = top(q, k)
    g = law_of_last(q, T, last_from_q)
    xs = range(len(q)) if last_from_q else [y for y in range(len(q)) if y not in T]
    return {(*T, x): g[x] for x in xs}


def law_of_last(q, T, last_from_q: bool = False) -> list:
    if last_from_q:
        return list(q)
    rest = sum(q[y] for y in range(len(q)) if y not in T)
    return [Fraction(0) if y in T else q[y] / rest for y in range(len(q))]


def verifier_plan(p, q, k: int, proposal=None) -> dict[tuple, list]:
    T = top(q, k)
    g = law_of_last(q, T) if proposal is None else proposal
    return {t: token_row(p, g, t[-1], m) for t, m in greedy_law(q, k).items()}


def check(p, q, k: int, with_lp: bool) -> list[str]:
    law = greedy_law(q, k)
    plan = verifier_plan(p, q, k)
    errs = coupling_errors(plan, law, p)
    T = top(q, k)
    g = law_of_last(q, T)
    closed = sum(p[y] for y in T) + sum(min(p[y], g[y]) for y in range(len(p)) if y not in T)
    if accepted(plan) != closed:
        errs.append(f"acceptance {accepted(plan)} != closed form {closed}")
    if min_cut(p, set_law(law)) != closed:
        errs.append(f"min cut {min_cut(p, set_law(law))} != {closed}")
    if min_cut(p, set_law(greedy_law(q, k, last_from_q=True))) > closed:
        errs.append("the last draft from q beats the greedy law")
    pf, qf = np.array(p, dtype=float), np.array(q, dtype=float)
    tuples, probs = GREEDY.draft_law(qf, k, replacement=k == 1)
    if [tuple(t) for t in tuples.tolist()] != list(law) \
            or np.abs(probs - np.array(list(law.values()), dtype=float)).max() > 1e-12:
        errs.append("package draft_law differs")
    J = GREEDY.joint(pf, qf, k, replacement=k == 1)
    if np.abs(J - np.array(list(plan.values()), dtype=float)).max() > 1e-12:
        errs.append("package joint differs")
    if abs(GREEDY.acceptance(pf, qf, k, replacement=k == 1) - float(closed)) > 1e-12:
        errs.append("package acceptance differs")
    lp = GREEDY.optimum(pf, qf, k, replacement=k == 1, solver="pot") if with_lp else None
    if with_lp and abs(lp - float(closed)) > 1e-9:
        errs.append("package LP optimum differs")
    return errs


def main() -> int:
    cases = [(p, q, True) for p in grid(3, 6) for q in grid(3, 6)]
    cases += [(p, q, False) for p in grid(4, 4) for q in grid(4, 4)]
    n, bad, broken = 0, [], 0
    for p, q, with_lp in cases:
        for k in range(1, sum(v > 0 for v in q) + 1):
            n += 1
            errs = check(p, q, k, with_lp)
            if errs:
                bad.append((p, q, k, errs))
            if k >= 2:
                plan = verifier_plan(p, q, k, proposal=list(q))       # forgets the top tokens
                out = [sum(row[y] for row in plan.values()) for y in range(len(p))]
                broken += out != list(p)
    for p, q, k, errs in bad[:5]:
        print("FAILED", [str(v) for v in p], [str(v) for v in q], k, errs[:3])
    print(f"greedy: {n - len(bad)}/{n} instances verified exactly (coupling, closed form, "
          f"min-cut certificate, package values); negative control lossy on {broken}")
    return 0 if not bad and broken > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
