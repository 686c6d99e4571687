"""``traversal``: traversal verification of a draft tree, exactly and on its uniforms."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import (
    RULES,
    TabularLM,
    expected_accepted,
    full_information_tree_accepted,
    stream_law,
    target_law,
    tv,
)
from coupling.rules import traversal
from coupling.rules.traversal import TraversalControl
from coupling.rules.trie import draft_trees
from coupling.sequence import path_law
from tests.rules.tree_twins import assert_one_path_is_block, sampled_core_pvalues
from tests.strategies import drafted_trees, model_pair, rational_lm

TRAVERSAL = RULES["traversal"]
F = Fraction


def exact(*values) -> np.ndarray:
    return np.array([F(v) for v in values], dtype=object)


def constant(*values):
    law = exact(*values)
    return lambda ctx=(): law


# ------------------------------------------------------------------ lossless, exactly
@pytest.mark.parametrize("V, gamma, k, rep, order, zeros", [
    (2, 2, 2, True, 1, True), (2, 3, 2, True, 2, False), (3, 2, 2, True, 1, False),
    (3, 2, 2, False, 1, True), (3, 1, 3, False, 2, False),
])
def test_stream_law_is_the_target_law_in_exact_rationals(V, gamma, k, rep, order, zeros):
    """Whole 3-token streams, every draft tree, accepted length and emitted token, in
    Fractions: equal to the target's law, not merely close."""
    t = rational_lm(V, order, seed=10 + V + gamma, zeros=zeros)
    d = rational_lm(V, order, seed=20 + V + k, zeros=zeros)
    law = stream_law(TRAVERSAL, t, d, gamma, 3, k=k, replacement=rep)
    assert law.dtype == object and (law == target_law(t, 3)).all()


@pytest.mark.parametrize("control, rep, gamma", [
    ("plain_residual", True, 2), ("sibling_weight", True, 2), ("keep_sibling", False, 2),
])
def test_broken_variants_are_lossy(control, rep, gamma):
    """Each plausible mistake (module ``CONTROLS``) moves the stream away from the target's
    on a context-dependent pair; the rule itself does not."""
    t, d = model_pair(3, 2, 4, 0.3)
    target = target_law(t, 4)
    assert tv(stream_law(TraversalControl(control), t, d, gamma, 4, k=2, replacement=rep),
              target) > 1e-2
    assert tv(stream_law(TRAVERSAL, t, d, gamma, 4, k=2, replacement=rep), target) < 1e-12


def test_controls_are_named_and_have_no_twin():
    with pytest.raises(ValueError, match="control must be one of"):
        TraversalControl("nope")
    control = TraversalControl("keep_sibling")
    assert control.name == "traversal_keep_sibling" and not control.lossless
    with pytest.raises(ValueError, match="no torch twin"):
        _ = control.torch


# ------------------------------------------------------------------ one path
@pytest.mark.parametrize("V, gamma, seed", [(2, 3, 1), (3, 2, 2), (3, 3, 3)])
def test_one_path_is_block_verification_exactly(V, gamma, seed):
    t = rational_lm(V, 1, seed=300 + seed, zeros=seed == 1)
    d = rational_lm(V, 1, seed=400 + seed, zeros=seed == 1)
    assert expected_accepted(TRAVERSAL, t, d, gamma) == expected_accepted("block", t, d, gamma)


def test_one_path_is_block_verification_coin_for_coin():
    """With k = 1 the candidates are the depths gamma, ..., 0 with block's h_i: the same
    decisions on the same uniforms."""
    assert_one_path_is_block(TRAVERSAL)


# ------------------------------------------------------------------ pinned instances
def test_the_papers_toy_half_at_token_level_two_thirds_at_sequence_level():
    """A parent of ratio p/q = 1/2 and a child of ratio 4/3: token-level verification accepts
    both tokens with probability 1/2 x min(4/3, 1) = 1/2; traversal judges the sequence, with
    weight min(1/2 x 4/3, 1) = 2/3, also as the first leaf of a two-path tree."""
    p = np.array([[exact(F(2, 5), F(3, 5)), exact(0, 1), exact(F(1, 2), F(1, 2))]])
    q = np.array([[exact(F(4, 5), F(1, 5)), exact(F(1, 4), F(3, 4))]])
    drafts = np.array([[0, 1]])
    token_tau, _ = path_law("token", drafts[0], p[0], q[0])
    assert token_tau[2] == F(1, 2)
    first = next(traversal.schedule(drafts, p, q))
    assert first.accept == F(2, 3)
    assert traversal.law(drafts, p, q)[0][:2] == ((0, 1), F(2, 3))
    q2 = np.concatenate([q, q])
    q2[1, 1] = exact(F(1, 2), F(1, 2))
    two = next(traversal.schedule(np.array([[0, 1], [1, 0]]), np.concatenate([p, p]), q2))
    assert two.accept == F(2, 3)


