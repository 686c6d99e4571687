"""The multi-path verifier LP (:mod:`coupling.sequence.tree_lp`): the optimum the tree rules are
measured against, its single-path case, its path-selection form, and its inputs."""

from __future__ import annotations

import numpy as np
import pytest

from coupling import (
    SolverError,
    TabularLM,
    expected_accepted,
    full_information_accepted,
    full_information_tree_accepted,
    path_selection_lp,
    tree_verifier_lp,
)
from coupling.lp.solvers import certified_lp, lp_defects
from coupling.rules.gbv import GBV
from coupling.sequence import selection_model
from tests.strategies import model_pair

#: every verifier of the trees of the draft model: (rule, supports distinct first tokens)
TREE_RULES = [("traversal", True), ("gbv", False), (GBV("ratio"), False), ("rrs", True),
              ("kseq", False), ("optimal", True)]


@pytest.mark.parametrize("V, gamma, seed", [(2, 2, 0), (3, 2, 1), (2, 3, 2)])
def test_one_path_is_the_verifier_lp(V, gamma, seed):
    """k = 1: the trees are the paths and the LP is verifier_lp's, whose optimum block
    verification attains."""
    t, d = model_pair(V, 1, seed, 0.7)
    value = full_information_tree_accepted(t, d, gamma, 1)
    assert value == pytest.approx(full_information_accepted(t, d, gamma), abs=1e-9)
    assert value == pytest.approx(expected_accepted("block", t, d, gamma), abs=1e-9)


@pytest.mark.parametrize("V, gamma, k, rep", [(2, 2, 2, True), (2, 2, 3, True),
                                              (3, 2, 2, True), (2, 3, 2, True),
                                              (3, 2, 2, False), (3, 2, 3, False)])
def test_every_tree_rule_is_at_most_the_optimum(V, gamma, k, rep):
    """Traversal, GBV and the token-level tree walks see less than the LP's verifier (the tree
    and the laws along it, not both models), so none exceeds its optimum; single-path block
    verification is a verifier of the tree too."""
    t, d = model_pair(V, 1, 40 + V + k, 0.8)
    lp = full_information_tree_accepted(t, d, gamma, k, replacement=rep)
    assert lp >= expected_accepted("block", t, d, gamma) - 1e-9
    for rule, wor in TREE_RULES:
        if rep or wor:
            assert expected_accepted(rule, t, d, gamma, k=k, replacement=rep) <= lp + 1e-9


def test_more_paths_never_lower_the_optimum():
    """A verifier of k + 1 paths may ignore one: the optimum is non-decreasing in k."""
    t, d = model_pair(2, 1, 3, 0.5)
    values = [full_information_tree_accepted(t, d, 2, k) for k in (1, 2, 3, 4)]
    assert all(a <= b + 1e-9 for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize("V, gamma, k, rep", [(2, 2, 2, True), (3, 2, 3, True),
                                              (2, 3, 2, True), (3, 2, 2, False)])
def test_the_optimum_is_a_randomised_selection_then_block_verification(V, gamma, k, rep):
    """The path-selection LP (laws of a path selected from the tree, Gale's constraints) has
    the same optimum, and block verification of a path drawn from its optimal selection law
    attains it."""
    t, d = model_pair(V, 1, 60 + V + k, 1.0)
    lp = full_information_tree_accepted(t, d, gamma, k, replacement=rep)
    value, mass = path_selection_lp(t, d, gamma, k, replacement=rep)
    assert value == pytest.approx(lp, abs=1e-8)
    assert sum(mass.values()) == pytest.approx(1.0, abs=1e-9)
    block = expected_accepted("block", t, selection_model(mass, V), gamma)
    assert block == pytest.approx(lp, abs=1e-8)


def test_the_emitted_law_of_the_optimum_is_the_targets():
    t, d = model_pair(2, 1, 5, 0.6)
    lp = tree_verifier_lp(t, d, 2, 2)
    value, emitted = lp.solve()
    assert lp.n_trees == 10 and lp.n_variables == lp.A.shape[1]
    first = np.zeros(2)
    for u, m in emitted.items():
        first[u[0]] += m
    assert np.allclose(first, t(()), atol=1e-9)
    assert value == pytest.approx(sum((len(u) - 1) * m for u, m in emitted.items()), abs=1e-9)


@pytest.mark.parametrize("call, msg", [
    (lambda t: tree_verifier_lp(t, t, 2, 0), "k"),
    (lambda t: tree_verifier_lp(t, t, 0, 2), "gamma"),
    (lambda t: tree_verifier_lp(t, t, 2, 2, replacement="no"), "replacement"),
    (lambda t: tree_verifier_lp(t, t, 4, 3), "too large"),
    (lambda t: tree_verifier_lp(t, t, 2, 10**6), "too large"),
    (lambda t: tree_verifier_lp(t, TabularLM.constant([1.0, 0, 0]), 2, 2, replacement=False),
     "distinct first tokens"),
    (lambda t: tree_verifier_lp(t, TabularLM(2, seed=1), 2, 2), "vocabulary"),
    (lambda t: path_selection_lp(t, t, 3, 2), "at most 10 paths"),
])
def test_bad_inputs_are_refused_by_name(call, msg):
    with pytest.raises(ValueError, match=msg):
        call(TabularLM(3, 1, seed=0))


def test_the_certificate_rejects_a_wrong_optimum():
    """certified_lp returns only a certified optimum: a feasible but suboptimal point, or a
    dual vector that is not dual feasible, is named."""
    # min x0 + 2 x1  s.t.  x0 + x1 = 1: optimum x = (1, 0), y = 1
    A, b, c = np.array([[1.0, 1.0]]), np.array([1.0]), np.array([1.0, 2.0])
    x, y = certified_lp(c, A, b)
    assert np.allclose(x, [1, 0]) and lp_defects(A, b, c, x, y) == []
    assert any("duality gap" in s for s in lp_defects(A, b, c, np.array([0.0, 1.0]), y))
    assert any("dual is infeasible" in s for s in lp_defects(A, b, c, x, np.array([3.0])))
    with pytest.raises(SolverError, match="no HiGHS solve passed"):
        certified_lp(c, A, np.array([-1.0]))
