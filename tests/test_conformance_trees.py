"""Tree verifiers of any shape, checked over whole generation loops: the package's tree rules
pass on per-depth and path-list layouts, i.i.d. and distinct children; a verifier that judges
every sibling against the unchanged target law fails; a malformed emission is named."""

from __future__ import annotations

import numpy as np
import pytest

from coupling import Tree
from coupling.conformance import GenerationRaised
from coupling.conformance.trees import check_tree_verifier, fill_tree, from_tree_rule

LAYOUTS = [Tree.from_spec("2,1"), Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)]),
           Tree.from_branching([2, 1], "distinct")]


@pytest.mark.parametrize("rule, tree", [("rrs", LAYOUTS[0]), ("traversal", LAYOUTS[1]),
                                        ("rrs", LAYOUTS[2])])
def test_the_package_tree_rules_pass(rule, tree):
    report = check_tree_verifier(from_tree_rule(rule), tree, draws=1500)
    assert report.ok, report.table()
    assert report.verifier.startswith(rule)


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


def test_a_verifier_without_the_residual_update_fails():
    report = check_tree_verifier(stale_siblings, Tree.from_spec("3"), draws=3000)
    assert not report.ok and report.tv > 0.02


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
