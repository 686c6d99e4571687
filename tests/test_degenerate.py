"""Hypothesis properties over degenerate laws, for every single-step rule and every solver:
point masses, disjoint supports, subnormal and 1e-300 entries, exact ties. Each rule stays a
valid coupling there, lossless or (a rule labelled lossy) with exactly the output law it
reports, or raises a clear error, with no warning, and its acceptance lies in [0, 1] and below
the LP optimum of its information model (for a lossy rule: at its own distortion). A rule
added to the registry is covered by construction."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import coupling
from coupling import RULES

SINGLE_STEP = [name for name, r in RULES.items() if r.unit == "token"]
TINY = [5e-324, 1e-310, 1e-300, 1e-200]


@st.composite
def degenerate_law(draw, V: int) -> np.ndarray:
    """A law over ``V`` tokens with the features that break careless arithmetic."""
    kind = draw(st.sampled_from(["point", "ties", "tiny", "zeros", "dirichlet", "half"]))
    if kind == "point":
        x = np.zeros(V)
        x[draw(st.integers(0, V - 1))] = 1.0
    elif kind == "ties":
        x = np.full(V, 1.0 / V)
    elif kind == "tiny":
        x = np.array([draw(st.sampled_from(TINY)) for _ in range(V)])
        x[draw(st.integers(0, V - 1))] = 1.0
    elif kind == "half":
        x = np.zeros(V)
        x[:2] = 0.5
    else:
        seed = draw(st.integers(0, 2**31))
        x = np.random.default_rng(seed).dirichlet(np.full(V, 0.3))
        if kind == "zeros":
            x[draw(st.integers(0, V - 1))] = 0.0
            if not x.sum() > 0:
                x[0] = 1.0
    return x / x.sum()


@st.composite
def case(draw):
    V = draw(st.integers(2, 4))
    p, q = draw(degenerate_law(V)), draw(degenerate_law(V))
    if draw(st.booleans()):                        # disjoint supports
        p = np.where(q > 0, 0.0, p)
        if not p.sum() > 0:
            p = np.zeros(V)
            p[int(np.argmin(q))] = 1.0
        p = p / p.sum()
    return p, q


def _supported(rule, k, replacement, q):
    return rule.supports(k, replacement) and (replacement or np.count_nonzero(q) >= k)


@pytest.mark.parametrize("name", SINGLE_STEP)
@pytest.mark.parametrize("k,replacement", [(1, True), (2, True), (2, False), (3, True)])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pq=case())
def test_every_rule_is_a_lossless_coupling_on_degenerate_laws(name, k, replacement, pq):
    p, q = pq
    rule = RULES[name]
    if not _supported(rule, k, replacement, q):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # no overflow / divide warning may escape
        report = coupling.check_rule(rule, p, q, k, replacement=replacement)
        acc = rule.acceptance(p, q, k, replacement=replacement)
    assert report.lossless if rule.lossless else report.law_err < 1e-12, report
    assert report.draft_err < 1e-12, report
    assert report.acceptance_err < 1e-12, report
    assert 0.0 <= acc <= 1.0
    if rule.lossless:
        assert acc <= report.optimum + 1e-12, report
    else:                  # the lossy LP is HiGHS's answer, certified to its tolerance
        assert report.within_optimum and not report.lossless, report
    lo, hi = rule.bound(p, q, k, replacement=replacement)
    assert lo - 1e-12 <= acc <= hi + 1e-12, (lo, acc, hi)


@pytest.mark.parametrize("name", SINGLE_STEP)
@settings(max_examples=30, deadline=None)
@given(pq=case(), seed=st.integers(0, 2**31))
def test_every_sampler_outputs_a_token_of_positive_target_mass(name, pq, seed):
    p, q = pq
    rule = RULES[name]
    rng = np.random.default_rng(seed)
    x = int(rng.choice(q.size, p=q))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = rule.sample(p, q, [x], rng)
    assert p[y] > 0


@pytest.mark.parametrize("solver", coupling.lp.solve.COUPLING_SOLVERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pq=case(), k=st.integers(1, 2), replacement=st.booleans())
def test_every_solver_agrees_with_the_min_cut_on_degenerate_laws(solver, pq, k, replacement):
    p, q = pq
    if not replacement and np.count_nonzero(q) < k:
        return
    c = coupling.solve_coupling(p, q, k, replacement=replacement, solver=solver)
    opt = coupling.optimal_acceptance(p, q, k, replacement=replacement)
    assert abs(c.acceptance - opt) < 1e-8
    assert np.abs(c.plan.sum(axis=0) - p).max() < 1e-9
    assert np.abs(c.plan.sum(axis=1) - c.tuple_probs).max() < 1e-9
    assert c.plan.min() >= -1e-12


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 4), m=st.integers(1, 4), shift=st.sampled_from([-1e6, -2.0, 0.0, 3.0,
                                                                       1e15]),
       scale=st.sampled_from([1e-12, 1.0, 1e12]), seed=st.integers(0, 2**31),
       solver=st.sampled_from(coupling.lp.solve.SOLVERS))
def test_transport_is_invariant_to_the_cost_offset_and_scale(n, m, shift, scale, seed, solver):
    """Adding a constant to every cost or scaling all of them leaves the optimal plans
    unchanged, so every solver must answer for any offset and unit (all-negative costs once
    made POT report a feasible problem infeasible)."""
    rng = np.random.default_rng(seed)
    a, b = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m))
    C = rng.random((n, m))
    _, base, _ = coupling.solve_transport(a, b, C, solver=solver)
    _, value, _ = coupling.solve_transport(a, b, C * scale + shift, solver=solver)
    assert value == pytest.approx(base * scale + shift, rel=1e-7, abs=1e-7 * max(1.0, scale))


def test_the_block_transport_bound_of_agreeing_deterministic_models_is_gamma_plus_one():
    """Greedy decoding: both models put all mass on token 0, so every drafted token is
    accepted (the LP's costs are then all negative)."""
    point = coupling.TabularLM.constant([1.0, 0.0])
    assert coupling.optimal_block_efficiency(point, point, 2) == pytest.approx(3.0)
    plan, value, _ = coupling.solve_transport([1.0], [1.0], [[-2.0]])
    assert value == -2.0 and plan[0, 0] == 1.0
