"""``optimal``: the min-cut prefix scan equals the LP optimum, the plan through the cut is an
optimal coupling, and the sampler reads its rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling import RULES, SolverError, solve_coupling, tuple_law
from coupling.check import trace_mass
from coupling.lp.draftsets import group_by_set, padded_sets, pair_index, pair_sets, set_members
from coupling.rules import optimal as opt
from coupling.rules.optimal import CutPlan, cut_plan, optimal_acceptance, optimal_cut, ratio_order
from tests.strategies import rule_pairs

OPTIMAL = RULES["optimal"]
MODES = [(1, True), (2, True), (3, True), (2, False), (3, False)]


@st.composite
def pair_k(draw):
    V = draw(st.integers(2, 6))
    w = st.lists(st.integers(0, 9), min_size=V, max_size=V).filter(lambda a: sum(a) > 0)
    a = np.array(draw(w), float)
    b = np.array(draw(w), float)
    if draw(st.integers(0, 5)) == 0:
        b = a.copy()  # p == q: every ratio ties
    k = draw(st.integers(1, 3))
    rep = draw(st.booleans())
    return a / a.sum(), b / b.sum(), k, rep


@settings(max_examples=60, deadline=None)
@given(pair_k())
def test_equals_lp(case):
    p, q, k, rep = case
    assume(rep or np.count_nonzero(q) >= k)
    lp = solve_coupling(p, q, k, replacement=rep).acceptance
    assert abs(optimal_acceptance(p, q, k, replacement=rep) - lp) < 1e-9


def _hit(q, k, rep, H):
    tuples, probs = tuple_law(q, k, replacement=rep)
    return float(probs[np.isin(tuples, list(H)).any(axis=1)].sum())


@settings(max_examples=30, deadline=None)
@given(pair_k())
def test_cut_set_attains_value_and_beats_all_subsets(case):
    p, q, k, rep = case
    assume(rep or np.count_nonzero(q) >= k)
    val, H = optimal_cut(p, q, k, replacement=rep)
    assert abs(val - (1 - p[H].sum() + _hit(q, k, rep, H))) < 1e-12
    V = p.size
    best = min(
        1 - p[list(S)].sum() + _hit(q, k, rep, S)
        for r in range(V + 1)
        for S in itertools.combinations(range(V), r)
    )
    assert val <= best + 1e-12


def test_ratio_order_puts_q_zero_first():
    p = np.array([0.2, 0.3, 0.0, 0.5])
    q = np.array([0.4, 0.0, 0.1, 0.5])
    o = ratio_order(p, q)
    assert o[0] == 1 and o[-1] == 2


def test_monotone_in_k_and_modes_at_full_vocabulary():
    rng = np.random.default_rng(0)
    V = 49152
    z = rng.normal(size=V) * 2.5
    p = np.exp(z - z.max())
    p /= p.sum()
    q = np.exp(0.8 * z + 0.5 * rng.normal(size=V))
    q /= q.sum()
    prev = 0.0
    for k in range(1, 9):
        a = optimal_acceptance(p, q, k)
        assert prev - 1e-12 <= a <= 1.0
        prev = a
    assert optimal_acceptance(p, q, 1) == pytest.approx(1 - 0.5 * np.abs(p - q).sum(), abs=1e-12)
    w2 = optimal_acceptance(p, q, 2, replacement=False)
    assert optimal_acceptance(p, q, 1) <= w2 <= 1.0
    with pytest.raises(ValueError, match="k >= 3"):
        optimal_acceptance(p, q, 3, replacement=False)


def test_without_replacement_enumeration_path_matches_lp():
    rng = np.random.default_rng(1)
    for _ in range(5):
        p, q = rng.dirichlet(np.ones(6) * 0.5), rng.dirichlet(np.ones(6) * 0.5)
        for k in (3, 4):
            lp = solve_coupling(p, q, k, replacement=False).acceptance
            assert abs(optimal_acceptance(p, q, k, replacement=False) - lp) < 1e-9


def test_invalid():
    with pytest.raises(ValueError, match="distinct"):
        optimal_acceptance([0.5, 0.5], [1.0, 0.0], 2, replacement=False)
    with pytest.raises(ValueError, match="k"):
        optimal_acceptance([0.5, 0.5], [0.5, 0.5], 0)
    with pytest.raises(ValueError, match="mismatch"):
        optimal_acceptance([0.5, 0.5], [1.0], 1)


@pytest.mark.parametrize(
    "p, q",
    [
        ([0.5, 0.5], [1.0, 1e-310]),
        ([0.5, 0.5], [1.0, 5e-324]),
        ([0.2, 0.3, 0.5], [1.0, 1e-310, 1e-310]),
        ([0.2, 0.3, 0.5], [0.6, 0.4, 1e-310]),
        ([0.1, 0.2, 0.3, 0.4], [1.0 - 3e-16, 1e-310, 1e-16, 2e-16]),
    ],
)
def test_two_distinct_drafts_with_a_subnormal_rest(p, q):
    """k = 2 without replacement when 1 - q_b is subnormal for the likeliest draft b, where
    q_b / (1 - q_b) overflows: optimal_acceptance and rrs's closed form still agree with the
    LP (1.0 here) and with the joint's trace, not 0.0 from an inf * 0 in a prefix."""
    p, q = np.array(p), np.array(q)
    lp = solve_coupling(p, q, 2, replacement=False).acceptance
    assert optimal_acceptance(p, q, 2, replacement=False) == pytest.approx(lp, abs=1e-12)
    rrs = RULES["rrs"]
    tuples, _ = tuple_law(q, 2, replacement=False)
    traced = trace_mass(rrs.joint(p, q, 2, replacement=False), tuples)
    assert rrs.acceptance(p, q, 2, replacement=False) == pytest.approx(traced, abs=1e-12)
    assert traced <= lp + 1e-12


