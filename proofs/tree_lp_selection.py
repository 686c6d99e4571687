"""Claim: the best lossless verifier of a draft tree of k paths is a randomised path selection
followed by block verification of the selected path; for k = 1 it is block verification; and
every tree rule of the package stays below it.

The multi-path verifier LP (coupling.tree_verifier_lp: every lossless verifier that sees the
drafted tree and knows both models) has the optimum of its path-selection form
(coupling.path_selection_lp: the laws Q' of a path selected from the tree, Q'(S) <= P(the
tree holds a path of S) for every set S of paths, by Gale's theorem, with single-path block
verification's value as objective), and block verification of a path drawn from an optimal
Q' attains it. With one path the LP is coupling.verifier_lp, whose optimum block verification
attains. Traversal, GBV (both ranks) and the token-level tree walks (rrs, kseq, optimal) see
less than the LP's verifier, so none exceeds its optimum.

Source: the factorisation into "randomised selection + single-path block verification" is
reported by the reviewers of Thomas & Pal (arXiv:2602.16961) as the paper's theorem (the full
text was not available); the path-selection form is derived here (coupling/sequence/tree_lp).

Method: numerical (HiGHS, each optimum certified by coupling.lp.solvers.certified_lp: primal and
dual feasibility and duality gap within 1e-9), on seeded order-1 TabularLM pairs: V = 2, 3;
gamma = 2, 3 (at most 9 draft paths for the selection form); k = 2, 3; i.i.d. paths and
distinct first tokens; the three values must agree within 1e-8, the single-path LP must equal
verifier_lp and block within 1e-9, and every rule must be at most the optimum + 1e-9.

Status: verified numerically on the stated instances (not a proof for all pairs).
"""

from __future__ import annotations

import sys

import _block_common  # noqa: F401  (puts the repository root on sys.path)

from coupling import (
    TabularLM,
    expected_accepted,
    full_information_accepted,
    full_information_tree_accepted,
    path_selection_lp,
)
from coupling.rules.gbv import GBV
from coupling.sequence import selection_model

CASES = [(2, 2, 2, True), (2, 2, 3, True), (3, 2, 2, True), (3, 2, 3, True), (2, 3, 2, True),
         (2, 3, 3, True), (2, 2, 2, False), (3, 2, 2, False), (3, 2, 3, False),
         (2, 3, 2, False)]
#: (label, rule, whether it verifies distinct first tokens)
RULES = [("traversal", "traversal", True), ("gbv", "gbv", False),
         ("gbv rank=ratio", GBV("ratio"), False), ("rrs walk", "rrs", True),
         ("kseq walk", "kseq", False), ("optimal walk", "optimal", True)]


def main() -> int:
    for n, (V, gamma, k, rep) in enumerate(CASES):
        t = TabularLM(V, 1, seed=2 * (21 + n), concentration=1.0)
        d = TabularLM(V, 1, seed=2 * (21 + n) + 1, concentration=1.0)
        lp = full_information_tree_accepted(t, d, gamma, k, replacement=rep)
        sel, mass = path_selection_lp(t, d, gamma, k, replacement=rep)
        blk = expected_accepted("block", t, selection_model(mass, V), gamma)
        label = f"V={V} gamma={gamma} k={k} {'iid' if rep else 'distinct-first'}"
        if abs(lp - sel) > 1e-8 or abs(lp - blk) > 1e-8:
            print(f"{label}: LP {lp!r}, selection LP {sel!r}, block of the selection {blk!r}")
            return 1
        best = max((expected_accepted(r, t, d, gamma, k=k, replacement=rep), label)
                   for label, r, wor in RULES if rep or wor)
        if best[0] > lp + 1e-9:
            print(f"{label}: {best[1]} exceeds the optimum: {best[0]!r} > {lp!r}")
            return 1
        one = full_information_tree_accepted(t, d, gamma, 1)
        if abs(one - full_information_accepted(t, d, gamma)) > 1e-9 or \
                abs(one - expected_accepted("block", t, d, gamma)) > 1e-9:
            print(f"{label}: the single-path tree LP is not verifier_lp / block")
            return 1
        print(f"{label}: LP = selection LP = block of its selection = {lp:.10f}; best rule "
              f"{best[1]} {best[0]:.10f}; k = 1: {one:.10f} = block")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
