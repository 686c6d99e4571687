"""``token``: speculative sampling, its exact laws, its block form and its negative control."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import NEGATIVE_CONTROLS, RULES, TabularLM, block_efficiency, check_rule, tv
from coupling.check import check_sampler
from coupling.rules import token
from coupling.sequence import constant_acceptance_efficiency
from tests.strategies import as_tree, drafted_path, rule_pairs

TOKEN = RULES["token"]
NO_RESIDUAL = NEGATIVE_CONTROLS["token_no_residual"]
P4 = np.array([0.5, 0.2, 0.2, 0.1])
Q4 = np.array([0.1, 0.3, 0.2, 0.4])


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs())
def test_acceptance_is_one_minus_tv(pq):
    p, q = pq
    assert abs(TOKEN.acceptance(p, q) - (1 - tv(p, q))) < 1e-15


def test_exact_rational_value():
    p = np.array([1 / 3, 2 / 3])
    q = np.array([2 / 3, 1 / 3])
    assert TOKEN.acceptance(p, q) == pytest.approx(2 / 3, abs=1e-15)


def test_multi_draft_rules_with_one_draft_are_token():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    J = token.joint(p, q)
    for name in ("kseq", "rrs", "optimal"):
        np.testing.assert_allclose(RULES[name].joint(p, q, 1), J, atol=1e-15)


def test_negative_control_fails():
    """Speculative sampling without the residual correction must be caught both ways (exact
    check, and chi-square at false-positive rate 1e-3 against the token joint)."""
    assert not check_rule(NO_RESIDUAL, P4, Q4).ok
    s = check_sampler(NO_RESIDUAL, P4, Q4, n=4000, seed=1, reference=TOKEN)
    assert not s.ok and s.pvalue < 1e-12


@given(st.integers(2, 5), st.integers(1, 4), st.integers(0, 10_000))
@settings(max_examples=25)
def test_constant_acceptance_closed_form(V, gamma, seed):
    # context-independent models: every position accepts w.p. alpha = 1 - TV(p, q)
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    t, d = TabularLM.constant(p), TabularLM.constant(q)
    alpha = 1 - tv(p, q)
    got = block_efficiency("token", t, d, gamma)
    closed = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert got == pytest.approx(closed, rel=1e-12)
    assert constant_acceptance_efficiency(alpha, gamma) == pytest.approx(closed, rel=1e-12)


def test_accepted_length_is_decided_by_the_coins_alone():
    """Along a block: accept while ``coins[i] < min(1, p_i(x_i)/q_i(x_i))``, stop at the first
    failure; the emitted-token draws never change the accepted length, and the same uniforms
    give the same outcome."""
    x, P, Q = drafted_path(seed=2)
    g = x.size
    a = np.minimum(1.0, P[np.arange(g), x] / Q[np.arange(g), x])
    rng = np.random.default_rng(0)
    for _ in range(200):
        coins, u = rng.random((g, 1)), rng.random(g + 1)
        tau, branch, y = TOKEN.verify_block(*as_tree(x, P, Q), coins, u)
        expect = next((i for i in range(g) if not coins[i, 0] < a[i]), g)
        assert (tau, branch) == (expect, 0)
        assert TOKEN.verify_block(*as_tree(x, P, Q), coins, rng.random(g + 1))[0] == tau
        assert TOKEN.verify_block(*as_tree(x, P, Q), coins, u) == (tau, branch, y)


def test_inverse_cdf_final_token():
    x, P, Q = drafted_path(seed=0)
    coins = np.zeros((3, 1))      # accept everything
    u = np.zeros(4)               # the first bonus token of positive mass
    tau, _, y = TOKEN.verify_block(*as_tree(x, P, Q), coins, u)
    assert tau == 3 and y == np.flatnonzero(P[3] > 0)[0]
    u[3] = np.nextafter(1.0, 0.0)
    assert TOKEN.verify_block(*as_tree(x, P, Q), coins, u)[2] == np.flatnonzero(P[3] > 0)[-1]
