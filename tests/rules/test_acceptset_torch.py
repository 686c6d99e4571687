"""The batched twins of the LOSSY accept-set rules (:mod:`coupling.rules.typical.torch`,
:mod:`coupling.rules.relaxed.torch`) against their numpy cores and their exact laws.

* parameterised instances decide with their own parameters (``rule.torch`` is bound to them);
* the exact single-step joint (chi-square) and acceptance;
* the whole stream over trees has the rule's exact stream law (:func:`coupling.stream_law`),
  which is *not* the target's: a chi-square against the target law must fail.

Parity with the numpy core, batch invariance and CUDA: ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling.rules import RULES
from coupling.rules.relaxed import Relaxed
from coupling.rules.typical import Typical

from ..torch_helpers import (
    ALPHA,
    check_single_step_joint_law,
    chi2_pvalue,
    random_trees,
    simulate_tree_stream,
    string_counts,
    verdict_rows,
)

NAMES = ["typical", "relaxed"]


@pytest.mark.parametrize("rule", [Typical(fallback="greedy", entropy_offset=1e-5),
                                  Typical(eps=0.3, delta=0.9), Relaxed(topk=2, delta=0.05),
                                  Relaxed(topk=3, delta=0.2, fallback="sample")], ids=repr)
def test_parameterised_instances_bind_their_twin(rule):
    """``rule.torch`` verifies with the instance's own parameters (explicit uniforms)."""
    rng = np.random.default_rng(5)
    for X, P, Q in random_trees(rng, 150, True):
        g, k = X.shape[2], X.shape[1]
        coins, u = rng.random((g, k)), rng.random(g + 1)
        want = rule.verify_block(X[0].numpy(), P[0].numpy(), Q[0].numpy(), coins, u)
        got = rule.torch.verify(X, P, Q, seeds=0, positions=0,
                                accept_u=torch.tensor(coins)[None],
                                sample_u=torch.tensor(u)[None])
        assert verdict_rows(got) == [want]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("replacement, V, k", [(True, 3, 2), (False, 4, 3)])
def test_single_step_joint_law(name, replacement, V, k):
    check_single_step_joint_law(name, replacement, V, k, B=100_000)


@pytest.mark.parametrize("name", NAMES)
def test_tree_stream_has_the_rules_own_law_not_the_targets(name):
    target = coupling.TabularLM(4, order=1, seed=21, concentration=0.7)
    draft = coupling.TabularLM(4, order=1, seed=22, concentration=0.7)
    toks = simulate_tree_stream(RULES[name].torch.verify, target, draft, gamma=2, k=3,
                                length=3, B=100_000, seed=2)
    counts = string_counts(toks, 4)
    assert chi2_pvalue(counts, coupling.stream_law(name, target, draft, 2, 3, k=3)) > ALPHA
    assert chi2_pvalue(counts, coupling.target_law(target, 3)) < ALPHA       # lossy, visibly


