"""``is``'s batched torch twin (:mod:`coupling.rules.importance.torch`) against its numpy core
and its exact law.

* parity: on trees of i.i.d. branches (several survivors past the root), the twin fed the numpy
  core's uniforms (explicit, or keyed by (seed, position)) decides exactly as
  ``verify_block`` of the rule, for the weighted selection (pure torch) and the optimal one
  (numpy rows); with one branch it is the token twin, for each selection;
* the twin's selected-draft law equals the numpy core's exactly enumerated one;
* exact single-step law: over 100k keyed draws the (tuple, output) frequencies match the
  rule's joint and the acceptance rate its membership acceptance; a twin that tests the
  selected draft against q must fail (chi-square at ALPHA = 1e-4, fixed seeds);
* validation.

Parity on degenerate laws, batch invariance and CUDA: ``tests/rules/test_twins.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules.importance import ImportanceSampling, induced_law
from coupling.rules.importance.torch import induced, verify, weights
from coupling.torch_backend import sample_rows
from coupling.torch_backend.tree import first_true

from .multidraft_helpers import (
    ALPHA,
    broken_twin,
    check_k1_is_token,
    check_parity,
    check_single_step_law,
    chi2_pvalue,
    own_law_trees,
    random_pq,
    single_step_counts,
)

IS = RULES["is"]
IS_OPT = ImportanceSampling("optimal")
RULES_BY_SELECTION = {"weighted": IS, "optimal": IS_OPT}


@pytest.mark.parametrize("selection, n", [("weighted", 300), ("optimal", 80)])
def test_twin_decides_like_the_numpy_core(selection, n):
    rule = RULES_BY_SELECTION[selection]
    trees = own_law_trees(rule, np.random.default_rng(62), n, True, kmax=3, sizes=(3, 5, 8))
    check_parity(rule, trees, replacement=True, selection=selection)


def test_the_induced_law_is_the_cores():
    rng = np.random.default_rng(5)
    for V, m in [(3, 2), (5, 2), (4, 3)]:
        P, Q = rng.dirichlet(np.full(V, 0.5), size=6), rng.dirichlet(np.full(V, 0.5), size=6)
        got = induced(torch.tensor(P), torch.tensor(Q), m).numpy()
        want = np.stack([induced_law(p, q, m, "weighted") for p, q in zip(P, Q, strict=True)])
        assert np.abs(got - want).max() < 1e-15


@pytest.mark.parametrize("selection", ["weighted", "optimal"])
def test_k1_is_token_coin_for_coin(selection):
    check_k1_is_token(IS, selection=selection)


@pytest.mark.parametrize("selection, V, k", [("weighted", 3, 2), ("weighted", 4, 3),
                                             ("optimal", 3, 2)])
def test_single_step_joint_law(selection, V, k):
    p, q = random_pq(np.random.default_rng(12), V, 0.8)
    check_single_step_law(RULES_BY_SELECTION[selection], p, q, k, True, selection=selection)


def _against_q(p_i, q_i, x, alive, coins, u, i, act):
    """Broken on purpose: selects with the weights p/q, then tests against q, not q~."""
    B, k = x.shape
    rows = torch.arange(B)
    p, q = p_i.double(), q_i.double()
    s = torch.where(alive, weights(p, q, x.unsqueeze(1)).squeeze(1), 0.0)
    y = x[rows, sample_rows(s, coins[rows, first_true(alive)])]
    last = k - 1 - first_true(alive.flip(-1))
    accept = coins[rows, last] * q[rows, y] < p[rows, y]
    return torch.where(accept, y, sample_rows((p - q).clamp(min=0.0), u, fallback=p))


def test_single_step_joint_negative_control():
    p, q = random_pq(np.random.default_rng(12), 3, 0.8)
    counts, J, _ = single_step_counts(broken_twin(_against_q), IS, p, q, 2, True, 100_000,
                                      seed=3)
    assert chi2_pvalue(counts, J) < ALPHA


def test_validation():
    P = torch.full((1, 2, 2, 3), 1 / 3, dtype=torch.float64)
    Q = torch.full((1, 2, 1, 3), 1 / 3, dtype=torch.float64)
    X = torch.tensor([[[0], [1]]])
    with pytest.raises(ValueError, match="i.i.d."):
        verify(X, P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="selection"):
        verify(X, P, Q, seeds=0, positions=0, selection="best")
    with pytest.raises(ValueError, match="tuples"):
        induced(torch.full((1, 3000), 1 / 3000, dtype=torch.float64),
                torch.full((1, 3000), 1 / 3000, dtype=torch.float64), 2)
