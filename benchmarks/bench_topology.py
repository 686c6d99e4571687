"""Static draft trees of published shapes, exactly: tokens per target call of each rule that
verifies a topology (node by node, or leaf to root as traversal does), against the tree LP's
optimum (every lossless verifier that sees the drafted tree and knows both models).

Trees (``coupling.Tree``): the first ``n`` nodes of Medusa's and EAGLE's default layouts (their
lists run likeliest first, so a prefix is that layout's best tree of ``n`` nodes), SpecInfer's
expansion <1, 1, 3, 1, ...>, and a Sequoia-shaped tree (three root children, two under the
first, chains below), each with i.i.d. children (the rules' own draft law) and with top-k
children (as Medusa and EAGLE draft them; only drafter-invariant rules verify those). Models:
seeded order-1 TabularLM pairs; the LP for trees of 8 nodes over V = 3 (the exact
enumeration of every filling of a 16-node tree is past its bound there), tokens per call for
16 nodes over V = 2 as well. Every number is exact (enumeration), none sampled.

    .venv/bin/python benchmarks/bench_topology.py [--pairs N]
"""

from __future__ import annotations

import argparse

import numpy as np

from coupling import RULES, TabularLM, Tree, block_efficiency, full_information_tree_accepted

RULE_NAMES = ("rrs", "kseq", "optimal", "traversal", "strict")
SEQUOIA_LIKE = ((0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0), (1, 0), (0, 0, 0, 0),
                (0, 1, 0, 0), (1, 0, 0), (2, 0), (0, 0, 0, 0, 0), (0, 1, 0, 0, 0),
                (1, 0, 0, 0), (2, 0, 0))


def trees(n: int, children: str) -> dict[str, Tree]:
    return {"medusa": Tree.named("medusa", size=n, children=children),
            "eagle": Tree.named("eagle", size=n, children=children),
            "specinfer": Tree.named("specinfer", size=n, children=children),
            "sequoia-like": Tree.from_paths(SEQUOIA_LIKE[:n], children=children)}


def row(tree: Tree, t, d, lp: bool) -> dict[str, float]:
    out = {}
    for name in RULE_NAMES:
        try:
            out[name] = float(block_efficiency(name, t, d, tree=tree))
        except ValueError:
            out[name] = float("nan")
    if lp:
        out["LP"] = float(full_information_tree_accepted(t, d, tree=tree)) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5, help="seeded model pairs to average over")
    args = ap.parse_args()
    for V, n, lp in ((3, 8, True), (2, 16, False)):
        cols = (*RULE_NAMES, "LP") if lp else RULE_NAMES
        for children in ("iid", "topk"):
            fit = {k: t for k, t in trees(n, children).items()
                   if children != "topk" or max(len(c) for c in t.kids) <= V}
            if not fit:      # top-k children need as many tokens as a node has children
                continue
            print(f"\nV = {V}, {n}-node trees, {children} children: tokens per target call, "
                  f"mean over {args.pairs} pairs")
            print(f"{'tree':<14}" + "".join(f"{c:>10}" for c in cols))
            for label, tree in fit.items():
                vals = [row(tree, TabularLM(V, order=1, seed=2 * s, concentration=0.6),
                            TabularLM(V, order=1, seed=2 * s + 1, concentration=0.6), lp)
                        for s in range(args.pairs)]
                mean = {k: float(np.mean([v[k] for v in vals])) for k in cols}
                print(f"{label:<14}" + "".join(f"{mean[c]:>10.4f}" for c in cols))
    print(f"\nrules: {', '.join(f'{n} ({RULES[n].title})' for n in RULE_NAMES)}; "
          "nan: the rule cannot verify that tree (coupling.rules.topology.check_tree_rule)")


if __name__ == "__main__":
    main()
