"""``block``: block verification (Sun et al. 2025), exactly and on its uniforms."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import RULES, expected_accepted
from coupling.lm import path_laws
from coupling.rules.block import decide
from coupling.sequence import path_law
from tests.strategies import as_tree, drafted_path, model_pair, rational_lm

BLOCK = RULES["block"]
F = Fraction


def test_weights_closed_form():
    # w_i = min_{0<=j<=i} prod_{k=j+1}^{i} p_k(x_k)/q_k(x_k)
    for seed in range(5):
        x, P, Q = drafted_path(seed=seed)
        w, h = BLOCK.weights(x, P, Q)
        r = P[np.arange(3), x] / Q[np.arange(3), x]
        for i in range(4):
            expect = min(np.prod(r[j:i]) for j in range(i + 1))
            assert w[i] == pytest.approx(min(expect, 1.0), rel=1e-12)
        assert np.all((h >= 0) & (h <= 1)) and h[3] == w[3]


def test_gamma_one_block_equals_token():
    x, P, Q = drafted_path(gamma=1)
    for a, b in zip(path_law("token", x, P, Q), path_law("block", x, P, Q), strict=True):
        assert np.allclose(a, b, atol=1e-15)


def test_prefix_acceptance_identity_exact():
    # P(tau >= i | X^i = x^i) = w_i(x^i), in exact rationals
    t, d = rational_lm(3, 2, seed=1), rational_lm(3, 2, seed=2)
    gamma = 3
    acc = {}
    for x, qx, P, Q in path_laws(t, d, gamma, context=(0,)):
        tau, _ = path_law("block", x, P, Q)
        w, _ = BLOCK.weights(x, P, Q)
        for i in range(gamma + 1):
            pre = tuple(x[:i].tolist())
            num, den, wi = acc.get(pre, (F(0), F(0), w[i]))
            assert wi == w[i]
            acc[pre] = (num + qx * sum(tau[i:]), den + qx, wi)
    for pre, (num, den, wi) in acc.items():
        assert num / den == wi, pre


def test_accepted_length_is_decided_by_the_coins_alone():
    """``tau = max{i : coins[i - 1] < h_i}`` whatever the emitted-token draws; the same
    uniforms give the same outcome."""
    x, P, Q = drafted_path(seed=2)
    g = x.size
    rng = np.random.default_rng(0)
    for _ in range(200):
        coins, u = rng.random((g, 1)), rng.random(g + 1)
        tau, branch, y = BLOCK.verify_block(*as_tree(x, P, Q), coins, u)
        assert (tau, branch) == (decide(x, P, Q, coins[:, 0]), 0)
        assert BLOCK.verify_block(*as_tree(x, P, Q), coins, rng.random(g + 1))[0] == tau
        assert BLOCK.verify_block(*as_tree(x, P, Q), coins, u) == (tau, branch, y)


def test_block_scans_past_first_failure():
    # a position whose coin fails does not stop block verification: tau is the last success
    x, P, Q = drafted_path(seed=3)
    _, h = BLOCK.weights(x, P, Q)
    coins = np.array([[0.999999], [0.999999], [0.0]])  # only the last can succeed (h_3 = w_3 > 0)
    assert h[3] > 0 and P[0, x[0]] < 0.999999 * Q[0, x[0]]  # position 1's token coin fails
    u = np.zeros(4)
    assert BLOCK.verify_block(*as_tree(x, P, Q), coins, u)[0] == 3
    assert RULES["token"].verify_block(*as_tree(x, P, Q), coins, u)[0] == 0


@given(
    st.integers(2, 4),
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(0, 10_000),
    st.sampled_from([0.3, 1.0, 3.0]),
)
@settings(max_examples=25)
def test_block_never_below_token(V, gamma, order, seed, conc):
    t, d = model_pair(V, order, seed, conc)
    tok = expected_accepted("token", t, d, gamma)
    blk = expected_accepted("block", t, d, gamma)
    assert blk >= tok - 1e-12
    if gamma == 1:
        assert blk == pytest.approx(tok, abs=1e-12)


@pytest.mark.parametrize(
    "call",
    [
        lambda p, q: BLOCK.acceptance(p, q),
        lambda p, q: BLOCK.joint(p, q),
        lambda p, q: BLOCK.bound(p, q),
        lambda p, q: BLOCK.sample(p, q, [0], np.random.default_rng(0)),
        lambda p, q: BLOCK.verify(p, q, [0], [0.5, 0.5]),
    ],
)
def test_single_step_calls_point_to_the_block_api(call):
    """Block verification judges a whole block: its single-step methods refuse by name."""
    with pytest.raises(ValueError, match="judges a drafted block as a whole"):
        call([0.5, 0.5], [0.5, 0.5])


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P[:2], Q), np.zeros((3, 1)), np.zeros(4)),
         r"p must be \[k, gamma \+ 1, V\]"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x[:2], P, Q), np.zeros((2, 1)), np.zeros(3)),
         r"p must be \[k, gamma \+ 1, V\]"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P, Q), None, np.zeros(4)),
         r"coins must be \[gamma, k\]"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P, Q), np.zeros((3, 1)), [0.1, 0.2, 0.3]),
         r"u \[gamma \+ 1\]"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P, Q), [[0.1], [1.0], [0.3]],
                                            [0.1, 0.2, 0.3, 0.2]),
         r"\[0, 1\)"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P, Q), np.zeros((3, 1)), [0.1]),
         r"u \[gamma \+ 1\]"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x + 10, P, Q), np.zeros((3, 1)), [0.1] * 4),
         "outside"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x.astype(float), P, Q), np.zeros((3, 1)),
                                            [0.1] * 4),
         "integer"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P * 2, Q), np.zeros((3, 1)), [0.1] * 4),
         "sum to 1"),
        (lambda x, P, Q: BLOCK.verify_block(*as_tree(x, P, -Q), np.zeros((3, 1)), [0.1] * 4),
         "negative"),
    ],
)
def test_verify_block_validates(call, msg):
    x, P, Q = drafted_path()
    with pytest.raises(ValueError, match=msg):
        call(x, P, Q)


def test_zero_probability_draft_is_rejected():
    x, P, Q = drafted_path()
    Q = Q.copy()
    Q[1] = 0.0
    Q[1, (x[1] + 1) % Q.shape[1]] = 1.0
    with pytest.raises(ValueError, match="draft probability"):
        path_law("block", x, P, Q)
    with pytest.raises(ValueError, match="draft probability"):
        BLOCK.verify_block(*as_tree(x, P, Q), np.zeros((3, 1)), np.zeros(4))
