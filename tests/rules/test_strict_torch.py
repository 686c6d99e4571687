"""``strict``'s batched torch twin (:mod:`coupling.rules.strict.torch`) against its numpy core
and its exact laws.

* drafter invariance: three drafters and k = 1 or 3 give one stream under a seed, the target
  sampled alone by inverse CDF at ``U(seed, t, STREAM_SAMPLE, 0)``;
* the exact single-step joint (chi-square) and acceptance; whole-stream losslessness over
  trees, and a twin that draws the target's token from ``q`` must fail.

Parity with the numpy core (fed ``RULES["strict"].call_uniforms``), batch invariance and CUDA:
``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import pytest
import torch

import coupling
from coupling.keyed import STREAM_SAMPLE
from coupling.rules import RULES
from coupling.rules.strict.torch import verify
from coupling.torch_backend import sample_rows, walk_tree
from coupling.torch_backend.common import coin_uniforms
from coupling.torch_backend.rng import keyed_uniforms

from ..torch_helpers import (
    ALPHA,
    BatchedTabular,
    check_single_step_joint_law,
    chi2_pvalue,
    simulate_tree_stream,
    string_counts,
)

CORE = RULES["strict"]


@pytest.fixture(scope="module")
def models():
    return (coupling.TabularLM(4, order=1, seed=21, concentration=0.7),
            coupling.TabularLM(4, order=1, seed=22, concentration=0.7))


@pytest.mark.parametrize("replacement, V, k", [(True, 3, 2), (False, 4, 3)])
def test_single_step_joint_law(replacement, V, k):
    check_single_step_joint_law("strict", replacement, V, k, B=100_000)


def _plain_stream(target, length: int, B: int, seed: int) -> torch.Tensor:
    """The target sampled alone: token t by inverse CDF at U(seed_b, t, STREAM_SAMPLE, 0)."""
    T = BatchedTabular(target)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * seed
    tail, out = T.start(B), []
    for t in range(length):
        u = keyed_uniforms(seeds, torch.full((B,), t), STREAM_SAMPLE, 0)
        tok = sample_rows(T.laws(tail), u)
        out.append(tok)
        tail = T.push(tail, tok)
    return torch.stack(out, 1)


def test_drafter_invariance(models):
    """Three drafters (two models, and the target itself), k = 1 and 3 branches: the same
    stream, the target's own keyed samples."""
    target, draft = models
    alone = _plain_stream(target, 8, 500, 4)
    other = coupling.TabularLM(4, order=1, seed=23, concentration=0.2)
    for d in (draft, other, target):
        for k in (1, 3):
            toks = simulate_tree_stream(verify, target, d, gamma=3, k=k, length=8, B=500,
                                        seed=4)
            assert torch.equal(toks, alone), (k,)


def test_tree_stream_lossless(models):
    target, draft = models
    toks = simulate_tree_stream(verify, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


def test_tree_stream_negative_control(models):
    """A twin whose 'target' token is drawn from the draft law q must fail."""
    target, draft = models

    def broken(x, P, Q, *, seeds, positions, **kw):
        B, k, g = x.shape
        u = torch.stack([keyed_uniforms(seeds, positions + i, STREAM_SAMPLE, 0)
                         for i in range(g + 1)], 1)
        return walk_tree(lambda p_i, q_i, *a: sample_rows(q_i, a[3]), x, P, Q,
                         coin_uniforms(seeds, positions, g, k), u)

    toks = simulate_tree_stream(broken, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) < ALPHA


