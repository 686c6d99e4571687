"""The solver layer (``coupling.lp.solvers``): every LP certified or refused, marginals rebalanced,
costs normalised, one tolerance table."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import SolverError, optimal_acceptance, solve_coupling, solve_transport, tv
from coupling.lp.solve import COUPLING_SOLVERS
from coupling.lp.solvers import (
    SOLVERS,
    TOLERANCES,
    check_solver,
    highs_lp,
    max_flow,
    normalise_cost,
    rebalance,
    transport,
    zero_cost_transport,
)
from tests.strategies import distributions


def test_rounding_mismatch_marginals_do_not_break_highs():
    # sums differing by ~4e-16 make HiGHS report "infeasible" on the equality form
    rng = np.random.default_rng(3)
    for V in (7, 50, 1000):
        p = rng.dirichlet(np.ones(V))
        q = rng.dirichlet(np.ones(V))
        q = q / q.sum() * (1 + 4e-16)
        assert solve_coupling(p, q, 1, solver="highs").acceptance == pytest.approx(
            1 - tv(p, q), abs=1e-9
        )
        cost = 1.0 - np.eye(V) if V <= 50 else None
        if cost is not None:
            _, value, _ = solve_transport(p, q, cost, solver="highs")
            assert value == pytest.approx(tv(p, q), abs=1e-9)


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(distributions(n), distributions(n + 1))),
       st.floats(1e-16, 1e-9))
@settings(max_examples=40)
def test_rebalanced_marginals_agree_to_an_ulp(ab, drift):
    a, b = ab
    ra, rb = rebalance(a * (1 + drift), b)
    assert abs(ra.sum() - rb.sum()) <= np.spacing(1.0) and abs(ra.sum() - 1.0) < 1e-15
    assert (ra >= 0).all() and (rb >= 0).all()
    np.testing.assert_allclose(ra, a, rtol=0, atol=1e-15)


def test_normalised_costs_keep_the_optimal_plans():
    """Shifting and scaling every cost leaves the optimal plans: each solver sees [0, 1]."""
    rng = np.random.default_rng(2)
    a, b = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(5))
    cost = rng.random((4, 5))
    for shifted in (cost - 7.0, 1e6 * cost, -3.0 * (1.0 - cost)):
        c = normalise_cost(shifted)
        assert c.min() == 0.0 and c.max() == 1.0
        for solver in SOLVERS:
            plan, status = transport(a, b, shifted, solver)
            ref, _ = transport(a, b, cost, "pot")
            assert (cost * plan).sum() == pytest.approx((cost * ref).sum(), abs=1e-8), solver
            assert "optimal" in status
    assert not normalise_cost(np.full((2, 3), -4.0)).any()


def test_pot_iteration_limit_is_an_error(monkeypatch):
    """POT only *warns* when it stops at its iteration limit: the oracle must refuse the answer."""
    import ot

    real = ot.emd

    def capped(a, b, M, numItermax=100000, log=False, **kw):
        return real(a, b, M, numItermax=3, log=log, **kw)

    monkeypatch.setattr(ot, "emd", capped)
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(30))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SolverError, match="POT"):
            solve_coupling(p, q, 1, solver="pot")


def test_solvers_agree_at_moderate_size():
    """HiGHS's automatic method at its default tolerances falls 8.5e-8 short on this instance
    (k=2, V=50; ``python benchmarks/bench_lp.py --quick`` meets it); hypothesis's tiny
    vocabularies never show it. Every solver must match the min-cut scan to 1e-9."""
    rng = np.random.default_rng(0)
    rng.normal(size=200)  # the benchmark's first instance (V=100) comes first
    logits = rng.normal(size=50) * 2.0
    p = np.exp(logits - logits.max())
    q = np.exp(logits + rng.normal(size=50) * 0.8 - logits.max())
    p, q = p / p.sum(), q / q.sum()
    exact = optimal_acceptance(p, q, 2)
    for solver in COUPLING_SOLVERS:
        assert solve_coupling(p, q, 2, solver=solver).acceptance == pytest.approx(exact, abs=1e-9)


@pytest.mark.parametrize("big", [1e19, 1e21, 1e30])
def test_transport_solvers_agree_on_huge_finite_costs(big):
    """HiGHS reads |c| >= 1e20 as infinite (an unscaled cost fails with "model_status
    Unknown", and cvxpy with a raw ValueError): the LP solvers get the cost scaled down, POT
    as is."""
    forced = np.array([[0.0], [big]])                 # half the mass must pay it
    avoidable = np.array([[0.0, big], [big, 0.0]])
    for solver in SOLVERS:
        _, v, _ = solve_transport([0.5, 0.5], [1.0], forced, solver=solver)
        assert v == pytest.approx(big / 2, rel=1e-9)
        plan, v, _ = solve_transport([0.6, 0.4], [0.6, 0.4], avoidable, solver=solver)
        assert v == pytest.approx(0.0, abs=big * 1e-10)   # an interior point leaves ~4e-12
        assert np.allclose(plan, np.diag([0.6, 0.4]), atol=1e-9)


@pytest.mark.parametrize("solver", ["highs", "cvxpy"])
def test_max_flow_is_a_plan_of_the_membership_cost(solver):
    """The sparse flow form: the plan's marginals are the set law and p, and its mass on the
    membership edges is the flow value (the optimum 0.84 of the known instance)."""
    mass = np.array([0.04, 0.08, 0.24, 0.04, 0.24, 0.36])      # sets {0}, {0,1}, ... of q
    members = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1], [0, 1, 0], [0, 1, 1], [0, 0, 1]],
                       dtype=bool)
    p = np.array([0.5, 0.3, 0.2])
    plan, value, status = max_flow(mass, p, members, solver)
    np.testing.assert_allclose(plan.sum(axis=1), mass, atol=1e-9)
    np.testing.assert_allclose(plan.sum(axis=0), p, atol=1e-9)
    assert value == pytest.approx(plan[members].sum(), abs=1e-12)
    assert value == pytest.approx(solve_coupling(p, [0.2, 0.2, 0.6], 2).acceptance, abs=1e-9)
    assert "optimal" in status


def test_zero_cost_transport_stays_on_its_edges_or_raises():
    a, b = np.array([0.3, 0.2]), np.array([0.1, 0.4])            # one common total, 0.5
    allowed = np.array([[True, True], [False, True]])
    plan = zero_cost_transport(a, b, allowed)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-15)
    np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-15)
    assert plan[~allowed].sum() <= TOLERANCES.plan_off_edge
    with pytest.raises(SolverError, match="off its allowed edges"):
        zero_cost_transport(a, b, np.array([[True, False], [True, False]]))
    assert not zero_cost_transport(np.zeros(2), np.zeros(2), allowed).any()


def test_highs_lp_refuses_what_it_cannot_certify():
    A = sp.csr_matrix(np.array([[1.0, 1.0], [1.0, 1.0]]))
    x, y = highs_lp(np.array([1.0, 2.0]), A[:1], np.array([1.0]))
    np.testing.assert_allclose(x, [1.0, 0.0], atol=1e-12)
    assert y.shape == (1,)
    with pytest.raises(SolverError, match="HiGHS infeasible test LP failed: status=2"):
        highs_lp(np.array([1.0, 2.0]), A, np.array([1.0, 2.0]), what="infeasible test LP")


@pytest.mark.parametrize("solver", ["simplex", None, "POT", 1])
def test_unknown_solvers_are_named(solver):
    with pytest.raises(ValueError, match="solver must be one of"):
        check_solver(solver)

