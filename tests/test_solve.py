"""The LP oracle (``coupling.lp.solve``): marginals, known optima, monotonicity, invariances,
solver agreement, and the draft-set law it solves on."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import solve_coupling, solve_transport, tuple_law, tv
from coupling.lp.draftsets import group_by_set
from coupling.lp.solve import COUPLING_SOLVERS, SOLVERS
from tests.strategies import distributions, pairs


@given(pairs(max_size=5), st.integers(1, 3), st.booleans())
def test_plan_is_a_coupling_and_acceptance_in_unit_interval(pq, k, replacement):
    p, q = pq
    if not replacement and np.count_nonzero(q) < k:
        return
    c = solve_coupling(p, q, k, replacement=replacement)
    assert 0.0 <= c.acceptance <= 1.0
    np.testing.assert_allclose(c.plan.sum(axis=1), c.tuple_probs, atol=1e-9)
    np.testing.assert_allclose(c.plan.sum(axis=0), p, atol=1e-9)
    assert (c.plan >= -1e-15).all()
    member = np.zeros_like(c.plan, dtype=bool)
    member[np.arange(len(c.tuples))[:, None], c.tuples] = True
    assert c.plan[member].sum() == pytest.approx(c.acceptance, abs=1e-9)


@given(pairs(max_size=6))
def test_single_draft_optimum_is_one_minus_tv(pq):
    p, q = pq
    for solver in SOLVERS:
        assert solve_coupling(p, q, 1, solver=solver).acceptance == pytest.approx(
            1 - tv(p, q), abs=1e-9
        )


@settings(max_examples=30)
@given(pairs(min_size=2, max_size=5), st.booleans())
def test_non_decreasing_in_k(pq, replacement):
    p, q = pq
    kmax = 3 if replacement else min(3, np.count_nonzero(q))
    accs = [solve_coupling(p, q, k, replacement=replacement).acceptance for k in range(1, kmax + 1)]
    assert all(b >= a - 1e-9 for a, b in zip(accs, accs[1:], strict=False))


@given(st.integers(1, 5).flatmap(lambda V: distributions(V)), st.integers(1, 3))
def test_equal_distributions_accept_surely(p, k):
    assert solve_coupling(p, p, k).acceptance == pytest.approx(1.0, abs=1e-9)


@given(pairs(min_size=2, max_size=5), st.integers(1, 2), st.randoms(use_true_random=False))
def test_permutation_invariance(pq, k, rnd):
    p, q = pq
    perm = list(range(p.size))
    rnd.shuffle(perm)
    a = solve_coupling(p, q, k).acceptance
    b = solve_coupling(p[perm], q[perm], k).acceptance
    assert a == pytest.approx(b, abs=1e-9)


@settings(max_examples=40)
@given(pairs(min_size=1, max_size=5), st.integers(1, 3), st.booleans())
def test_three_solvers_agree(pq, k, replacement):
    p, q = pq
    if not replacement and np.count_nonzero(q) < k:
        return
    accs = [solve_coupling(p, q, k, replacement=replacement, solver=s).acceptance
            for s in COUPLING_SOLVERS]
    assert max(accs) - min(accs) < 1e-8, accs


def test_known_values():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    assert solve_coupling(p, q, 1).acceptance == pytest.approx(0.6, abs=1e-12)
    # k=2 i.i.d.: min over H of 1 - p(H) + 1 - (1 - q(H))^2 ; H = {0,1}: 1 - .8 + 1 - .36 = .84
    assert solve_coupling(p, q, 2).acceptance == pytest.approx(0.84, abs=1e-12)
    # two distinct drafts cover any target token with positive draft mass in a 3-token vocabulary
    assert solve_coupling(p, q, 2, replacement=False).acceptance == pytest.approx(1.0, abs=1e-12)
    assert solve_coupling([1, 0], [0, 1], 3).acceptance == 0.0


@pytest.mark.parametrize("solver", SOLVERS)
def test_solve_transport_agrees(solver):
    rng = np.random.default_rng(0)
    a, b = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(4))
    cost = rng.random((5, 4))
    plan, value, status = solve_transport(a, b, cost, solver=solver)
    ref, ref_value, _ = solve_transport(a, b, cost, solver="pot")
    assert value == pytest.approx(ref_value, abs=1e-8)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-9)
    np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-9)
    assert "optimal" in status


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(p=[0.5, 0.5], q=[1.0]), "vocabulary mismatch"),
        (dict(p=[0.5, np.nan], q=[0.5, 0.5]), "NaN"),
        (dict(p=[0.5, 0.5], q=[1.5, -0.5]), "negative"),
        (dict(p=[0.5, 0.4], q=[0.5, 0.5]), "sums to"),
        (dict(p=[0.5, 0.5], q=[0.5, 0.5], k=0), "positive integer"),
        (dict(p=[0.5, 0.5], q=[0.5, 0.5], solver="simplex"), "solver must be"),
        (dict(p=[0.5, 0.5], q=[1.0, 0.0], k=2, replacement=False), "distinct"),
    ],
)
def test_bad_input_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        solve_coupling(**kwargs)


def test_solve_transport_bad_input():
    with pytest.raises(ValueError, match="shape"):
        solve_transport([0.5, 0.5], [1.0], np.zeros((1, 1)))
    with pytest.raises(ValueError, match="NaN or inf"):
        solve_transport([1.0], [1.0], [[np.inf]])


@given(st.integers(1, 9), st.integers(1, 3), st.booleans(), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_tuples_grouped_by_set_as_numpy_unique_rows_would(V, k, replacement, seed):
    """The packed-bit grouping finds the same sets, in the same order, with the same masses
    as ``np.unique`` over the boolean membership rows."""
    if not replacement and k > V:
        return
    q = np.random.default_rng(seed).dirichlet(np.ones(V))
    tuples, probs = tuple_law(q, k, replacement=replacement)
    member = np.zeros((tuples.shape[0], V), dtype=bool)
    member[np.arange(tuples.shape[0])[:, None], tuples] = True
    uniq, inverse = np.unique(member, axis=0, return_inverse=True)
    set_index, mass, members = group_by_set(tuples, probs, V)
    assert np.array_equal(members, uniq)
    assert np.array_equal(set_index, inverse.reshape(-1))
    assert np.allclose(mass, np.bincount(inverse.reshape(-1), weights=probs), rtol=0, atol=1e-15)


def test_transport_refuses_a_complex_cost():
    with pytest.raises(ValueError, match="cost must be a real numeric array, got dtype complex"):
        solve_transport([0.5, 0.5], [0.5, 0.5], np.array([[1 + 5j, 0], [0, 1 + 5j]]))