def test_on_iid_paths_it_can_accept_less_than_the_rrs_walk():
    """gamma = 1, two i.i.d. drafts, p = (3/5, 0, 2/5), q = (2/5, 3/5, 0). After rejecting
    token 1, traversal tests the sibling 0 against its law *given that it exists*,
    q(0) / (1 - q(1)) = 1, so it accepts it with probability only 1/3; recursive rejection
    sampling tests it against q(0) = 2/5 (with probability 5/6), as a second i.i.d. draft
    exists only with probability about 1 - q(1): 12/25 against 3/5."""
    t, d = constant(F(3, 5), 0, F(2, 5)), constant(F(2, 5), F(3, 5), 0)
    assert expected_accepted(TRAVERSAL, t, d, 1, k=2) == F(12, 25)
    t, d = TabularLM.constant([0.6, 0, 0.4]), TabularLM.constant([0.4, 0.6, 0])
    assert expected_accepted("rrs", t, d, 1, k=2) == pytest.approx(0.6, abs=1e-12)


@given(st.integers(2, 3), st.integers(1, 3), st.integers(2, 3), st.booleans(),
       st.integers(0, 10_000), st.sampled_from([0.3, 1.0]))
@settings(max_examples=20, deadline=None)
def test_never_below_block_verification_of_the_first_path(V, gamma, k, rep, seed, conc):
    """The first path's nodes start with block verification's weights w_i, so by the node
    invariant P(tau >= i | x^i) >= w_i: traversal of k paths >= block of one."""
    if V ** (gamma * k) > 800 or (not rep and k > V):
        return
    t, d = model_pair(V, 1, seed, conc)
    assert expected_accepted(TRAVERSAL, t, d, gamma, k=k, replacement=rep) \
        >= expected_accepted("block", t, d, gamma) - 1e-12


@pytest.mark.parametrize("V, gamma, k, rep", [(2, 2, 2, True), (3, 2, 2, False),
                                              (2, 3, 3, True), (3, 2, 3, True)])
def test_at_most_the_multi_path_lp_optimum(V, gamma, k, rep):
    """No verifier of the tree beats the LP over all of them (which also knows both models)."""
    t, d = model_pair(V, 1, 11 + k, 1.0)
    lp = full_information_tree_accepted(t, d, gamma, k, replacement=rep)
    assert expected_accepted(TRAVERSAL, t, d, gamma, k=k, replacement=rep) <= lp + 1e-9


# ------------------------------------------------------------------ its laws and its core
def test_prediction_is_the_exact_conditional_expectation():
    """Averaged over the draft trees, the prediction of a call (1 + sum_i P(tau >= i | tree))
    is the exact block efficiency."""
    t, d = model_pair(3, 1, 3, 0.5)
    for rep in (True, False):
        avg = sum(float(pr) * TRAVERSAL.expected_tokens(
            TRAVERSAL.predict(x, P, Q, 0, replacement=rep))
            for x, pr, P, Q in draft_trees(t, d, 2, 2, replacement=rep))
        want = expected_accepted(TRAVERSAL, t, d, 2, k=2, replacement=rep) + 1
        assert avg == pytest.approx(want, abs=1e-12)


def test_the_core_samples_its_exact_law():
    """Sampled verify_block outcomes on drafted trees against the exact law of a call:
    chi-square, false-positive rate 1e-3 (fixed seed); the same counts reject the law of the
    plain-residual control."""
    t, d = model_pair(3, 1, 31, 1.0)
    references = [TRAVERSAL, TraversalControl("plain_residual")]
    ok, broken = sampled_core_pvalues(TRAVERSAL, references, t, d, 2, 2, seed=7)
    assert ok > 1e-3 and broken < 1e-6


def test_the_schedule_ends_at_the_root_and_its_law_sums_to_one():
    drafts, P, Q = drafted_trees(3, 3, 3, 20, seed=2)
    for b in range(drafts.shape[0]):
        steps = list(traversal.schedule(drafts[b], P[b], Q[b]))
        assert steps[-1].node == 0 and steps[-1].accept == 1.0
        assert len(steps) <= 3 * 3 + 1
        total = sum(pr for _, pr, _ in traversal.law(drafts[b], P[b], Q[b]))
        assert total == pytest.approx(1.0, abs=1e-12)


def test_distinct_first_tokens_are_checked():
    drafts, P, Q = drafted_trees(3, 2, 2, 1, seed=1)
    drafts = drafts[0].copy()
    drafts[1, 0] = drafts[0, 0]
    with pytest.raises(ValueError, match="distinct first tokens"):
        TRAVERSAL.verify_block(drafts, P[0], Q[0], np.zeros((2, 2)), np.zeros(3),
                               replacement=False)


def test_single_step_calls_point_to_the_block_api():
    with pytest.raises(ValueError, match="judges a drafted block as a whole"):
        TRAVERSAL.acceptance([0.5, 0.5], [0.5, 0.5])
