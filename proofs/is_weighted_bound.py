"""Claim: importance-sampling selection then speculative sampling (``coupling.rules.importance``,
registry key "is") is lossless for any selection; with the weights p/q the selected draft's law
q~ satisfies min(p, q~) >= min(p, q) token by token, so its acceptance is at least 1 - TV(p, q);
with the optimal selection both of its acceptances equal the LP optimum of k i.i.d. drafts.

Source: the architecture and the optimal-selection result (canonical decomposition) are
Khisti et al., "Multi-Draft Speculative Sampling: Canonical Architectures and Theoretical
Limits" (arXiv 2410.18234); the weighted bound is derived in this package (Jensen on
q~(y) = k p(y) E[1 / (w(y) + W)], module docstring).

Method: exact rational arithmetic (Fractions) on every pair with V = 3, probabilities multiples
of 1/6 (784 pairs; k = 2, 3) and V = 4, multiples of 1/4 (1225 pairs; k = 2):
1. q~ of the weighted selection is a distribution, and the architecture's plan (per tuple and
   selected position: the token rule for (p, q~)) is a coupling of the i.i.d. tuple law with p;
2. min(p(y), q~(y)) >= min(p(y), q(y)) for every token;
3. the package: ``RULES["is"]`` (induced law, joint, membership and selected acceptance)
   matches the exact values to 1e-12; ``ImportanceSampling("optimal")`` has both acceptances
   equal to the exact min cut of the i.i.d. set law to 1e-9 (V = 3, k = 2);
4. negative control: testing the selected draft against q instead of q~ is lossy (exact output
   TV > 0 on some instance).

Status: checked exhaustively (exact rationals on the stated grids).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
from _sets import accepted, coupling_errors, grid, min_cut, set_law, token_row
from _tuples import exact_tuple_law

from coupling import RULES
from coupling.rules.importance import ImportanceSampling, induced_law

ZERO = Fraction(0)
IS_W, IS_OPT = RULES["is"], ImportanceSampling("optimal")


def selection(p, q, x: tuple) -> list:
    w = [p[y] / q[y] for y in x]
    W = sum(w)
    return [v / W for v in w] if W > 0 else [Fraction(1, len(x))] * len(x)


def architecture(p, q, k: int, proposal=None):
    """``(q~, plan)``: the weighted selection's law and the plan tuple -> output masses;
    ``proposal`` replaces q~ in the test (the negative control)."""
    law = {t: m for t, m in exact_tuple_law(q, k, True).items() if m > 0}
    qt = [ZERO] * len(p)
    for t, m in law.items():
        for y, s in zip(t, selection(p, q, t), strict=True):
            qt[y] += m * s
    g = qt if proposal is None else proposal
    plan = {}
    for t, m in law.items():
        rows = [token_row(p, g, y, m * s) for y, s in zip(t, selection(p, q, t), strict=True)]
        plan[t] = [sum(col) for col in zip(*rows, strict=True)]
    return qt, law, plan


def check(p, q, k: int, with_optimal: bool) -> list[str]:
    qt, law, plan = architecture(p, q, k)
    errs = [] if sum(qt) == 1 else ["q~ does not sum to 1"]
    errs += coupling_errors(plan, law, p)
    if any(min(a, b) < min(a, c) for a, b, c in zip(p, qt, q, strict=True)):
        errs.append("min(p, q~) < min(p, q) somewhere")
    pf, qf = np.array(p, dtype=float), np.array(q, dtype=float)
    if np.abs(induced_law(pf, qf, k, "weighted") - np.array(qt, dtype=float)).max() > 1e-12:
        errs.append("package induced law differs")
    tuples, probs = IS_W.draft_law(qf, k)
    J = IS_W.joint(pf, qf, k)
    exact = np.array([plan.get(tuple(t), [ZERO] * len(p)) for t in tuples.tolist()], dtype=float)
    if np.abs(J - exact).max() > 1e-12:
        errs.append("package joint differs")
    if abs(IS_W.acceptance(pf, qf, k) - float(accepted(plan))) > 1e-12:
        errs.append("package membership acceptance differs")
    selected = sum(min(a, b) for a, b in zip(p, qt, strict=True))
    if abs(IS_W.selected_acceptance(pf, qf, k) - float(selected)) > 1e-12:
        errs.append("package selected acceptance differs")
    if with_optimal:
        opt = float(min_cut(p, set_law(exact_tuple_law(q, k, True))))
        if max(abs(IS_OPT.acceptance(pf, qf, k) - opt),
               abs(IS_OPT.selected_acceptance(pf, qf, k) - opt)) > 1e-9:
            errs.append("optimal selection misses the optimum")
    return errs


def main() -> int:
    cases = [(p, q, k, k == 2) for p in grid(3, 6) for q in grid(3, 6) for k in (2, 3)]
    cases += [(p, q, 2, False) for p in grid(4, 4) for q in grid(4, 4)]
    bad, broken = [], 0
    for p, q, k, with_optimal in cases:
        errs = check(p, q, k, with_optimal)
        if errs:
            bad.append((p, q, k, errs))
        _, _, plan = architecture(p, q, k, proposal=q)
        broken += [sum(row[y] for row in plan.values()) for y in range(len(p))] != list(p)
    for p, q, k, errs in bad[:5]:
        print("FAILED", [str(v) for v in p], [str(v) for v in q], k, errs[:3])
    print(f"is: {len(cases) - len(bad)}/{len(cases)} instances verified exactly (lossless, "
          f"min(p, q~) >= min(p, q), package values, optimal selection = optimum); negative "
          f"control lossy on {broken}")
    return 0 if not bad and broken > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
