"""``token``'s batched torch twin (:mod:`coupling.rules.token.torch`) against its numpy core and
its exact laws.

* exact per-path law: over 200k keyed draws of one drafted path, the joint frequency of
  (accepted length, emitted token) matches :func:`coupling.sequence.paths.path_law`;
* whole-stream losslessness: batched decoding of 200k requests with tabular models (V=4,
  gamma=2) emits first-3-token strings with the target's exact law; a twin that resamples
  the target after a rejection must fail.

Parity with the numpy core on explicit and keyed numbers (exact zeros, ratios of exactly 1,
float32 laws deciding as their float64 values, degenerate hypothesis laws), batch invariance
and CUDA: ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling.rules import RULES
from coupling.rules.token.torch import accepted, verify
from coupling.sequence.paths import path_law
from coupling.torch_backend import Verdict, sample_rows
from coupling.torch_backend.common import (
    accept_uniforms,
    assemble,
    draft_ratios,
    sample_uniforms,
)

from ..torch_helpers import (
    ALPHA,
    chi2_pvalue,
    disagreeing_pair,
    path_counts,
    random_path,
    simulate_stream,
    string_counts,
)

CORE = RULES["token"]


def resample_target(drafts, p, q, *, seeds, positions, **kw) -> Verdict:
    """Negative control: token verification that resamples from p (no residual) on rejection."""
    x, p1 = drafts[:, 0], p[:, 0]
    B, g = x.shape
    u = accept_uniforms(seeds, positions, g)
    v = sample_uniforms(seeds, positions, g)
    n = accepted(draft_ratios(drafts, p, q)[:, 0], u)
    rows = torch.arange(B)
    y = sample_rows(p1[rows, n], v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


@pytest.fixture(scope="module")
def tabular_pair():
    return disagreeing_pair()


# ----------------------------------------------------------------------------- exact laws
def test_per_path_law_matches_exact_path_law():
    rng = np.random.default_rng(5)
    for V, g in [(3, 3), (5, 4)]:
        x, P, Q = random_path(rng, V, g, alpha=0.7)
        tau, nxt = path_law("token", x, P, Q)
        counts = path_counts(verify, x, P, Q, 200_000)
        assert chi2_pvalue(counts, (tau[:, None] * nxt).ravel()) > ALPHA


def test_stream_is_lossless_200k_requests(tabular_pair):
    """Batched decoding of 200k requests, V=4, gamma=2: the first 3 emitted tokens have the
    target's exact law (64 strings), chi-square at ALPHA; the exact stream law of the numpy
    core equals it too (TV < 1e-12), so both implementations agree with the target."""
    target, draft = tabular_pair
    exact = coupling.target_law(target, 3)
    assert np.abs(coupling.stream_law("token", target, draft, 2, 3) - exact).sum() / 2 < 1e-12
    toks = simulate_stream(verify, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), exact) > ALPHA


def test_stream_negative_control_fails(tabular_pair):
    """Resampling the target after a rejection (no residual) is lossy: the test must see it."""
    target, draft = tabular_pair
    toks = simulate_stream(resample_target, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) < ALPHA
