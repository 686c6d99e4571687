"""``block``'s batched torch twin (:mod:`coupling.rules.block.torch`) against its numpy core and
its exact laws.

* its running weights are the numpy core's to 1e-14;
* exact per-path law: over 200k keyed draws of one drafted path, the joint frequency of
  (accepted length, emitted token) matches :func:`coupling.sequence.paths.path_law`; the
  twin with the token residual at the stop must fail;
* whole-stream losslessness: batched decoding of 200k requests with tabular models (V=4,
  gamma=2) emits first-3-token strings with the target's exact law; the broken twin must fail;
* Sun et al.'s claims on the twin's samples: block accepts more than token, and 11/9 vs 10/9
  tokens on the paper's example.

Parity with the numpy core on explicit (``accept_u`` plays the coins ``eta``) and keyed numbers
(exact zeros, ratios of exactly 1 and residual masses of exactly 0, float32 laws deciding as
their float64 values, degenerate hypothesis laws), batch invariance and CUDA:
``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling.rules import RULES
from coupling.rules import block as core_block
from coupling.rules.block.torch import accepted, verify, weights
from coupling.sequence.paths import path_law
from coupling.torch_backend import Verdict, sample_rows
from coupling.torch_backend.common import (
    accept_uniforms,
    assemble,
    draft_ratios,
    emit_residual,
    sample_uniforms,
)

from ..torch_helpers import (
    ALPHA,
    BatchedTabular,
    chi2_pvalue,
    disagreeing_pair,
    path_counts,
    random_path,
    simulate_stream,
    stack_paths,
    string_counts,
)

CORE = RULES["block"]
TOKEN = RULES["token"].torch.verify


def plain_residual(drafts, p, q, *, seeds, positions, **kw) -> Verdict:
    """Negative control: block verification's accepted length with the plain token residual."""
    x, p1, q1 = drafts[:, 0], p[:, 0], q[:, 0]
    B, g = x.shape
    eta = accept_uniforms(seeds, positions, g)
    v = sample_uniforms(seeds, positions, g)
    w = weights(draft_ratios(drafts, p, q)[:, 0])
    n = accepted(w, p1, q1, eta)
    rows = torch.arange(B)
    y = emit_residual(p1, q1, n, torch.ones(B, dtype=torch.float64), v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


@pytest.fixture(scope="module")
def tabular_pair():
    return disagreeing_pair()


# ----------------------------------------------------------------------------- weights
def test_weights_match_numpy():
    rng = np.random.default_rng(3)
    paths = [random_path(rng, 6, 5, alpha=0.4) for _ in range(50)]
    x, P, Q = stack_paths(paths)
    w = weights(draft_ratios(x, P, Q)[:, 0])
    for b, (xb, Pb, Qb) in enumerate(paths):
        w_ref, _ = core_block.weights(xb, Pb, Qb)
        np.testing.assert_allclose(w[b].numpy(), w_ref, rtol=1e-14, atol=0)


# ----------------------------------------------------------------------------- exact laws
def test_per_path_law_matches_exact_path_law():
    rng = np.random.default_rng(5)
    for V, g in [(3, 3), (5, 4)]:
        x, P, Q = random_path(rng, V, g, alpha=0.7)
        tau, nxt = path_law("block", x, P, Q)
        counts = path_counts(verify, x, P, Q, 200_000)
        assert chi2_pvalue(counts, (tau[:, None] * nxt).ravel()) > ALPHA


def test_per_path_law_negative_control_fails():
    # block verification with the token residual: the emitted token law after a stop is wrong
    rng = np.random.default_rng(5)
    for V, g in [(3, 3), (5, 4)]:
        x, P, Q = random_path(rng, V, g, alpha=0.7)
        tau, nxt = path_law("block", x, P, Q)
        counts = path_counts(plain_residual, x, P, Q, 200_000)
        assert chi2_pvalue(counts, (tau[:, None] * nxt).ravel()) < ALPHA


def test_stream_is_lossless_200k_requests(tabular_pair):
    """Batched decoding of 200k requests, V=4, gamma=2: the first 3 emitted tokens have the
    target's exact law (64 strings), chi-square at ALPHA; the exact stream law of the numpy
    core equals it too (TV < 1e-12), so both implementations agree with the target."""
    target, draft = tabular_pair
    exact = coupling.target_law(target, 3)
    assert np.abs(coupling.stream_law("block", target, draft, 2, 3) - exact).sum() / 2 < 1e-12
    toks = simulate_stream(verify, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), exact) > ALPHA


def test_stream_negative_control_fails(tabular_pair):
    """Block's accepted length with the token residual is lossy: the test must see it."""
    target, draft = tabular_pair
    toks = simulate_stream(plain_residual, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) < ALPHA


def test_block_accepts_more_than_token_on_average(tabular_pair):
    """Sun et al., Theorem 2: E[tau_block] >= E[tau_token]; here the exact values differ and
    the empirical means must land on them (5 sigma)."""
    target, draft = tabular_pair
    B, g = 100_000, 3
    T, D = BatchedTabular(target), BatchedTabular(draft)
    gen = torch.Generator().manual_seed(0)
    a, b = T.start(B), D.start(B)
    xs, qs, ps = [], [], []
    for _ in range(g):
        qi = D.laws(b)
        xi = sample_rows(qi, torch.rand(B, generator=gen, dtype=torch.float64))
        ps.append(T.laws(a)), qs.append(qi), xs.append(xi)
        a, b = T.push(a, xi), D.push(b, xi)
    ps.append(T.laws(a))
    x, P, Q = torch.stack(xs, 1)[:, None], torch.stack(ps, 1)[:, None], torch.stack(qs, 1)[:, None]
    for rule, fn in [("token", TOKEN), ("block", verify)]:
        n = fn(x, P, Q, seeds=torch.arange(B), positions=0).accepted.double()
        exact = coupling.expected_accepted(rule, target, draft, g)
        assert abs(n.mean().item() - exact) < 5 * n.std().item() / B**0.5, rule
    assert coupling.expected_accepted("block", target, draft, g) > coupling.expected_accepted(
        "token", target, draft, g
    )


def test_motivating_example_exact_rates():
    """Sun et al.'s example (target (1/3, 2/3), draft (2/3, 1/3), gamma=2):
    E[tau] = 10/9 (token), 11/9 (block)."""
    B = 400_000
    p = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    q = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(B, 1, 2, generator=gen, dtype=torch.float64) >= 2 / 3).long()
    P = p.expand(B, 1, 3, 2)
    Q = q.expand(B, 1, 2, 2)
    for fn, want in [(TOKEN, 10 / 9), (verify, 11 / 9)]:
        n = fn(x, P, Q, seeds=torch.arange(B), positions=0).accepted.double()
        assert abs(n.mean().item() - want) < 5 * n.std().item() / B**0.5