# ---------------------------------------------------------------- the plan through the cut
def _set_law(q, k, rep):
    tuples, probs = tuple_law(q, k, replacement=rep)
    _, mass, members = group_by_set(tuples, probs, q.size)
    return padded_sets(members), mass, members


def _assert_optimal_coupling(plan, members, mass, p, q, k, rep):
    assert (plan >= 0).all()
    np.testing.assert_allclose(plan.sum(axis=1), mass, rtol=0, atol=1e-13)
    assert 0.5 * np.abs(plan.sum(axis=0) - p).sum() < 1e-12       # lossless: TV to the target
    assert plan[members].sum() == pytest.approx(optimal_acceptance(p, q, k, replacement=rep),
                                                abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(pair_k())
def test_the_plan_through_the_cut_is_an_optimal_coupling(case):
    """Lossless to 1e-12 and accepting the optimum to 1e-12, whatever closed form or LP part
    built it, for k = 1..3 with and without replacement (ties, zeros and p = q included)."""
    p, q, k, rep = case
    assume(rep or np.count_nonzero(q) >= k)
    sets, mass, members = _set_law(q, k, rep)
    cp = cut_plan(p, q, k, rep, sets, mass)
    _assert_optimal_coupling(cp.dense(), members, mass, p, q, k, rep)
    for s in range(mass.size):       # the sampler's rows are the plan's rows
        np.testing.assert_allclose(cp.row(s), cp.dense()[s], rtol=0, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(pair_k(), st.sampled_from(["A", "B", "both"]))
def test_each_part_falls_back_to_an_lp_of_its_own(case, broken):
    """With the closed forms switched off, POT solves the part alone; the plan stays an
    optimal coupling (so the fallback is exercised on every kind of instance, not only on the
    rare laws where a closed form fails)."""
    p, q, k, rep = case
    assume(rep or np.count_nonzero(q) >= k)
    sets, mass, members = _set_law(q, k, rep)
    forms = {"A": ("B",), "B": ("A",), "both": ()}[broken]
    cp = cut_plan(p, q, k, rep, sets, mass, closed_forms=forms)
    _assert_optimal_coupling(cp.dense(), members, mass, p, q, k, rep)
    if (cp.n_h >= 2).any() and broken != "B":
        assert "A by POT" in cp.status
    if (cp.n_h == 0).any() and broken != "A":
        assert "B by POT" in cp.status


def test_the_peel_serves_what_the_shares_cannot():
    """An instance where the shares overshoot a pair (two demanding tokens outside the cut) and
    the peel holds: the plan says which closed form built it, and it is optimal."""
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(400):
        p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
        for rep in (True, False):
            sets, mass = pair_sets(q, rep)
            cp = cut_plan(p, q, 2, rep, sets, mass)
            seen.add(cp.how["B"])
            if cp.how["B"] == "peeled":
                _assert_optimal_coupling(cp.dense(), set_members(sets, 8), mass, p, q, 2, rep)
    assert {"shares", "peeled"} <= seen


@given(st.integers(1, 7), st.booleans(), st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_pair_sets_are_the_set_law_of_two_drafts(V, rep, seed):
    """pair_sets builds, without enumerating tuples, the sets and masses of the grouped tuple
    law, and pair_index finds each tuple's set."""
    q = np.random.default_rng(seed).dirichlet(np.ones(V))
    assume(rep or V >= 2)
    sets, mass = pair_sets(q, rep)
    tuples, probs = tuple_law(q, 2, replacement=rep)
    tuple_set, gmass, members = group_by_set(tuples, probs, V)
    mine = set_members(sets, V)
    rows = pair_index(tuples[:, 0], tuples[:, 1], V, rep)
    assert (rows >= 0).all()
    np.testing.assert_array_equal(mine[rows], members[tuple_set])   # same set per tuple
    np.testing.assert_allclose(np.bincount(rows, weights=probs, minlength=mass.size), mass,
                               rtol=1e-12, atol=1e-300)
    if not rep:
        assert pair_index(1, 1, V, rep) == -1


def test_a_cut_that_is_not_minimal_is_refused():
    """Feasible parts certify optimality (a flow meeting a cut's value is maximum), so a plan
    built through a cut that is not minimal cannot be completed: it raises, never returns a
    sub-optimal plan. The negative control of the construction."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    val, H = optimal_cut(p, q, 2)
    assert val == pytest.approx(0.84) and set(H.tolist()) == {0, 1}
    sets, mass = pair_sets(q, True)
    for wrong in ([0], [2], [0, 2], [0, 1, 2]):
        cp = CutPlan(p, q, 2, True, sets, mass, cut=np.array(wrong))
        with pytest.raises(SolverError, match="not minimal"):
            cp.dense()


# ---------------------------------------------------------------- the rule
@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs(), mode=st.sampled_from(MODES))
def test_rule_acceptance_equals_the_lp(pq, mode):
    p, q = pq
    k, rep = mode
    assume(rep or np.count_nonzero(q) >= k)
    lp = solve_coupling(p, q, k, replacement=rep).acceptance
    assert abs(OPTIMAL.acceptance(p, q, k, replacement=rep) - lp) < 1e-9


def test_exact_rational_value():
    # k = 2 i.i.d.: OPT = 1 - p(H^c) ... both prefixes: H = {1}: 1 - 2/3 + 1 - (2/3)^2 = 8/9
    p = np.array([1 / 3, 2 / 3])
    q = np.array([2 / 3, 1 / 3])
    assert OPTIMAL.acceptance(p, q, 2) == pytest.approx(8 / 9, abs=1e-15)


def test_refuses_a_draft_tuple_whose_probability_underflows():
    p, q = np.array([0.5, 0.5]), np.array([1 - 1e-200, 1e-200])
    with pytest.raises(ValueError, match="probability 0 as a tuple"):
        OPTIMAL.sample(p, q, [1, 1], np.random.default_rng(0))
    assert OPTIMAL.sample(p, q, [0, 1], np.random.default_rng(0)) in (0, 1)


def test_verify_reads_the_plan_row_of_the_drafted_tuple():
    """The deterministic core finds the drafted tuple's plan row: with a uniform at the row's
    cumulative breakpoints it emits exactly that row's tokens, and a tuple the rule cannot
    have drafted (a repeat without replacement) is refused by name."""
    p, q = np.array([0.1, 0.4, 0.2, 0.3]), np.array([0.3, 0.1, 0.4, 0.2])
    for replacement in (True, False):
        P, tuples = opt.tuple_plan(p, q, 2, replacement)
        for t, x in enumerate(tuples):
            row = P[t] / P[t].sum()
            if row.sum() == 0:
                continue
            edges = np.cumsum(row)
            for y in np.flatnonzero(row > 1e-12):
                u = (edges[y] - row[y] / 2) / edges[-1]      # the middle of y's interval
                assert opt.plan_verify(p, q, x, u, replacement=replacement) == y
    with pytest.raises(ValueError, match="no draft tuple of this rule"):
        opt.plan_verify(p, q, np.array([2, 2]), 0.5, replacement=False)


def test_the_plan_cache_serves_equal_laws_and_only_them():
    """Equal laws in new arrays reuse the cached plan; laws that differ only where the cache
    key does not look (it samples 64 entries) get a plan of their own, as does a law changed
    in place after the call."""
    rng = np.random.default_rng(3)
    V = 128                                          # the key samples every 2nd entry
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    opt.clear_plan_cache()
    plan = opt.set_plan(p, q, 2, True)
    assert opt.set_plan(p.copy(), q.copy(), 2, True) is plan
    p2 = p.copy()
    p2[[1, 3]] = p2[[3, 1]]                          # off the sampled entries
    other = opt.set_plan(p2, q, 2, True)
    assert other is not plan and np.array_equal(other.plan.p, p2)
    p[[1, 3]] = p[[3, 1]]                            # the first array, changed in place
    assert opt.set_plan(p, q, 2, True) is other
