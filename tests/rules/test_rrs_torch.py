"""``rrs``'s batched torch twin (:mod:`coupling.rules.rrs.torch`) against its numpy core and its
exact laws, with and without replacement.

* exact single-step law: over 200k keyed draws, the frequencies of (draft tuple, output) match
  ``RULES["rrs"].joint`` and the acceptance rate ``RULES["rrs"].acceptance``; a twin that
  keeps the target after a rejection must fail;
* whole-stream losslessness over draft trees (k = 3 i.i.d. branches, or distinct first tokens
  without replacement) with tabular models: first-3-token strings have the target's exact law;
  a walk whose residual ignores the rejected drafts must fail;
* validation.

Parity with the numpy core, batch invariance, one branch and CUDA: ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling.dist import tuple_law
from coupling.rules import RULES
from coupling.rules.rrs.torch import verify
from coupling.torch_backend import sample_rows, walk_tree
from coupling.torch_backend.common import coin_uniforms, sample_uniforms

from ..torch_helpers import (
    ALPHA,
    check_single_step_joint_law,
    chi2_pvalue,
    draw_tuples,
    random_pq,
    simulate_tree_stream,
    single_step_inputs,
    string_counts,
)


@pytest.fixture(scope="module")
def models():
    return (coupling.TabularLM(4, order=1, seed=21, concentration=0.7),
            coupling.TabularLM(4, order=1, seed=22, concentration=0.7))


def _keep_target_step(p_i, q_i, x, alive, coins, u, i, act):
    """rrs without the residual update: every draft is tested against the target p."""
    r, qc = p_i.double(), q_i.double()
    y = torch.full((x.shape[0],), -1)
    for j in range(x.shape[1]):
        xj = x[:, j : j + 1]
        acc = (y < 0) & alive[:, j] & (coins[:, j] * qc.gather(1, xj)[:, 0] < r.gather(1, xj)[:, 0])
        y = torch.where(acc, xj[:, 0], y)
    res = (r - qc).clamp(min=0)
    return torch.where(y >= 0, y, sample_rows(res, u))


def _target_residual_step(p_i, q_i, x, alive, coins, u, i, act):
    """rrs whose final draw ignores the rejected drafts: it samples p, not the residual."""
    r, qc = p_i.double(), q_i.double()
    y = torch.full((x.shape[0],), -1)
    for j in range(x.shape[1]):
        xj = x[:, j : j + 1]
        acc = (y < 0) & alive[:, j] & (coins[:, j] * qc.gather(1, xj)[:, 0] < r.gather(1, xj)[:, 0])
        y = torch.where(acc, xj[:, 0], y)
        d = (r - qc).clamp(min=0)
        r = torch.where(((y < 0) & alive[:, j])[:, None],
                        d / d.sum(1, keepdim=True).clamp(min=1e-300), r)
    return torch.where(y >= 0, y, sample_rows(p_i, u))  # BUG: p instead of r


# ------------------------------------------------------------------ exact single-step laws
@pytest.mark.parametrize("replacement, V, k", [(True, 3, 2), (False, 4, 3)])
def test_single_step_joint_law(replacement, V, k):
    """Frequencies of (draft tuple, output) over 200k keyed draws vs the numpy exact joint."""
    check_single_step_joint_law("rrs", replacement, V, k, B=200_000)


def test_single_step_joint_negative_control():
    """rrs that keeps the target p after a rejection (no residual update) must fail."""
    rng = np.random.default_rng(12)
    p, q = random_pq(rng, 3, 0.8)
    B, k = 200_000, 2
    X = draw_tuples(q, k, B, True, seed=3)
    drafts, P, Q = single_step_inputs(p, q, X)
    seeds = torch.arange(B)
    ver = walk_tree(_keep_target_step, drafts, P, Q, coin_uniforms(seeds, seeds * 0, 1, k),
                    sample_uniforms(seeds, seeds * 0, 1))
    tuples, _ = tuple_law(q, k)
    row = X[:, 0] * 3 + X[:, 1]
    counts = np.bincount((row * 3 + ver.tokens[:, 0]).numpy(), minlength=27)
    assert chi2_pvalue(counts, RULES["rrs"].joint(p, q, k).ravel()) < ALPHA


# ----------------------------------------------------------------------------- tree streams
@pytest.mark.parametrize("replacement", [True, False])
def test_tree_stream_lossless(replacement, models):
    """100k requests, V=4, k=3 branches, gamma=2: first 3 tokens ~ target's exact law."""
    target, draft = models
    toks = simulate_tree_stream(verify, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2,
                                replacement=replacement,
                                verifier_kw={"replacement": replacement})
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


def test_tree_stream_negative_control(models):
    """A tree walk whose residual ignores the rejected drafts (samples p) must fail."""
    target, draft = models

    def broken(x, P, Q, *, seeds, positions, **kw):
        B, k, g = x.shape
        return walk_tree(_target_residual_step, x, P, Q, coin_uniforms(seeds, positions, g, k),
                         sample_uniforms(seeds, positions, g))

    toks = simulate_tree_stream(broken, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) < ALPHA


# ----------------------------------------------------------------------------- validation
def test_validation():
    P = torch.full((2, 2, 2, 5), 0.2)
    Q = torch.full((2, 2, 1, 5), 0.2)
    X = torch.tensor([[[1], [1]], [[0], [2]]])
    with pytest.raises(ValueError, match="distinct first tokens"):
        verify(X, P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="accept_u must be"):
        verify(X, P, Q, seeds=0, positions=0, accept_u=torch.zeros(2, 1, 3))
