"""Exact acceptance of every multi-draft rule against k, per draft law, and Khisti et al.'s
Figure 2, exactly.

Part 1: for k = 1..4 on three seeded (target, draft) pairs, the acceptance (P(the output is one
of the drafts), exact) of every multi-draft rule of the registry under each draft law it
verifies, next to the LP optimum of that law:

* ``iid``: k i.i.d. draws from q (``replacement=True``);
* ``wor``: k distinct draws by successive sampling (``replacement=False``);
* ``greedy``: the k - 1 likeliest tokens of q and one draw from the rest (the ``greedy`` rule's
  law; ``spechub``'s pairs have the same set law at k = 2).

A rule is listed under a law when its draft *set* law (what its LP sees) is that law's. ``is``
appears twice: the registry's weighted selection and the optimal selection (a parameter).
The script asserts that no rule exceeds the optimum of its law, that ``greedy``, ``spechub``
and ``is`` with optimal selection attain it, and that ``optimal`` equals the LP.

Part 2: Figure 2 of Khisti et al. (V = 3, two identical drafts, the uniform law against
(q1, q2, s - q2)), read with the uniform law as the target (this package's reading), then the
other reading (the varied law as the target) as a note; see
:mod:`coupling.rules.importance.figure2`.

Run: ``python benchmarks/compare_multidraft.py`` (exact computations only; about 10 s).
"""

from __future__ import annotations

import sys

import numpy as np

from coupling import RULES, solve_coupling, solve_draft_law, tuple_law, tv
from coupling.lp.draftsets import group_by_set
from coupling.rules.importance import ImportanceSampling
from coupling.rules.importance.figure2 import CURVES, PANELS, figure2_curves, figure2_point

KS = (1, 2, 3, 4)
LAWS = ("iid", "wor", "greedy")
IS_OPTIMAL = ImportanceSampling("optimal")
#: short column labels of Figure 2's curves
SHORT = {"optimal": "OPT", "is optimal selection": "IS-opt", "is weighted, selected": "IS-w sel",
         "is weighted": "IS-w", "kseq": "K-SEQ", "rrs": "RRS"}


