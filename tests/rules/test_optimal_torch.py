"""``optimal``'s batched torch twin (:mod:`coupling.rules.optimal.torch`) against its numpy core
and its exact laws, with and without replacement.

* exact single-step law: over 40k keyed draws, the frequencies of (draft tuple, output) match
  the optimal plan's joint ``RULES["optimal"].joint`` and the acceptance rate the LP optimum;
* whole-stream losslessness over draft trees of k = 2 branches with tabular models (V = 3);
* vocabularies too wide for an exact plan are refused, not approximated.

Parity with the numpy core, batch invariance, one branch and CUDA: ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import pytest
import torch

import coupling
from coupling.rules.optimal.torch import verify

from ..torch_helpers import (
    ALPHA,
    check_single_step_joint_law,
    chi2_pvalue,
    numpy_keyed_rows,
    simulate_tree_stream,
    string_counts,
)


# ------------------------------------------------------------------ exact laws, streams
@pytest.mark.parametrize("replacement, V, k", [(True, 3, 2), (False, 4, 2)])
def test_single_step_joint_law(replacement, V, k):
    """Frequencies of (draft tuple, output) over 40k keyed draws vs the numpy exact joint."""
    check_single_step_joint_law("optimal", replacement, V, k, B=40_000)


@pytest.mark.parametrize("replacement", [True, False])
def test_tree_stream_lossless(replacement):
    """optimal solves an LP per (request, position) with >= 2 survivors: smaller run (V=3)."""
    target = coupling.TabularLM(3, order=1, seed=31, concentration=0.7)
    draft = coupling.TabularLM(3, order=1, seed=32, concentration=0.7)
    toks = simulate_tree_stream(verify, target, draft, gamma=2, k=2, length=3, B=30_000, seed=3,
                                replacement=replacement,
                                verifier_kw={"replacement": replacement})
    assert chi2_pvalue(string_counts(toks, 3), coupling.target_law(target, 3)) > ALPHA


# ----------------------------------------------------------------------------- validation
def test_large_vocabulary_samples_iid_drafts_and_refuses_distinct_ones_clearly():
    """Past the plan's size, i.i.d. drafts are sampled by the race through the cut (the numpy
    core's verdict on the same keyed uniforms); distinct drafts have no exact sampler there,
    and the twin says so."""
    V, k = 2000, 2
    P = torch.full((1, k, 2, V), 1.0 / V, dtype=torch.float64)
    Q = torch.full((1, k, 1, V), 1.0 / V, dtype=torch.float64)
    X = torch.tensor([[[3], [5]]])
    got = verify(X, P, Q, seeds=0, positions=0)
    assert [tuple(r) for r in zip(got.accepted.tolist(), got.branch.tolist(),
                                  got.next_token.tolist(), strict=True)] \
        == numpy_keyed_rows("optimal", X, P, Q, [0], [0])
    with pytest.raises(ValueError, match="no exact large-vocabulary sampler for distinct"):
        verify(X, P, Q, seeds=0, positions=0, replacement=False)
