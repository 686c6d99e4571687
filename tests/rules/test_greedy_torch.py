"""``greedy``'s batched torch twin (:mod:`coupling.rules.greedy.torch`) against its numpy core
and its exact law.

* exact single-step law: over 100k keyed draws the (greedy tuple, output) frequencies match
  ``RULES["greedy"].joint`` and the acceptance rate its closed form; a twin that tests the last
  draft against q must fail (chi-square at ALPHA = 1e-4, fixed seeds);
* the validation of greedy roots.

Parity with the numpy core (on trees of greedy drafts), batch invariance, one branch and CUDA:
``tests/rules/test_twins.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules.greedy.torch import step, verify

from .multidraft_helpers import (
    ALPHA,
    broken_twin,
    check_draft_roots,
    check_single_step_law,
    chi2_pvalue,
    random_pq,
    single_step_counts,
)

GREEDY = RULES["greedy"]


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