def pairs() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The seeded (target, draft) pairs."""
    out = {}
    rng = np.random.default_rng(0)
    out["dirichlet(0.5), V=8, seed 0"] = tuple(rng.dirichlet(np.full(8, 0.5), size=2))
    rng = np.random.default_rng(1)
    z = rng.normal(scale=2.0, size=10)
    zq = z + rng.normal(scale=0.7, size=10)
    out["peaked logits, V=10, seed 1"] = (np.exp(z) / np.exp(z).sum(),
                                          np.exp(zq) / np.exp(zq).sum())
    rng = np.random.default_rng(2)
    out["dirichlet(1), V=10, seed 2"] = tuple(rng.dirichlet(np.ones(10), size=2))
    return out


def law_tuples(law: str, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if law == "greedy":
        return RULES["greedy"].draft_law(q, k, replacement=k == 1)
    return tuple_law(q, k, replacement=law == "iid")


def same_sets(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
              V: int) -> bool:
    """Whether two laws of draft tuples have the same law of the drafted *set*."""
    (_, ma, sa), (_, mb, sb) = group_by_set(*a, V), group_by_set(*b, V)
    return sa.shape == sb.shape and bool((sa == sb).all()) and np.allclose(ma, mb, atol=1e-15)


def columns(q: np.ndarray, k: int):
    """``(law, label, rule)`` of every lossless multi-draft rule and the law it verifies at
    ``k`` (a lossy rule may pass the lossless optimum: ``bench_lossy_invariant.py``)."""
    cols = []
    multi = [(n, r) for n, r in RULES.items()
             if r.unit == "token" and r.max_drafts != 1 and r.lossless]
    multi.append(("is(optimal)", IS_OPTIMAL))
    for law in LAWS:
        want = law_tuples(law, q, k)
        for name, rule in multi:
            rep = law == "iid"
            if rule.supports(k, rep) and same_sets(rule.draft_law(q, k, replacement=rep),
                                                   want, q.size):
                cols.append((law, name, rule))
    return cols


def acceptance_table(p: np.ndarray, q: np.ndarray) -> list[str]:
    """Rows k = 1..4; per law, its LP optimum then the rules that verify it (at some k >= 2)."""
    cols = {k: columns(q, k) for k in KS}
    order = [*RULES, "is(optimal)"]
    header = []
    for law in LAWS:
        names = {name for k in KS[1:] for lw, name, _ in cols[k] if lw == law}
        header += [(law, "LP")] + [(law, n) for n in order if n in names]
    lines = ["  k" + "".join(f"{law + ':' + n:>16}" for law, n in header)]
    for k in KS:
        row = {(law, "LP"): solve_draft_law(p, *law_tuples(law, q, k)).acceptance
               for law in LAWS}
        for law, name, rule in cols[k]:
            a = rule.acceptance(p, q, k, replacement=law == "iid" or k == 1)
            assert a <= row[(law, "LP")] + 1e-9, (law, name, k)
            if name in ("optimal", "greedy", "spechub", "is(optimal)"):
                assert abs(a - row[(law, "LP")]) < 1e-9, (law, name, k)
            row[(law, name)] = a
        lines.append(f"  {k}" + "".join(f"{row[c]:>16.5f}" if c in row else f"{'-':>16}"
                                        for c in header))
    return lines


def figure2_table(target: str) -> list[str]:
    lines = []
    for panel, (q1, s) in PANELS.items():
        lines.append(f"{panel} panel, varied law = ({q1:.4g}, q2, {s:.4g} - q2):")
        lines.append("    q2   " + "".join(f"{SHORT[c]:>10}" for c in CURVES))
        for x in np.linspace(0.0, s, 13):
            c = figure2_point(panel, float(x), target=target)
            lines.append(f"  {x:.4f} " + "".join(f"{c[n]:>10.5f}" for n in CURVES))
        xs = np.linspace(0.0, s, 241)
        cur = figure2_curves(panel, xs, target=target)
        one = {n: xs[cur[n] > 1 - 1e-12] for n in ("optimal", "is weighted", "kseq", "rrs")}
        lines.append("  acceptance 1 on the 241-point grid: " + "; ".join(
            f"{SHORT[n]} " + (f"[{v.min():.4f}, {v.max():.4f}]" if v.size else "never")
            for n, v in one.items()))
        lines.append("")
    return lines


def main() -> int:
    print("# Exact acceptance vs k, per draft law (LP = the optimum of that law)\n")
    print("iid: k i.i.d. draws; wor: k distinct draws (successive sampling); greedy: the k-1")
    print("likeliest tokens of q and one draw from the rest (spechub: the same set law, k = 2).")
    print("is: weights p/q; is(optimal): an optimal plan's weights.\n")
    for label, (p, q) in pairs().items():
        print(f"{label}: TV(p, q) = {tv(p, q):.4f}")
        print("\n".join(acceptance_table(p, q)))
        print()
        for k in KS[1:]:
            lp = solve_coupling(p, q, k).acceptance
            assert abs(RULES["optimal"].acceptance(p, q, k) - lp) < 1e-9
    print("# Khisti et al., Figure 2 (two identical drafts, V = 3), exact\n")
    print("OPT: the optimum (min cut); IS-opt: IS with an optimal plan's weights (selected")
    print("draft accepted); IS-w sel: IS with weights p/q, P(the selected draft is accepted), the")
    print("paper's quantity; IS-w: the same rule, P(the output is one of the drafts); K-SEQ:")
    print("SpecTr; RRS: SpecInfer.\n")
    print("## Target = the uniform law, draft = the varied law (this package's reading)\n")
    print("\n".join(figure2_table("uniform")))
    print("## Note: the other reading, target = the varied law, draft = the uniform law\n")
    print("\n".join(figure2_table("varied")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
