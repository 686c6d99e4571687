"""Verification of draft trees of k paths: how far each rule sits from the optimum, and block
efficiency against k and gamma.

Every number in sections 1-3 is exact (enumeration of every ordered draft tree, and the
multi-path verifier LP solved by HiGHS with a certificate), not sampled.

1. Optimality gaps: expected accepted draft tokens per call, E[tau] (block efficiency is
   E[tau] + 1), of the token-level tree walks (rrs, kseq, optimal at each node), traversal,
   GBV (ranked by min(1, p/q) and by p/q), single-path block verification, and the optimum of
   the multi-path verifier LP (coupling.full_information_tree_accepted: every lossless
   verifier that sees the tree and knows both models), with each rule's gap to it; i.i.d.
   paths, and k distinct first tokens (GBV is defined for i.i.d. paths only).
2. GBV and traversal against single-path block verification on random pairs: how often each
   accepts less, and by how much.
3. Sweep: exact block efficiency of each rule for k = 1..4 and gamma = 2..4 on seeded
   TabularLM pairs (V = 2; V = 3 where the trees are few enough), and which rule wins.
4. Recorded calls: :func:`recorded_tokens` turns recorded draft trees (drafts, p, q) into each
   rule's tokens per call, the exact expectation given each tree. It is the hook for the
   real-model sweep (an engine that drafts trees records them); here it runs on trees drafted
   from the sweep's first TabularLM pair and is compared with that pair's exact value.

    .venv/bin/python benchmarks/bench_trees.py [--quick]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable

import numpy as np

from coupling import RULES, TabularLM, expected_accepted, full_information_tree_accepted
from coupling.lm import check_models, draft_tree
from coupling.rules.gbv import GBV

#: (V, gamma, k, seed, concentration) of the gap table: target TabularLM(seed=2 seed), draft
#: TabularLM(seed=2 seed + 1), context order 1
GAP_INSTANCES = ((2, 2, 2, 101, 1.0), (2, 3, 2, 102, 1.0), (2, 3, 3, 103, 1.0),
                 (3, 2, 2, 104, 1.0), (3, 2, 3, 105, 1.0), (3, 3, 2, 106, 1.0),
                 (3, 3, 3, 107, 1.0), (3, 2, 3, 108, 0.5))
#: rules of the gap table: label -> (rule, i.i.d. paths, distinct first tokens)
GAP_RULES = {"rrs": ("rrs", True, True), "kseq": ("kseq", True, False),
             "optimal": ("optimal", True, True), "traversal": ("traversal", True, True),
             "gbv": ("gbv", True, False), "gbv ratio": (GBV("ratio"), True, False),
             "block": ("block", True, True)}
SWEEP_RULES = ("block", "rrs", "kseq", "optimal", "traversal", "gbv")


def pair(V: int, seed: int, conc: float = 1.0) -> tuple[TabularLM, TabularLM]:
    return (TabularLM(V, 1, seed=2 * seed, concentration=conc),
            TabularLM(V, 1, seed=2 * seed + 1, concentration=conc))


def accepted(rule, t, d, gamma: int, k: int, replacement: bool = True) -> float:
    """Exact E[tau]; single-path block verification ignores all but one path."""
    if rule == "block":
        return float(expected_accepted("block", t, d, gamma))
    return float(expected_accepted(rule, t, d, gamma, k=k, replacement=replacement))


def gap_table(replacement: bool, quick: bool) -> None:
    labels = [lab for lab, (_, iid, wor) in GAP_RULES.items() if (iid if replacement else wor)]
    title = "k i.i.d. paths" if replacement else "k distinct first tokens, then one chain each"
    print(f"### {title}\n")
    print("| V, gamma, k, seed, conc | " + " | ".join(labels) + " | LP optimum |")
    print("|---" * (len(labels) + 2) + "|")
    gaps: dict = {lab: [] for lab in labels}
    for V, g, k, seed, conc in GAP_INSTANCES:
        if (not replacement and k > V) or (quick and V ** (g * k) > 800):
            continue
        t, d = pair(V, seed, conc)
        lp = full_information_tree_accepted(t, d, g, k, replacement=replacement)
        values = {lab: accepted(GAP_RULES[lab][0], t, d, g, k, replacement) for lab in labels}
        best = max(values.values())
        cells = []
        for lab in labels:
            if values[lab] > lp + 1e-9:
                raise AssertionError(f"{lab} exceeds the LP optimum by {values[lab] - lp:.3g}")
            gap = max(lp - values[lab], 0.0)
            gaps[lab].append(100 * gap / lp)
            cell = f"{values[lab]:.4f} ({100 * gap / lp:.1f}%)"
            cells.append(f"**{cell}**" if values[lab] == best else cell)
        print(f"| {V}, {g}, {k}, {seed}, {conc:g} | " + " | ".join(cells) + f" | {lp:.4f} |")
    print("| mean gap | " + " | ".join(f"{np.mean(gaps[lab]):.1f}%" for lab in labels)
          + " | 0 |\n")


def losses_table(n: int) -> None:
    print("| V | gamma | k | pairs | gbv < block | worst gbv - block | traversal < block "
          "| traversal < rrs walk |")
    print("|---|---|---|---|---|---|---|---|")
    for V, g in ((2, 2), (2, 3), (3, 2)):
        for k in (2, 3):
            gbv_loss, worst, trav_loss, trav_rrs = 0, 0.0, 0, 0
            for s in range(n):
                t, d = pair(V, 5000 + s, (0.5, 1.0)[s % 2])
                blk = accepted("block", t, d, g, 1)
                gv, tr = accepted("gbv", t, d, g, k), accepted("traversal", t, d, g, k)
                gbv_loss += gv < blk - 1e-12
                worst = min(worst, gv - blk)
                trav_loss += tr < blk - 1e-12
                trav_rrs += tr < accepted("rrs", t, d, g, k) - 1e-12
            print(f"| {V} | {g} | {k} | {n} | {gbv_loss} | {worst:+.4f} | {trav_loss} "
                  f"| {trav_rrs} |")
    print()


def sweep(pairs: int, max_trees: int) -> None:
    """Mean exact block efficiency per (V, gamma, k) and rule over ``pairs`` seeded pairs."""
    print("| V | gamma | k | " + " | ".join(SWEEP_RULES) + " | best |")
    print("|---" * (len(SWEEP_RULES) + 4) + "|")
    for V in (2, 3):
        for g in (2, 3, 4):
            for k in (1, 2, 3, 4):
                if V ** (g * k) > max_trees:
                    print(f"| {V} | {g} | {k} | " + " | ".join("-" for _ in SWEEP_RULES)
                          + f" | ({V}**{g})**{k} trees: not enumerated |")
                    continue
                values = {r: np.mean([accepted(r, *pair(V, 7000 + s), g, k) + 1
                                      for s in range(pairs)]) for r in SWEEP_RULES}
                top = max(values.values())
                best = " = ".join(r for r in SWEEP_RULES if values[r] > top - 1e-9)
                print(f"| {V} | {g} | {k} | " + " | ".join(f"{values[r]:.4f}" for r in
                                                          SWEEP_RULES) + f" | {best} |")
    print()


def recorded_tokens(rule, calls: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], *,
                    replacement: bool = True) -> float:
    """Mean tokens per call of ``rule`` over recorded calls ``(drafts [k, g], p [k, g+1, V],
    q [k, g, V])``: for traversal, gbv and block the exact expectation given each tree
    (1 + sum_i P(tau >= i | tree)), for the token-level walks their per-offset prediction
    along branch 0 (coupling.sequence.predict)."""
    values = []
    for drafts, p, q in calls:
        r = RULES[rule] if isinstance(rule, str) else rule
        k = drafts.shape[0]
        if r.max_drafts == 1:
            drafts, p, q = drafts[:1], p[:1], q[:1]
        beta = r.predict(drafts, p, q, 0, replacement=replacement or k == 1)
        values.append(r.expected_tokens(beta))
    return float(np.mean(values))


def drafted_calls(V: int, gamma: int, k: int, n: int, seed: int):
    """``n`` trees drafted from the sweep's first pair after the empty context."""
    T, D, ctx = check_models(*pair(V, 7000), ())
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield draft_tree(T, D, gamma, rng, ctx, k=k)


