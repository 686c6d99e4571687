"""Claim: block verification is an optimal lossless verifier: no verifier that is lossless for
the given model pair accepts more draft tokens per iteration in expectation, even one that
knows both models completely (every off-path conditional), on every instance checked.

This implies, on those instances, the paper's optimality theorem (Sun et al., "Block
Verification Accelerates Speculative Decoding", ICLR 2025, arXiv:2403.10444, Theorem 2):
among verifiers that see only the drafted block and the conditionals along it and are valid
for every pair of models, block verification maximises E[tau]; the information-restricted
class is a subset of the class checked here. Thomas & Pal (arXiv:2602.16961) prove the
stronger full-information statement in general; this script checks it independently.

Method: for each instance, coupling.verifier_lp builds the LP over all one-iteration
verifiers pi(tau, y | x) (emit the first tau drafts and one token y; the target continues)
whose stream law equals the target's (one equality per string of length gamma + 1), with
exact rational coefficients. HiGHS solves it; VerifierLP.dual_bound turns the solver's dual
into an exactly dual-feasible rational vector, whose objective is a rigorous upper bound U
on every lossless verifier. Block verification's exact E[tau] (fractions) is attained by a
lossless verifier (proofs/block_lossless.py), so the optimum lies in [E_block, U]. The claim
is verified on an instance when U - E_block <= 1e-9 (and we report how often rounding the
dual to small denominators gives U == E_block exactly). Instances: exact rational random
models, context order 0, 1, 2; V = 2 with gamma = 1..5, V = 3 with gamma = 1..4, V = 4 with
gamma = 1, 2; 20 pairs per (V, gamma), a third with exact zeros (220 instances); plus
token <= block exactly on each.

Status: verified on all 220 instances: the rigorous bound is within 1.1e-15 of block
verification's exact E[tau] on every one, and on 215 of them the rounded dual is an exact
rational certificate that the full-information optimum EQUALS it. Not a proof for all V
and gamma.
"""

from __future__ import annotations

import sys

from _block_common import rational_lm

from coupling import expected_accepted, verifier_lp

TOL = 1e-9


def main() -> int:
    n = exact_eq = 0
    worst = 0.0
    for V, gammas in ((2, (1, 2, 3, 4, 5)), (3, (1, 2, 3, 4)), (4, (1, 2))):
        for gamma in gammas:
            for k in range(20):
                order, zeros = k % 3, k % 3 == 2
                t = rational_lm(V, order, seed=7000 + 100 * V + 10 * gamma + k, zeros=zeros)
                d = rational_lm(V, order, seed=9000 + 100 * V + 10 * gamma + k, zeros=zeros)
                blk = expected_accepted("block", t, d, gamma)
                tok = expected_accepted("token", t, d, gamma)
                if tok > blk:
                    print(f"token beats block: {t.describe} gamma={gamma}: {tok} > {blk}")
                    return 1
                lp = verifier_lp(t, d, gamma)
                value, _, y = lp.solve()
                bound = lp.dual_bound(y)
                rounded = lp.dual_bound(y, limit_denominator=10_000)
                if rounded == blk:
                    exact_eq += 1
                bound = min(bound, rounded)
                gap = float(bound - blk)
                worst = max(worst, gap)
                if bound < blk or gap > TOL:
                    print(
                        f"NOT OPTIMAL? {t.describe} gamma={gamma}: block {float(blk):.12f}, "
                        f"LP {value:.12f}, certified bound {float(bound):.12f}"
                    )
                    return 1
                n += 1
                print(
                    f"V={V} gamma={gamma} order={order}: block = {float(blk):.12f}, "
                    f"full-information optimum <= {float(bound):.12f} (gap {gap:.1e})"
                )
    print(
        f"{n} instances: block verification is within {worst:.1e} of a rigorous upper bound "
        f"on every lossless verifier ({exact_eq} with an exact rational certificate of equality)"
    )
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
