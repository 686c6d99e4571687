"""``greedy``'s batched torch twin (:mod:`coupling.rules.greedy.torch`) against its numpy core
and its exact law.

* parity: on trees whose first tokens are greedy drafts, the twin fed the numpy core's
  uniforms (explicit, or keyed by (seed, position)) decides exactly as
  ``RULES["greedy"].verify_block``, also on degenerate hypothesis laws; with one branch it is
  the token twin, coin for coin;
* exact single-step law: over 100k keyed draws the (greedy tuple, output) frequencies match
  ``RULES["greedy"].joint`` and the acceptance rate its closed form; a twin that tests the last
  draft against q must fail (chi-square at ALPHA = 1e-4, fixed seeds);
* batch invariance; the validation of greedy roots.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import RULES
from coupling.rules.greedy.torch import step, verify

from .multidraft_helpers import (
    ALPHA,
    broken_twin,
    check_batch_invariance,
    check_degenerate_parity,
    check_draft_roots,
    check_k1_is_token,
    check_parity,
    check_single_step_law,
    chi2_pvalue,
    own_law_trees,
    random_pq,
    single_step_counts,
)

GREEDY = RULES["greedy"]


def test_twin_decides_like_the_numpy_core():
    trees = own_law_trees(GREEDY, np.random.default_rng(60), 300, False, kmax=4)
    check_parity(GREEDY, trees, replacement=False)


@settings(max_examples=80, deadline=None)
@given(V=st.integers(2, 6), g=st.integers(1, 3), data=st.data())
def test_twin_decides_like_the_core_on_degenerate_laws(V, g, data):
    check_degenerate_parity(GREEDY, data, V, g, 4, False)


def test_k1_is_token_coin_for_coin():
    check_k1_is_token(GREEDY)


def test_batch_invariance():
    check_batch_invariance(GREEDY, 3, False)


# ------------------------------------------------------------------ exact single-step law
@pytest.mark.parametrize("V, k", [(4, 2), (5, 3)])
def test_single_step_joint_law(V, k):
    p, q = random_pq(np.random.default_rng(12), V, 0.8)
    check_single_step_law(GREEDY, p, q, k, False)


@pytest.mark.parametrize("q, k", [(np.array([0.3, 0.3, 0.15, 0.15, 0.1]), 2),
                                  (np.array([0.1, 0.2, 0.2, 0.05, 0.45]), 3),
                                  (np.array([0.0, 0.5, 0.25, 0.25]), 3)])
def test_draft_roots_draw_the_greedy_law(q, k):
    """Ties among the likeliest tokens go to the smaller id, as in the draft law."""
    check_draft_roots(GREEDY, q, k)


def _against_q(p_i, q_i, x, alive, coins, u, i, act):
    """Broken on purpose: the last draft tested against q (not q off the top tokens)."""
    return step(p_i, q_i, x[:, -1:], alive[:, -1:], coins[:, -1:], u, i, act)


def test_single_step_joint_negative_control():
    p, q = random_pq(np.random.default_rng(12), 4, 0.8)
    counts, J, _ = single_step_counts(broken_twin(_against_q), GREEDY, p, q, 2, False,
                                      100_000, seed=3)
    assert chi2_pvalue(counts, J) < ALPHA


# ----------------------------------------------------------------------------- validation
def test_refuses_trees_that_are_not_greedy():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    P = torch.full((1, 2, 2, 4), 0.25, dtype=torch.float64)
    Q = q.expand(1, 2, 1, 4)
    with pytest.raises(ValueError, match="no greedy draft tuple"):
        verify(torch.tensor([[[2], [3]]]), P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="replacement=False"):
        verify(torch.tensor([[[3], [2]]]), P, Q, seeds=0, positions=0)
    out = verify(torch.tensor([[[3], [2]]]), P.float(), Q.float(), seeds=0, positions=0,
                 replacement=False)
    assert out.tokens.shape == (1, 2)