def recorded_table(n: int) -> None:
    print(f"| V | gamma | k | rule | exact | mean over {n} drafted trees | z |")
    print("|---|---|---|---|---|---|---|")
    for V, g, k in ((2, 3, 2), (3, 2, 3)):
        for rule in ("traversal", "gbv"):
            want = accepted(rule, *pair(V, 7000), g, k) + 1
            calls = list(drafted_calls(V, g, k, n, seed=V + g + k))
            per_call = [recorded_tokens(rule, [c]) for c in calls]
            z = (np.mean(per_call) - want) / (np.std(per_call) / math.sqrt(n))
            print(f"| {V} | {g} | {k} | {rule} | {want:.4f} | {np.mean(per_call):.4f} "
                  f"| {z:+.2f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small instances only")
    args = parser.parse_args()
    print("## 1. Optimality gaps: E[tau] (gap to the LP optimum, in % of it), best in bold\n")
    gap_table(True, args.quick)
    gap_table(False, args.quick)
    print("## 2. Against single-path block verification, random pairs (count of pairs)\n")
    losses_table(6 if args.quick else 30)
    print("## 3. Block efficiency E[tau] + 1, mean over seeded pairs, i.i.d. paths\n")
    sweep(1 if args.quick else 3, 5_000 if args.quick else 70_000)
    print("## 4. Recorded trees: the exact tokens per call given each tree, averaged\n")
    recorded_table(500 if args.quick else 4000)


if __name__ == "__main__":
    main()
