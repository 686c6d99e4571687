"""How much any lossless tree verifier can gain over recursive rejection sampling without
replacement: the ceiling of UniVer's claims (Weng, Hu, Yairi, arXiv:2605.04543), exactly.

Its claims, in its words (abstract): UniVer "remains lossless and achieves the optimal
acceptance rate under the proposed conditional framework", and "improves acceptance length by
4.2% to 8.5% over standard recursive rejection sampling without replacement". Its text and
code are not public in the material this package can read, so UniVer itself is not built here;
what can be settled exactly is the ceiling: no lossless verifier of a drafted tree, whatever it
reads, accepts more than the full-information tree LP (:func:`coupling.tree_verifier_lp`, the
drafted tree and both models known), so a gain over ``rrs`` above the LP's is impossible.

Here: draft trees whose siblings are drawn without replacement (EAGLE's and SpecInfer's
layout; ``children="distinct"``): two children under each of two levels (``[2, 2]``, 6 nodes)
and two distinct chains of 3 tokens (6 nodes), on ``--pairs`` random order-1 ``TabularLM``
pairs over V = 3 (Dirichlet concentration 0.3, 0.6 or 1). For each, exact tokens per call of
``rrs`` (recursive rejection sampling without replacement, the baseline the claim names),
``traversal`` (Weng et al.'s earlier tree rule), ``optimal`` (the per-node optimal transport
walk) and the LP; the gains are ratios of tokens per call, as acceptance lengths are.

    .venv/bin/python benchmarks/bench_univer.py [--pairs 1000]
"""

from __future__ import annotations

import argparse

import numpy as np

from coupling import (
    SolverError,
    TabularLM,
    Tree,
    accepted_length_law,
    full_information_tree_accepted,
)

TREES = {"[2, 2]": Tree.from_branching([2, 2], "distinct"),
         "2 chains of 3": Tree.from_chains(2, 3, replacement=False)}
RULES = ("traversal", "optimal")
#: the claimed gain of UniVer over rrs, lowest and highest
CLAIMED = (0.042, 0.085)


def pairs(n: int):
    rng = np.random.default_rng(1)
    for s in range(n):
        c = float(rng.choice([0.3, 0.6, 1.0]))
        yield (TabularLM(3, order=1, seed=2 * s, concentration=c),
               TabularLM(3, order=1, seed=2 * s + 1, concentration=c))


def tokens_per_call(rule: str, target, draft, tree: Tree) -> float:
    law = accepted_length_law(rule, target, draft, tree=tree)
    return 1.0 + float(law @ np.arange(law.size))


def gains(n: int) -> dict[str, dict[str, np.ndarray]]:
    """``{tree: {rule or "LP": [n] gain in tokens per call over rrs}}``."""
    out = {name: {r: [] for r in (*RULES, "LP")} for name in TREES}
    for t, d in pairs(n):
        for name, tree in TREES.items():
            base = tokens_per_call("rrs", t, d, tree)
            for r in RULES:
                out[name][r].append(tokens_per_call(r, t, d, tree) / base - 1)
            try:
                lp = 1.0 + full_information_tree_accepted(t, d, tree=tree)
            except SolverError:      # no certified optimum: the pair is left out of the LP row
                lp = np.nan
            out[name]["LP"].append(lp / base - 1)
    return {name: {r: np.array(v) for r, v in rs.items()} for name, rs in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    args = ap.parse_args()
    g = gains(args.pairs)
    lo, hi = CLAIMED
    print(f"{args.pairs} random pairs over V = 3; gain in tokens per call over rrs (without "
          "replacement), exact")
    print(f"{'tree':<14} {'verifier':<10} {'mean':>7} {'median':>7} {'5%':>7} {'95%':>7} "
          f"{'max':>7} {f'< {lo:.1%}':>8} {f'>= {hi:.1%}':>8}")
    for name, rs in g.items():
        missing = int(np.isnan(rs["LP"]).sum())
        if missing:
            print(f"{name}: the LP has no certified optimum on {missing} pair(s), left out")
        for r, x in rs.items():
            x = x[~np.isnan(x)]
            print(f"{name:<14} {r:<10} {x.mean():>+7.1%} {np.median(x):>+7.1%} "
                  f"{np.quantile(x, .05):>+7.1%} {np.quantile(x, .95):>+7.1%} {x.max():>+7.1%} "
                  f"{np.mean(x < lo):>8.1%} {np.mean(x >= hi):>8.1%}")
        # the control: a lossless rule above the LP would be a bug in one of them
        above = max(float(np.nanmax(rs[r] - rs["LP"])) for r in RULES)
        print(f"{'':<14} largest excess of a rule over the LP: {above:+.1e}")


if __name__ == "__main__":
    main()
