"""``gbv``: greedy multi-path block verification, exactly and on its uniforms."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from coupling import (
    RULES,
    TabularLM,
    expected_accepted,
    full_information_tree_accepted,
    stream_law,
    target_law,
    tv,
)
from coupling.rules import gbv
from coupling.rules.gbv import GBV, GBVControl
from coupling.rules.trie import draft_trees
from tests.rules.tree_twins import assert_one_path_is_block, sampled_core_pvalues
from tests.strategies import model_pair, rational_lm

GBV_RULE = RULES["gbv"]
F = Fraction


def constant(*values):
    law = np.array([F(v) for v in values], dtype=object)
    return lambda ctx=(): law


def _first_token_law(rule, t, d, k: int) -> dict:
    law: dict = {}
    for u, _, pr in rule.outcomes(t, d, 1, (), k=k):
        law[u[0]] = law.get(u[0], 0) + pr
    return law


# ------------------------------------------------------------------ lossless, exactly
@pytest.mark.parametrize("V, gamma, k, order, zeros", [
    (2, 2, 2, 1, True), (2, 3, 2, 2, False), (3, 2, 2, 1, False), (3, 1, 3, 2, True),
    (2, 2, 3, 1, False),
])
@pytest.mark.parametrize("rank", gbv.RANKS)
def test_stream_law_is_the_target_law_in_exact_rationals(V, gamma, k, order, zeros, rank):
    """Whole 3-token streams in Fractions, on models with small denominators: the ranking
    keys tie often (every token with p >= q has capped key 1), and ties must be broken as
    the skew's CDF breaks them."""
    t = rational_lm(V, order, seed=30 + V + gamma, denom=5, zeros=zeros)
    d = rational_lm(V, order, seed=40 + V + k, denom=5, zeros=zeros)
    law = stream_law(GBV(rank), t, d, gamma, 3, k=k)
    assert law.dtype == object and (law == target_law(t, 3)).all()


def test_the_reference_tie_rule_is_lossy():
    """gamma = 1, k = 2, p = (1/5, 2/5, 2/5), q = (3/5, 1/5, 1/5): tokens 1 and 2 tie at
    min(1, p/q) = 1. Ranked by token id, the selected token has law (9, 7, 9)/25 and the
    output is p; taking the first-appearing child among tied keys (the reference code)
    selects token 1 with probability 8/25, and the output puts 11/25 on token 1."""
    t, d = constant(F(1, 5), F(2, 5), F(2, 5)), constant(F(3, 5), F(1, 5), F(1, 5))
    assert _first_token_law(GBV_RULE, t, d, 2)[1] == F(2, 5)
    assert _first_token_law(GBVControl("first_child_ties"), t, d, 2)[1] == F(11, 25)


def test_verifying_with_the_unskewed_law_is_lossy():
    t, d = model_pair(3, 2, 4, 0.3)
    target = target_law(t, 4)
    assert tv(stream_law(GBVControl("unskewed"), t, d, 2, 4, k=2), target) > 1e-2
    assert tv(stream_law(GBV_RULE, t, d, 2, 4, k=2), target) < 1e-12


def test_the_skew_is_the_law_of_the_selected_path():
    """q* along a path, multiplied out, is the probability that greedy selection picks that
    path, summed over every ordered tree (exact; ``proofs/gbv_skew.py`` does it widely)."""
    t = rational_lm(3, 1, seed=5, denom=4)
    d = rational_lm(3, 1, seed=6, denom=4)
    for k in (2, 3):
        picked: dict = {}
        skewed: dict = {}
        for x, pr, P, Q in draft_trees(t, d, 2, k):
            b, q_star = gbv.select(x, P, Q)
            path = tuple(int(v) for v in x[b])
            picked[path] = picked.get(path, 0) + pr
            skewed.setdefault(path, q_star[0][path[0]] * q_star[1][path[1]])
            assert skewed[path] == q_star[0][path[0]] * q_star[1][path[1]]  # a path's own
        assert picked == skewed, k


# ------------------------------------------------------------------ one path
def test_one_path_is_block_verification_exactly_and_coin_for_coin():
    t, d = rational_lm(3, 1, seed=301, denom=5), rational_lm(3, 1, seed=401, denom=5)
    assert expected_accepted(GBV_RULE, t, d, 3) == expected_accepted("block", t, d, 3)
    assert_one_path_is_block(GBV_RULE)


# ------------------------------------------------------------------ where it loses
def test_more_paths_can_lose_to_one_path_by_over_concentration():
    """gamma = 1, p = (3/5, 2/5), q = (7/10, 3/10). Token 1 ranks top (p/q = 4/3), so GBV
    selects it whenever some path drafted it: q*(1) = 1 - (7/10)^k, which overshoots
    p(1) = 2/5, and E[tau] = 1 - TV(p, q*) falls to 89/100 (k = 2) and 743/1000 (k = 3)
    against single-path block verification's 1 - TV(p, q) = 9/10. The maximum of k draws is
    more concentrated than one draw; greedy selection cannot undo that."""
    t, d = constant(F(3, 5), F(2, 5)), constant(F(7, 10), F(3, 10))
    assert expected_accepted("block", t, d, 1) == F(9, 10)
    assert expected_accepted(GBV_RULE, t, d, 1, k=2) == F(89, 100)
    assert expected_accepted(GBV_RULE, t, d, 1, k=3) == F(743, 1000)


