"""Delayed tree expansion (Thomas, Kitanovski, Goldblum, Pal, arXiv:2602.16994), exactly.

Its claims, in its words (abstract): on i.i.d. rollouts "Traversal Verification dominates
consistently, with OT-based methods lagging far behind"; "OT-based methods achieve high
multi-token acceptance near the root of the draft tree, while multi-token gains are most
impactful deeper"; delayed tree expansion, "which drafts a partial single path, delaying the
i.i.d. branching point", "preserves the target distribution and improves on root-node i.i.d
rollouts".

Here: ``k = 2`` paths of ``gamma = 3`` tokens branching at the root (``Tree.from_chains(2,
3)``), the same two paths sharing their first ``t = 1`` or ``2`` tokens (the delayed trees),
and root-branching trees of the delayed trees' sizes and depth (the same node budget), on
``--pairs`` random order-1 ``TabularLM`` pairs (V = 2 or 3, Dirichlet concentration 0.3, 0.6
or 1), every number exact: tokens per call of ``rrs`` (SpecInfer), ``kseq`` (SpecTr) and
``optimal`` (the per-node optimal transport) against ``traversal``, where each rule's
acceptance sits by depth (``P(accepted >= d)``), and how often delaying helps. ``LP`` is the
full-information tree LP of the same trees (:func:`coupling.tree_verifier_lp`), the ceiling of
every lossless verifier; its column by depth is one optimal solution's (the optimum need not be
unique), and it is solved on the root tree and the delayed trees only (a few tenths of a second
per tree and pair).

    .venv/bin/python benchmarks/bench_delayed.py [--pairs 1000]
"""

from __future__ import annotations

import argparse

import numpy as np

from coupling import TabularLM, Tree, accepted_length_law, tree_verifier_lp

RULES = ("rrs", "kseq", "optimal", "traversal")
#: the trees whose LP is solved
LP_TREES = ("root", "delayed t=1", "delayed t=2")
TREES = {"root": Tree.from_chains(2, 3),
         "delayed t=1": Tree.from_paths([(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)]),
         "delayed t=2": Tree.from_paths([(0,), (0, 0), (0, 0, 0), (0, 0, 1)]),
         # root-branching trees of the delayed trees' sizes and depth: the same node budget
         "root, 5 nodes": Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]),
         "root, 4 nodes": Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)])}
#: each delayed tree against the root trees it is compared with
AGAINST = {"delayed t=1": ("root", "root, 5 nodes"), "delayed t=2": ("root", "root, 4 nodes")}


def pairs(n: int):
    rng = np.random.default_rng(0)
    for s in range(n):
        V = int(rng.choice([2, 3]))
        c = float(rng.choice([0.3, 0.6, 1.0]))
        yield (TabularLM(V, order=1, seed=2 * s, concentration=c),
               TabularLM(V, order=1, seed=2 * s + 1, concentration=c))


def lp_law(target, draft, tree: Tree) -> np.ndarray:
    """The accepted-length law ``[depth + 1]`` of an optimal solution of the tree LP."""
    _, emitted = tree_verifier_lp(target, draft, tree=tree).solve()
    law = np.zeros(tree.depth + 1)
    for u, m in emitted.items():
        law[len(u) - 1] += m
    return law


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    args = ap.parse_args()
    # laws[tree][rule]: [pairs, gamma + 1] accepted-length laws
    laws = {t: {r: [] for r in (*RULES, "LP")} for t in TREES}
    for t, d in pairs(args.pairs):
        for name, tree in TREES.items():
            for rule in RULES:
                law = accepted_length_law(rule, t, d, tree=tree)
                laws[name][rule].append(np.pad(law, (0, 4 - law.size)))
            if name in LP_TREES:
                law = lp_law(t, d, tree)
                laws[name]["LP"].append(np.pad(law, (0, 4 - law.size)))
    be = {t: {r: 1 + np.array(v) @ np.arange(4) for r, v in rs.items() if v}
          for t, rs in laws.items()}
    print(f"{args.pairs} random pairs; tokens per call, mean [5%, 95% quantiles]")
    print(f"{'tree':<13}" + "".join(f"{r:>22}" for r in (*RULES, "LP")))
    for name in TREES:
        cells = [f"{x.mean():.4f} [{np.quantile(x, .05):.3f}, {np.quantile(x, .95):.3f}]"
                 if x is not None else "-" for x in (be[name].get(r) for r in (*RULES, "LP"))]
        print(f"{name:<13}" + "".join(f"{c:>22}" for c in cells))
    root = be["root"]
    print("\nroot i.i.d. rollouts: traversal against each OT rule")
    for r in (*RULES[:3], "LP"):
        diff = root["traversal"] - root[r]
        print(f"  vs {r:<8} traversal ahead on {100 * np.mean(diff > 1e-12):5.1f}% of pairs, "
              f"behind on {100 * np.mean(diff < -1e-12):5.1f}%; mean {diff.mean():+.4f} "
              f"tokens per call, worst {diff.min():+.4f}")
    print("\nwhere acceptance sits, root tree: mean P(accepted >= d), d = 1, 2, 3")
    for r in (*RULES, "LP"):
        tail = np.array(laws["root"][r])[:, ::-1].cumsum(1)[:, ::-1][:, 1:]
        print(f"  {r:<10}" + "".join(f"{x:8.4f}" for x in tail.mean(0)))
    print("\ndelaying the branching point, against root branching (same paths; same nodes)")
    for name, others in AGAINST.items():
        for other in others:
            for r in (r for r in (*RULES, "LP") if r in be[name] and r in be[other]):
                diff = be[name][r] - be[other][r]
                print(f"  {name} vs {other:<13} {r:<10} better on "
                      f"{100 * np.mean(diff > 1e-12):5.1f}% of pairs, worse on "
                      f"{100 * np.mean(diff < -1e-12):5.1f}%; mean {diff.mean():+.4f}")


if __name__ == "__main__":
    main()
