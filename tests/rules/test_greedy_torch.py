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
from coupling.torch_backend import sample_rows
from tests.strategies import distributions

from .multidraft_helpers import (
    ALPHA,
    broken_twin,
    check_batch_invariance,
    check_parity,
    check_single_step_law,
    chi2_pvalue,
    core_verdict,
    own_law_trees,
    random_pq,
    single_step_counts,
    twin_verdict,
)

GREEDY = RULES["greedy"]


def test_twin_decides_like_the_numpy_core():
    trees = own_law_trees(GREEDY, np.random.default_rng(60), 300, False, kmax=4)
    check_parity(GREEDY, trees, replacement=False)


@settings(max_examples=80, deadline=None)
@given(V=st.integers(2, 6), g=st.integers(1, 3), data=st.data())
def test_twin_decides_like_the_core_on_degenerate_laws(V, g, data):
    P = np.stack([data.draw(distributions(V)) for _ in range(g + 1)])
    Q = np.stack([data.draw(distributions(V)) for _ in range(g)])
    k = data.draw(st.integers(1, np.count_nonzero(Q[0])))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    roots = GREEDY.draw_drafts(Q[0], k, k == 1, rng)
    X = np.array([[r] + [rng.choice(V, p=Q[i]) for i in range(1, g)] for r in roots])
    unif = st.floats(0, 1, exclude_max=True)
    coins = np.array(data.draw(st.lists(unif, min_size=g * k, max_size=g * k))).reshape(g, k)
    u = np.array(data.draw(st.lists(unif, min_size=g + 1, max_size=g + 1)))
    Xt = torch.tensor(X)[None]
    Pt = torch.tensor(P)[None, None].expand(1, k, g + 1, V)
    Qt = torch.tensor(Q)[None, None].expand(1, k, g, V)
    assert twin_verdict(GREEDY, Xt, Pt, Qt, False, seeds=0, positions=0,
                        accept_u=torch.tensor(coins)[None], sample_u=torch.tensor(u)[None]) \
        == core_verdict(GREEDY, Xt, Pt, Qt, coins, u, False)


def test_k1_is_token_coin_for_coin():
    rng = np.random.default_rng(11)
    B, g, V = 300, 4, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g)))
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * g))).reshape(B, 1, g)
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 1000, B))
    a = RULES["token"].torch.verify(X, P, Q, seeds=seeds, positions=pos)
    assert torch.equal(a.tokens, verify(X, P, Q, seeds=seeds, positions=pos).tokens)


def test_batch_invariance():
    rng = np.random.default_rng(15)
    trees = [t for t in own_law_trees(GREEDY, rng, 400, False, kmax=3, sizes=(12,))
             if t[0].shape[1:] == (3, 3)]
    assert len(trees) >= 10
    check_batch_invariance(GREEDY, trees, replacement=False)


# ------------------------------------------------------------------ exact single-step law
@pytest.mark.parametrize("V, k", [(4, 2), (5, 3)])
def test_single_step_joint_law(V, k):
    p, q = random_pq(np.random.default_rng(12), V, 0.8)
    check_single_step_law(GREEDY, p, q, k, False)


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