def test_more_paths_can_lose_to_one_path_by_myopia():
    """At the root the target wants token 0 (0.718) and the draft proposes it (0.764); token 1
    ranks top (p/q = 1.20) and is selected whenever drafted, but after it the target wants
    token 0 (0.887) while the draft proposes token 1 (0.993): the rank at a node ignores what
    follows. Block verification accepts 1.669 tokens, GBV 1.438 with two paths, 1.158 with
    three; traversal and the LP optimum gain with k."""
    t, d = TabularLM(2, 1, seed=30, concentration=0.5), TabularLM(2, 1, seed=31,
                                                                  concentration=0.5)
    block = expected_accepted("block", t, d, 2)
    assert block == pytest.approx(1.6691385880, abs=1e-9)
    assert expected_accepted(GBV_RULE, t, d, 2, k=2) == pytest.approx(1.4375616963, abs=1e-9)
    assert expected_accepted(GBV_RULE, t, d, 2, k=3) == pytest.approx(1.1576247863, abs=1e-9)
    for k in (2, 3):
        assert expected_accepted("traversal", t, d, 2, k=k) > block
        assert full_information_tree_accepted(t, d, 2, k) > block


def test_equal_models_are_not_accepted_everywhere():
    """p = q = (1/2, 1/2): both tokens tie at key 1, token 1 is selected whenever drafted,
    q*(1) = 3/4 with two paths, and block verification of the selected token accepts
    1 - TV(p, q*) = 3/4 (the registry's equal-model table points here)."""
    t = constant(F(1, 2), F(1, 2))
    assert expected_accepted(GBV_RULE, t, t, 1, k=2) == F(3, 4)


@pytest.mark.parametrize("V, gamma, k", [(2, 2, 2), (2, 3, 3), (3, 2, 3)])
@pytest.mark.parametrize("rank", gbv.RANKS)
def test_at_most_the_multi_path_lp_optimum(V, gamma, k, rank):
    t, d = model_pair(V, 1, 21 + k, 1.0)
    lp = full_information_tree_accepted(t, d, gamma, k)
    assert expected_accepted(GBV(rank), t, d, gamma, k=k) <= lp + 1e-9


# ------------------------------------------------------------------ its laws and its core
def test_prediction_is_the_exact_conditional_expectation():
    t, d = model_pair(3, 1, 3, 0.5)
    avg = sum(float(pr) * GBV_RULE.expected_tokens(GBV_RULE.predict(x, P, Q, 0))
              for x, pr, P, Q in draft_trees(t, d, 2, 2))
    assert avg == pytest.approx(expected_accepted(GBV_RULE, t, d, 2, k=2) + 1, abs=1e-12)


def test_the_core_samples_its_exact_law():
    """Sampled verify_block outcomes on drafted trees against the exact law of a call:
    chi-square, false-positive rate 1e-3 (fixed seed); the same counts reject the law of the
    unskewed control."""
    t, d = model_pair(3, 1, 31, 1.0)
    ok, broken = sampled_core_pvalues(GBV_RULE, [GBV_RULE, GBVControl("unskewed")], t, d, 2, 3,
                                      seed=8)
    assert ok > 1e-3 and broken < 1e-6


def test_ranks_and_draft_models_are_checked():
    with pytest.raises(ValueError, match="rank must be one of"):
        GBV("p/q")
    with pytest.raises(ValueError, match="does not support k=2, replacement=False"):
        expected_accepted(GBV_RULE, *model_pair(2, 1, 0), 2, k=2, replacement=False)
    control = GBVControl("first_child_ties")
    assert control.name == "gbv_first_child_ties" and not control.lossless
    with pytest.raises(ValueError, match="no torch twin"):
        _ = control.torch


def test_skewed_in_given_buffers_is_the_same_arithmetic():
    """With ``overwrite_below`` and ``work`` (the twin's reuse of memory) the skew is the
    plain call's bit for bit, and ``below`` is left alone without ``overwrite_below``."""
    rng = np.random.default_rng(2)
    for k in (1, 2, 3, 4, 7):
        q = rng.dirichlet(np.ones(50))
        below = rng.random(50) * 0.9
        kept = below.copy()
        want = gbv.skewed(q, below, 0.3, 0.2, k)
        np.testing.assert_array_equal(below, kept)
        work = tuple(np.empty(50) for _ in range(3))
        got = gbv.skewed(q, below.copy(), 0.3, 0.2, k, overwrite_below=True, work=work)
        np.testing.assert_array_equal(got, want)
