"""Tree verifiers of any shape, checked over whole generation loops, sampled and exactly: the
package's tree rules pass on per-depth and path-list layouts, i.i.d. and distinct children; a
verifier that judges every sibling against the unchanged target law fails; a malformed
emission is named."""

from __future__ import annotations

import numpy as np
import pytest

from coupling import Tree
from coupling.conformance import GenerationRaised
from coupling.conformance.trees import check_tree_verifier, fill_tree, fillings, from_tree_rule

LAYOUTS = [Tree.from_spec("2,1"), Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)]),
           Tree.from_branching([2, 1], "distinct")]


def test_a_package_tree_rule_passes_the_sampled_loop():
    report = check_tree_verifier(from_tree_rule("rrs"), LAYOUTS[0], draws=1500)
    assert report.ok, report.table()
    assert report.verifier.startswith("rrs")


@pytest.mark.parametrize("rule, tree", [("rrs", LAYOUTS[0]), ("kseq", LAYOUTS[0]),
                                        ("optimal", LAYOUTS[0]), ("traversal", LAYOUTS[1]),
                                        ("rrs", LAYOUTS[2]), ("traversal", LAYOUTS[2])])
def test_the_package_tree_rules_are_exactly_lossless(rule, tree):
    report = check_tree_verifier(from_tree_rule(rule), tree, exact=True)
    assert report.ok and report.tv < 1e-12 and report.mode == "exact", report.table()


def test_fillings_are_the_law_of_the_drafter():
    draft = lambda c: np.array([0.2, 0.3, 0.5])                          # noqa: E731
    for tree in LAYOUTS:
        fills = fillings(tree, (), draft)
        assert abs(sum(pr for _, pr in fills) - 1.0) < 1e-12
        if tree.children == "distinct":
            assert all(t[0] != t[1] for t, _ in fills)


def stale_siblings(tree, drafts, p, q, rng):
    """Each child of the accepted node judged by min(1, p/q) against the target's law after
    its parent, with no residual after a rejected sibling (SpecInfer without its update)."""
    node, out = -1, []
    while True:
        row = 1 + node
        for c in tree.kids[node]:
            x = int(drafts[c])
            if rng.random() * q[row, x] < p[row, x]:
                node = c
                out.append(x)
                break
        else:
            law = p[row]
            return out + [int(rng.choice(law.size, p=law / law.sum()))]


def stale_siblings_law(tree, drafts, p, q):
    """The exact law of :func:`stale_siblings`' emission given the drafted tree."""
    out: dict = {}

    def walk(node, head, mass):
        row = 1 + node
        for c in tree.kids[node]:
            x = int(drafts[c])
            a = min(1.0, p[row, x] / q[row, x]) if q[row, x] > 0 else 0.0
            walk(c, head + (x,), mass * a)
            mass *= 1.0 - a
        for y in np.flatnonzero(p[row] > 0).tolist():
            out[head + (y,)] = out.get(head + (y,), 0.0) + mass * p[row, y] / p[row].sum()

    walk(-1, (), 1.0)
    return out


stale_siblings.law = stale_siblings_law


def test_a_verifier_without_the_residual_update_fails():
    report = check_tree_verifier(stale_siblings, Tree.from_spec("3"), draws=3000)
    assert not report.ok and report.tv > 0.02
    exact = check_tree_verifier(stale_siblings, Tree.from_spec("3"), exact=True)
    assert not exact.ok and exact.tv > 0.02, exact.table()
    with pytest.raises(TypeError, match="verify.law"):
        check_tree_verifier(lambda *a: [0], Tree.from_spec("2"), exact=True)
    with pytest.raises(TypeError, match="processing"):
        check_tree_verifier(stale_siblings, Tree.from_spec("2"), exact=True, processing=abs)


def test_a_malformed_emission_is_named_and_fills_follow_the_child_law():
    with pytest.raises(GenerationRaised, match="root-to-node path"):
        check_tree_verifier(lambda tree, d, p, q, rng: [int(d[0]), int(d[1]), 0],
                            Tree.from_spec("2"),
                            draws=50, pairs=[(lambda c: np.array([0.5, 0.5]),
                                              lambda c: np.array([0.0, 1.0]))])
    with pytest.raises(TypeError, match="coupling.Tree"):
        check_tree_verifier(from_tree_rule("rrs"), [[0], [1]])
    tree = Tree.from_branching([3], "distinct")
    tokens = fill_tree(lambda c: np.array([0.2, 0.3, 0.5]), tree, (),
                       np.random.default_rng(0))
    assert sorted(tokens.tolist()) == [0, 1, 2]
