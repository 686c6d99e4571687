"""``block``'s batched torch twin (:mod:`coupling.rules.block.torch`) against its numpy core and
its exact laws.

* parity: fed the same uniforms, explicit (``accept_u`` plays the coins ``eta``, ``sample_u``
  the emitted-token draws) or keyed by (seed, position) (:func:`coupling.keyed.call_uniforms`),
  the twin's verdict is the numpy core's, ``RULES["block"].verify_block``, on random laws, with
  exact zeros, ratios of exactly 1 and degenerate hypothesis laws (its residual masses are a
  plain sum reduction: the two agree up to float ties, which random float64 laws never hit);
  its running weights are the core's to 1e-14;
* exact per-path law: over 200k keyed draws of one drafted path, the joint frequency of
  (accepted length, emitted token) matches :func:`coupling.sequence.paths.path_law`; the
  twin with the token residual at the stop must fail;
* whole-stream losslessness: batched decoding of 200k requests with tabular models (V=4,
  gamma=2) emits first-3-token strings with the target's exact law; the broken twin must fail;
* Sun et al.'s claims on the twin's samples: block accepts more than token, and 11/9 vs 10/9
  tokens on the paper's example;
* batch invariance (sub-batches, permutations, duplicates) and float32 == float64 decisions.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import coupling
from coupling.rules import RULES
from coupling.rules import block as core_block
from coupling.rules.block.torch import accepted, verify, weights
from coupling.rules.common import categorical
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
    DEVICES,
    BatchedTabular,
    chi2_pvalue,
    disagreeing_pair,
    numpy_keyed_rows,
    path_counts,
    random_path,
    simulate_stream,
    stack_paths,
    string_counts,
    tree_instances,
    verdict_rows,
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


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("zeros", [False, True])
def test_twin_matches_numpy_core_on_shared_uniforms(zeros):
    rng = np.random.default_rng(1 if zeros else 2)
    for V, gamma in [(2, 1), (3, 2), (5, 4), (8, 6)]:
        B = 150
        paths = [random_path(rng, V, gamma, alpha=0.3, zeros=zeros) for _ in range(B)]
        x, P, Q = stack_paths(paths)
        au = torch.tensor(rng.random((B, gamma)))
        su = torch.tensor(rng.random((B, gamma + 1)))
        ver = verify(x, P, Q, seeds=0, positions=0, accept_u=au, sample_u=su)
        for b, (xb, Pb, Qb) in enumerate(paths):
            n, j, y = CORE.verify_block(xb[None], Pb[None], Qb[None], au[b, :, None].numpy(),
                                        su[b].numpy())
            assert verdict_rows(ver)[b] == (n, j, y), (V, gamma, b)
            assert ver.tokens[b, : n + 1].tolist() == [*xb[:n].tolist(), y]
            assert (ver.tokens[b][n + 1 :] == -1).all()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 4),
    st.sampled_from([2, 3, 7, 60]),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
)
def test_twin_matches_numpy_core_on_keyed_uniforms(case, gamma, V, dtype, zeros):
    """Each request of a batch, verified by the twin with its own keyed draws, gets the verdict
    of the numpy core fed ``call_uniforms(seed, position)``, over many keys, with exact zeros in
    the laws, with q = p on the drafted path (ratios of exactly 1, residual masses of exactly 0)
    in some requests, and in float32; verified alone, it gets the same verdict as in the
    batch."""
    rng = np.random.default_rng(case)
    B = 24
    paths = [random_path(rng, V, gamma, alpha=0.4, zeros=zeros) for _ in range(B)]
    for b in range(0, B, 5):                      # ratio exactly 1 along the whole path
        x, P, Q = paths[b]
        paths[b] = (x, np.vstack([Q, P[-1:]]) if gamma else P, Q)
    x, P, Q = stack_paths(paths, dtype=dtype)
    seeds = torch.tensor(rng.integers(0, 2**62, B))
    pos = torch.tensor(rng.integers(0, 10**6, B))
    batched = verify(x, P, Q, seeds=seeds, positions=pos)
    if gamma:
        assert verdict_rows(batched) == numpy_keyed_rows("block", x, P, Q, seeds, pos)
    else:  # no draft: the bonus token, drawn with the call's first keyed draw
        u = sample_uniforms(seeds, pos, 0)[:, 0]
        assert batched.next_token.tolist() == [categorical(P[b, 0, 0].double().numpy(),
                                                           float(u[b])) for b in range(B)]
    for b in range(B):
        one = verify(x[b : b + 1], P[b : b + 1], Q[b : b + 1], seeds=seeds[b : b + 1],
                     positions=pos[b : b + 1])
        for got, want in zip(one, batched, strict=True):
            assert got.dtype == want.dtype and torch.equal(got[0], want[b]), (gamma, b)


# the core divides p/q in numpy (q may be 1e-300 here: inf, then min(1, inf) = 1)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@given(tree_instances(max_k=1))
def test_twin_matches_numpy_core_on_degenerate_laws(inst):
    """Hypothesis laws with zeros, ties and one-hots: the twin decides exactly like the core."""
    P, Q, x, coins, u = inst
    ver = verify(torch.tensor(x)[None], torch.tensor(P)[None, None], torch.tensor(Q)[None, None],
                 seeds=0, positions=0, accept_u=torch.tensor(coins[:, 0])[None],
                 sample_u=torch.tensor(u)[None])
    assert verdict_rows(ver) == [CORE.verify_block(x, P[None], Q[None], coins, u)]


def test_weights_match_numpy():
    rng = np.random.default_rng(3)
    paths = [random_path(rng, 6, 5, alpha=0.4) for _ in range(50)]
    x, P, Q = stack_paths(paths)
    w = weights(draft_ratios(x, P, Q)[:, 0])
    for b, (xb, Pb, Qb) in enumerate(paths):
        w_ref, _ = core_block.weights(xb, Pb, Qb)
        np.testing.assert_allclose(w[b].numpy(), w_ref, rtol=1e-14, atol=0)


def test_float32_inputs_decide_like_their_float64_values():
    """All decisions are computed in float64: float32 probabilities give the decisions of
    their exact float64 values (no float32 arithmetic on the decision path)."""
    rng = np.random.default_rng(4)
    paths = [random_path(rng, 64, 5, alpha=0.2) for _ in range(300)]
    x, P, Q = stack_paths(paths, dtype=torch.float32)
    seeds = torch.arange(300)
    a = verify(x, P, Q, seeds=seeds, positions=7)
    b = verify(x, P.double(), Q.double(), seeds=seeds, positions=7, atol=1e-4)
    assert torch.equal(a.tokens, b.tokens)


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


# ----------------------------------------------------------------------------- batch invariance
@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariance(device):
    rng = np.random.default_rng(6)
    B = 64
    paths = [random_path(rng, 50, 4, alpha=0.3) for _ in range(B)]
    x, P, Q = stack_paths(paths, dtype=torch.float32, device=device)
    seeds = torch.tensor(rng.integers(0, 2**40, B), device=device)
    pos = torch.tensor(rng.integers(0, 4000, B), device=device)
    full = verify(x, P, Q, seeds=seeds, positions=pos)
    perm = torch.tensor(rng.permutation(B), device=device)
    shuffled = verify(x[perm], P[perm], Q[perm], seeds=seeds[perm], positions=pos[perm])
    assert torch.equal(shuffled.tokens, full.tokens[perm])
    for b in [0, 17, 63]:
        one = verify(x[b : b + 1], P[b : b + 1], Q[b : b + 1], seeds=seeds[b : b + 1],
                     positions=pos[b : b + 1])
        assert torch.equal(one.tokens[0], full.tokens[b])
    # the same request 5 times in one batch: 5 identical verdicts
    idx = torch.full((5,), 3, device=device)
    dup = verify(x[idx], P[idx], Q[idx], seeds=seeds[idx], positions=pos[idx])
    assert (dup.tokens == full.tokens[3]).all()
    # a different seed changes decisions somewhere
    other = verify(x, P, Q, seeds=seeds + 1, positions=pos)
    assert not torch.equal(other.tokens, full.tokens)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_cuda_matches_cpu():
    rng = np.random.default_rng(7)
    paths = [random_path(rng, 40, 4, alpha=0.3) for _ in range(128)]
    a = verify(*stack_paths(paths), seeds=torch.arange(128), positions=5)
    xc, Pc, Qc = stack_paths(paths, device="cuda")
    b = verify(xc, Pc, Qc, seeds=torch.arange(128, device="cuda"), positions=5)
    assert torch.equal(a.tokens, b.tokens.cpu())
