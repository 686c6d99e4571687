"""A rule's own draft law: ``Rule.draft_law`` / ``draw_drafts`` / ``optimum`` and the LP over any
law of draft tuples, ``coupling.solve_draft_law``; the rules of the two classic laws (i.i.d.,
successive sampling) keep theirs."""

from __future__ import annotations

import numpy as np
import pytest

import coupling
from coupling import RULES, solve_coupling, solve_draft_law, tuple_law
from coupling.check import draw_drafts
from coupling.lm import check_models, draft_tree

P = np.array([0.5, 0.3, 0.2])
Q = np.array([0.2, 0.2, 0.6])


@pytest.mark.parametrize("solver", coupling.lp.solve.SOLVERS)
@pytest.mark.parametrize("k, rep", [(1, True), (2, True), (2, False), (3, True), (3, False)])
def test_the_lp_over_a_given_law_is_the_coupling_lp(solver, k, rep):
    rng = np.random.default_rng(k)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    want = solve_coupling(p, q, k, replacement=rep)
    got = solve_draft_law(p, *tuple_law(q, k, replacement=rep), solver=solver)
    assert got.acceptance == pytest.approx(want.acceptance, abs=1e-9)
    assert np.abs(got.plan.sum(0) - p).max() < 1e-9
    assert np.abs(got.plan.sum(1) - got.tuple_probs).max() < 1e-9
    assert got.k == k and got.replacement is None


def test_the_lp_of_a_sparse_law():
    """Two sets, {0, 1} and {0, 2}, half each: everything but p's mass outside them."""
    c = solve_draft_law([0.5, 0.3, 0.2], [[0, 1], [0, 2]], [0.5, 0.5])
    assert c.acceptance == pytest.approx(1.0)
    c = solve_draft_law([0.1, 0.1, 0.8], [[0, 1], [0, 2]], [0.9, 0.1])
    assert c.acceptance == pytest.approx(0.3)


@pytest.mark.parametrize("kwargs, name", [
    (dict(tuples=[[0], [3]], probs=[0.5, 0.5]), "tuples"),
    (dict(tuples=[[0.0], [1.0]], probs=[0.5, 0.5]), "tuples"),
    (dict(tuples=[[0], [1]], probs=[0.5, 0.5, 0.0]), "tuples"),
    (dict(tuples=[0, 1], probs=[0.5, 0.5]), "tuples"),
    (dict(tuples=[[0], [1]], probs=[0.5, 0.6]), "probs"),
    (dict(tuples=[[0], [1]], probs=[0.5, 0.5], solver="cut"), "solver"),
])
def test_solve_draft_law_names_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        solve_draft_law(P, **kwargs)


@pytest.mark.parametrize("name", ["token", "kseq", "rrs", "optimal", "gumbel", "minhash"])
def test_classic_rules_keep_the_tuple_law_and_its_draws(name):
    rule = RULES[name]
    for k, rep in [(1, True), (2, True), (2, False)]:
        if not rule.supports(k, rep):
            continue
        a, b = rule.draft_law(Q, k, replacement=rep), tuple_law(Q, k, replacement=rep)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        r1, r2 = np.random.default_rng(4), np.random.default_rng(4)
        for _ in range(20):
            assert np.array_equal(rule.draw_drafts(Q, k, rep, r1), draw_drafts(Q, k, rep, r2))
        assert rule.optimum(P, Q, k, replacement=rep) == pytest.approx(
            solve_coupling(P, Q, k, replacement=rep).acceptance, abs=1e-12)


def test_one_branch_trees_draw_the_same_root_either_way():
    """A sampled call draws its roots with the rule's ``draw_drafts``; with one branch that is the
    very inverse-CDF draw the tree drafter makes itself, so seeded k = 1 streams are unchanged."""
    t, d = coupling.TabularLM(5, order=1, seed=0), coupling.TabularLM(5, order=1, seed=1)
    T, D, ctx = check_models(t, d, (2,))
    for seed in range(50):
        r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
        roots = RULES["token"].draw_drafts(D(ctx), 1, True, r1)
        a = draft_tree(T, D, 3, r1, ctx, roots=roots)
        b = draft_tree(T, D, 3, r2, ctx)
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_draft_law_methods_validate():
    with pytest.raises(ValueError, match="q"):
        RULES["rrs"].draft_law([0.5, 0.6], 2)
    with pytest.raises(ValueError, match="k"):
        RULES["rrs"].draw_drafts(Q, 0, True, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        RULES["rrs"].draw_drafts(Q, 2, True, 0)
    with pytest.raises(ValueError, match="single-step"):
        RULES["block"].draft_law(Q, 1)
    with pytest.raises(ValueError, match="does not support"):
        RULES["kseq"].draft_law(Q, 2, replacement=False)
