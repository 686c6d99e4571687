"""``gumbel``: the shared-noise Gumbel-max coupling, one position and along blocks."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling import (
    NEGATIVE_CONTROLS,
    RULES,
    expected_accepted,
    motivating_example,
    stream_law,
    target_law,
    tv,
)
from coupling.lm import check_models
from coupling.rules import gumbel
from coupling.rules.gumbel import match, position_gumbels
from tests.strategies import drafted_path, model_pair, rational_lm, rule_pairs

GUMBEL = RULES["gumbel"]
EMIT_DRAFT = NEGATIVE_CONTROLS["gumbel_emit_draft"]
F = Fraction
P4 = np.array([0.5, 0.2, 0.2, 0.1])
Q4 = np.array([0.1, 0.3, 0.2, 0.4])


# ------------------------------------------------------------------ one position
@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs())
def test_acceptance_within_daliri_bounds(pq):
    p, q = pq
    t = tv(p, q)
    assert (1 - t) / (1 + t) - 1e-12 <= GUMBEL.acceptance(p, q) <= 1 - t + 1e-12


def test_exact_rational_value():
    # collision sum_i 1/sum_j max(p_j/p_i, q_j/q_i) = 1/3 + 1/3: on two tokens the
    # drafter-invariant coupling is optimal here
    exact = sum(
        1
        / sum(
            max(Fraction(pj) / Fraction(pi), Fraction(qj) / Fraction(qi))
            for pj, qj in [(Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))]
        )
        for pi, qi in [(Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))]
    )
    assert exact == Fraction(2, 3)
    assert GUMBEL.acceptance(np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])) == pytest.approx(
        2 / 3, abs=1e-15)


def test_pair_matches_exact_joint():
    """The analytic joint of the shared-noise pair agrees with literal shared noise
    (chi-square, false-positive rate 1e-3, fixed seed)."""
    rng = np.random.default_rng(7)
    n = 20000
    J = gumbel.joint(P4, Q4)
    counts = np.zeros_like(J)
    for _ in range(n):
        x, y = gumbel.pair(P4, Q4, rng)
        counts[x, y] += 1
    m = J.ravel() > 0
    assert counts.ravel()[~m].sum() == 0
    stat = ((counts.ravel()[m] - n * J.ravel()[m]) ** 2 / (n * J.ravel()[m])).sum()
    assert stats.chi2.sf(stat, m.sum() - 1) > 1e-3


def test_drafter_invariance():
    """Given the noise, the output never depends on q."""
    rng = np.random.default_rng(9)
    V = 50
    p = rng.dirichlet(np.ones(V))
    for _ in range(200):
        G = rng.gumbel(size=V)
        outs = {gumbel.pair_from_noise(p, rng.dirichlet(np.ones(V)), G)[1] for _ in range(5)}
        assert len(outs) == 1


def test_conditional_noise_respects_draft():
    rng = np.random.default_rng(10)
    q = rng.dirichlet(np.ones(30))
    q[3] = 0.0
    q /= q.sum()
    for x in (0, 7, 29):
        for _ in range(50):
            G = gumbel.conditional_noise(q, x, rng.random(31) * (1 - 1e-12) + 1e-300)
            with np.errstate(divide="ignore"):
                assert int(np.argmax(np.log(q) + G)) == x


def test_acceptance_fast_equals_quadratic():
    rng = np.random.default_rng(12)
    for _ in range(20):
        V = 40
        p, q = rng.dirichlet(np.ones(V) * 0.3), rng.dirichlet(np.ones(V) * 0.3)
        p[rng.integers(V)] = 0
        p /= p.sum()
        direct = sum(
            1 / np.maximum(p / p[i], q / q[i]).sum() for i in range(V) if p[i] > 0 and q[i] > 0
        )
        assert abs(gumbel.acceptance(p, q) - direct) < 1e-13


def test_match_formula():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.3, 0.1, 0.4])
    c = match(p, q)
    assert c[3] == 0 and np.all(c <= np.minimum(p, q) + 1e-15)
    assert c[1] == pytest.approx(1 / (0.5 / 0.3 + 1 + 0.2 / 0.3 + 0.4 / 0.3))
    assert (1 - tv(p, q)) / (1 + tv(p, q)) <= c.sum() <= 1 - tv(p, q)
    # Monte Carlo check of the exponential-race formula (fixed seed; 5 sigma)
    rng = np.random.default_rng(7)
    G = rng.gumbel(size=(200_000, 4))
    with np.errstate(divide="ignore"):
        x, y = np.argmax(np.log(q) + G, axis=1), np.argmax(np.log(p) + G, axis=1)
    for b in range(4):
        freq = np.mean((x == b) & (y == b))
        assert abs(freq - c[b]) < 5 * np.sqrt(c[b] * (1 - c[b]) / 200_000) + 1e-12


def test_match_exact():
    p = np.array([F(1, 2), F(1, 2)], dtype=object)
    q = np.array([F(1, 4), F(3, 4)], dtype=object)
    assert match(p, q).tolist() == [F(1, 4), F(1, 2)]  # V = 2: min(p, q)


@pytest.mark.parametrize(
    "p, q, msg",
    [
        ([0.5, 0.5], [0.9, 0.05, 0.05], "same vocabulary"),
        ([0.5, 0.3, 0.2], [0.5, 0.5], "same vocabulary"),
        ([3.0, 1.0], [0.5, 0.5], "p sums to"),
        ([1.5, -0.5], [0.5, 0.5], "p has negative"),
        ([np.nan, 1.0], [0.5, 0.5], "p contains NaN"),
        ([0.5, 0.5], [0.5, 0.6], "q sums to"),
        (np.array([F(1, 2), F(1, 2)], dtype=object), [0.5, 0.5], "p must be a real"),
    ],
)
def test_collision_law_validates(p, q, msg):
    """The collision probabilities are read through the rule, which validates both laws
    (``match`` itself works on validated float64 or exact Fraction laws)."""
    for call in (GUMBEL.acceptance, GUMBEL.joint, GUMBEL.bound):
        with pytest.raises(ValueError, match=msg):
            call(np.asarray(p), np.asarray(q))


# ------------------------------------------------------------------ along blocks
@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_stream_law_is_target_law(gamma):
    t, d = model_pair(3, 2, 4, 0.3)
    target = target_law(t, 4, context=(1,))
    assert tv(stream_law("gumbel", t, d, gamma, 4, context=(1,)), target) < 1e-12
    assert tv(stream_law(EMIT_DRAFT, t, d, gamma, 4, context=(1,)), target) > 0.1


def test_exact_rationals_and_binary_maximality():
    t, d = rational_lm(3, 1, seed=3), rational_lm(3, 1, seed=4)
    assert np.array_equal(stream_law("gumbel", t, d, 2, 3), target_law(t, 3))
    # with two tokens the Gumbel-max coupling is a maximal coupling: it matches token verification
    te, de, g = motivating_example()
    assert expected_accepted("gumbel", te, de, g) == F(10, 9)
    tb, db = rational_lm(2, 2, seed=5), rational_lm(2, 2, seed=6)
    assert expected_accepted("gumbel", tb, db, 3) == expected_accepted("token", tb, db, 3)


@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 10_000))
@settings(max_examples=15)
def test_never_above_token(V, gamma, seed):
    t, d = model_pair(V, 1, seed)
    assert (
        expected_accepted("gumbel", t, d, gamma) <= expected_accepted("token", t, d, gamma) + 1e-12
    )


def test_emission_law_chisquare():
    # emitted tokens of one sampled call vs the exact outcome law; false-positive rate 1e-3
    t, d = model_pair(3, 2, 4, 0.5)
    T, D, ctx = check_models(t, d, (0,))
    law = {}
    for emitted, _, prob in GUMBEL.outcomes(T, D, 3, ctx):
        law[emitted] = law.get(emitted, 0.0) + prob
    keys = list(law)
    rng = np.random.default_rng(99)
    n = 20_000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(GUMBEL.sample_call(T, D, 3, rng, ctx))] += 1
    f_obs = np.array([counts[k] for k in keys], float)
    f_exp = np.array([law[k] for k in keys]) * n
    assert f_obs.sum() == n and abs(f_exp.sum() - n) < 1e-6
    small = f_exp < 5
    f_obs = np.append(f_obs[~small], f_obs[small].sum())
    f_exp = np.append(f_exp[~small], f_exp[small].sum())
    assert stats.chisquare(f_obs, f_exp).pvalue > 1e-3


def test_verify_block_reference():
    x, P, Q = drafted_path(seed=1)
    G = np.random.default_rng(0).gumbel(size=P.shape)
    tau, branch, y_out = GUMBEL.verify_block(x[None], P[None], None, G)
    y = [int(np.argmax(np.log(P[i]) + G[i])) for i in range(4)]
    expect = next((i for i in range(3) if x[i] != y[i]), 3)
    assert (tau, branch, y_out) == (expect, 0, y[expect])
    # drafts equal to the target's own Gumbel-max picks are all accepted
    assert GUMBEL.verify_block(np.array([y[:3]]), P[None], None, G) == (3, 0, y[3])
    # the output never reads q: any draft law gives the same verdict
    assert GUMBEL.verify_block(x[None], P[None], Q[None], G) == (tau, branch, y_out)
    with pytest.raises(ValueError, match="noise"):
        GUMBEL.verify_block(x[None], P[None], None, G[:2])
    # the coins of the walk are no Gumbel noise: the rule asks for its shared noise by name
    with pytest.raises(ValueError, match=r"noise must be \[gamma \+ 1, V\]"):
        GUMBEL.verify_block(x[None], P[None], Q[None], np.zeros((3, 1)))


def test_position_gumbels_are_keyed_by_position():
    a = position_gumbels(3, [10, 11, 12], 5)
    assert a.shape == (3, 5)
    assert np.array_equal(a[1:], position_gumbels(3, [11, 12], 5))
    assert not np.array_equal(a, position_gumbels(4, [10, 11, 12], 5))


def test_position_gumbels_of_no_positions_is_an_empty_block():
    assert position_gumbels(0, [], 3).shape == (0, 3)
    assert np.array_equal(position_gumbels(7, [4, 9], 3)[1], position_gumbels(7, [9], 3)[0])
