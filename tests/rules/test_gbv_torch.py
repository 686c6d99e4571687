"""``gbv``'s batched torch twin, held to the numpy core: the same decisions on the same
uniforms, the same keyed uniforms whatever the batch, and the exact law on one tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules import gbv
from coupling.rules.gbv import GBV, GBVControl
from tests.rules.tree_twins import (
    assert_cuda_matches_cpu,
    assert_keyed_and_batch_invariant,
    numpy_verdicts,
    outcome_pvalue,
    twin_verdicts,
)
from tests.strategies import drafted_trees

GBV_RULE = RULES["gbv"]


@pytest.mark.parametrize("V, gamma, k", [(2, 3, 4), (3, 2, 3), (4, 3, 2), (6, 2, 3),
                                         (4, 4, 1)])
@pytest.mark.parametrize("conc", [0.3, 1.0])
@pytest.mark.parametrize("rank", gbv.RANKS)
def test_same_uniforms_same_decisions_as_numpy(V, gamma, k, conc, rank):
    drafts, P, Q = drafted_trees(V, gamma, k, 300, seed=V + gamma, conc=conc)
    rng = np.random.default_rng(k)
    coins, u = rng.random((300, gamma, k)), rng.random((300, gamma + 1))
    assert twin_verdicts(GBV_RULE, drafts, P, Q, coins, u, rank=rank) \
        == numpy_verdicts(GBV(rank), drafts, P, Q, coins, u)


def test_ties_are_broken_by_token_id_like_the_numpy_core():
    """Laws on a grid of eighths: many tokens tie at key 1 (p >= q) and at equal ratios."""
    rng = np.random.default_rng(3)
    drafts, P, Q = drafted_trees(4, 2, 3, 200, seed=6, conc=1.0)
    P = np.round(P * 8) + 1
    P = P / P.sum(-1, keepdims=True)
    Q = np.round(Q * 8) + 1
    Q = Q / Q.sum(-1, keepdims=True)
    coins, u = rng.random((200, 2, 3)), rng.random((200, 3))
    assert twin_verdicts(GBV_RULE, drafts, P, Q, coins, u) \
        == numpy_verdicts(GBV_RULE, drafts, P, Q, coins, u)


def test_keyed_uniforms_are_the_numpy_cores_and_batch_invariant():
    assert_keyed_and_batch_invariant(GBV_RULE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    assert_cuda_matches_cpu(GBV_RULE)


def test_one_path_is_the_block_twin_coin_for_coin():
    drafts, P, Q = drafted_trees(4, 3, 1, 200, seed=9)
    seeds = torch.arange(200)
    assert twin_verdicts(GBV_RULE, drafts, P, Q, seeds=seeds, positions=5) \
        == twin_verdicts(RULES["block"], drafts, P, Q, seeds=seeds, positions=5)


def test_the_twin_samples_the_exact_law_of_a_tree():
    """20000 keyed copies of one three-path tree against gbv.law: chi-square with
    false-positive rate 1e-3 (fixed seeds); the law of the unskewed control is rejected by
    the same counts."""
    drafts, P, Q = drafted_trees(3, 2, 3, 1, seed=3, conc=1.0)
    x, p, q = drafts[0], P[0], Q[0]
    law = gbv.law(x, p, q)
    assert len(law) == 3
    assert outcome_pvalue(GBV_RULE, law, x, p, q, 20_000) > 1e-3
    broken = GBVControl("unskewed").tree_law(x, p, q, True)
    assert outcome_pvalue(GBV_RULE, broken, x, p, q, 20_000) < 1e-6


def test_inputs_are_checked():
    drafts, P, Q = (torch.tensor(a) for a in drafted_trees(3, 2, 2, 2, seed=1))
    with pytest.raises(ValueError, match="i.i.d. paths"):
        GBV_RULE.torch.verify(drafts, P, Q, seeds=0, positions=0, replacement=False,
                              validate=False)
    with pytest.raises(ValueError, match="rank must be one of"):
        GBV_RULE.torch.verify(drafts, P, Q, seeds=0, positions=0, rank="p/q")
