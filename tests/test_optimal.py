"""coupling.optimal: the min-cut prefix scan equals the LP optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling.dist import tuple_law
from coupling.optimal import optimal_acceptance, optimal_cut, ratio_order
from coupling.solve import solve_coupling


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
    """k = 2 without replacement when 1 - q_b is subnormal for the likeliest draft b: the
    hit probability's q_b / (1 - q_b) once overflowed, 0 * inf made the prefix NaN, and
    optimal_acceptance and rrs's closed form both returned 0.0 (the LP: 1.0)."""
    from coupling.check import trace_mass
    from coupling.rules import RULES

    p, q = np.array(p), np.array(q)
    lp = solve_coupling(p, q, 2, replacement=False).acceptance
    assert optimal_acceptance(p, q, 2, replacement=False) == pytest.approx(lp, abs=1e-12)
    rrs = RULES["rrs"]
    tuples, _ = tuple_law(q, 2, replacement=False)
    traced = trace_mass(rrs.joint(p, q, 2, replacement=False), tuples)
    assert rrs.acceptance(p, q, 2, replacement=False) == pytest.approx(traced, abs=1e-12)
    assert traced <= lp + 1e-12
