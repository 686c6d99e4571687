"""Every torch twin emits the law of the normalised target when its laws come in float16,
bfloat16 or float32 rows that sum to 1 only within their tolerance (``check_probs``: 2e-2,
1e-4).

The twins compute on ``p / sum p`` and ``q / sum q`` per row in float64, as the numpy cores do
(:func:`coupling.sequence.models.check_tree`). Shown three ways:

* the issue's example, ``p = (.5, .51)``, ``q = (.5, .49)`` in float16: the first emitted
  token of 400k keyed calls has the law ``p / sum p`` (chi-square at ``ALPHA``) for every rule;
  the drafts themselves, which a rule taking the rows as they are emits here (both raw ratios
  are >= 1, so every draft passes), fail the same test;
* one coin between the drafted token's ratio on the raw rows and on the normalised laws: the
  twin rejects the draft, as the numpy core does, in every dtype;
* parity: on trees whose rows are scaled off 1 by up to the dtype's tolerance, each request's
  verdict (its own keyed uniforms) is the numpy core's, ``RULES[name].verify_block``, on the
  same half-precision values; and the numpy core on those rows renormalised in float64 is
  lossless by exact enumeration (``stream_law == target_law``, TV < 1e-12), so the twin's
  law is the renormalised target's;
* whole streams: batched decoding with float16 tables whose rows are off by 1e-2 emits
  first-3-token strings with the exact law of the renormalised target (chi-square at
  ``ALPHA``).

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import coupling
from coupling import keyed
from coupling.rules import RULES

from .torch_helpers import (
    ALPHA,
    chi2_pvalue,
    draw_tuples,
    random_trees,
    simulate_stream,
    simulate_tree_stream,
    string_counts,
    verdict_rows,
)

#: how far off 1 the test scales each row, inside ``check_probs``' default tolerance
OFF = {torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float32: 5e-5}
DTYPES = list(OFF)


def _k(name: str, k: int) -> int:
    """Branches a rule's twin verifies here: one for the single-draft rules but ``gumbel``,
    whose walk takes any tree."""
    return 1 if RULES[name].max_drafts == 1 and name != "gumbel" else k


def _off(rng: np.random.Generator, law: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``law [..., V]`` with each row scaled by a factor in ``1 +- OFF``, in ``dtype``."""
    scale = 1.0 + OFF[dtype] * rng.uniform(-1.0, 1.0, size=law.shape[:-1] + (1,))
    return torch.tensor(law * scale).to(dtype)


# ----------------------------------------------------------------------------- the example
@pytest.mark.parametrize("name", list(RULES))
def test_issue_example_first_token_law(name):
    """float16 ``p = (.5, .51)``, ``q = (.5, .49)``, one draft per branch from ``q / sum q``:
    the first token of 400k calls has the law ``p / sum p``."""
    p = torch.tensor([0.5, 0.51], dtype=torch.float16)
    q = torch.tensor([0.5, 0.49], dtype=torch.float16)
    pbar, qbar = (t.double().numpy() / t.double().sum().item() for t in (p, q))
    B, k = 400_000, _k(name, 2)
    X = draw_tuples(qbar, k, B, replacement=True, seed=7)[:, :, None]
    P, Q = p.expand(B, k, 2, 2), q.expand(B, k, 1, 2)
    ver = RULES[name].torch.verify(X, P, Q, seeds=torch.arange(B), positions=0)
    counts = np.bincount(ver.tokens[:, 0].numpy(), minlength=2)
    assert chi2_pvalue(counts, pbar) > ALPHA
    # the raw rows' ratios are >= 1: a rule reading them as they are emits the draft, whose
    # law q / sum q is 1% from the target in total variation; the test sees it
    assert chi2_pvalue(np.bincount(X[:, 0, 0].numpy(), minlength=2), pbar) < ALPHA


# ----------------------------------------------------------------------------- one coin
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["token", "block", "rrs", "kseq", "optimal"])
def test_a_coin_between_the_raw_and_the_normalised_ratio(name, dtype):
    """``p`` sums above 1 and ``q`` below, by half the dtype's tolerance: the drafted token's
    ratio on the rows as they are exceeds its ratio on the normalised laws. A coin between the
    two rejects the draft, as the numpy core does (a twin reading the rows as they are
    accepts it)."""
    off = OFF[dtype] / 2
    p = torch.tensor([[0.3, 0.7 + off], [0.5, 0.5 + off]], dtype=torch.float64).to(dtype)
    q = torch.tensor([[0.4, 0.6 - off]], dtype=torch.float64).to(dtype)
    P64, Q64 = p.double().numpy(), q.double().numpy()
    raw = P64[0, 0] / Q64[0, 0]
    normalised = (P64[0, 0] / P64[0].sum()) / (Q64[0, 0] / Q64[0].sum())
    assert normalised < raw < 1
    coins = np.array([[(raw + normalised) / 2]])
    u = np.array([0.25, 0.75])
    ver = RULES[name].torch.verify(torch.tensor([[[0]]]), p[None, None], q[None, None],
                                   seeds=0, positions=0, accept_u=torch.tensor(coins)[None],
                                   sample_u=torch.tensor(u)[None])
    want = RULES[name].verify_block(np.array([[0]]), P64[None], Q64[None], coins, u,
                                    validate=False)
    assert verdict_rows(ver) == [want]
    assert want[0] == 0


# ----------------------------------------------------------------------------- parity
def _core_rows(name: str, X, P, Q, seeds, pos, replacement: bool) -> list[tuple[int, int, int]]:
    """The numpy core on each request, fed the exact float64 values of the half-precision
    rows (it renormalises them itself) and the request's keyed uniforms or noise; its value
    checks hold float64 rows to 1e-9, so they are left to the twin's (``validate=False``)."""
    core, (B, k, g) = RULES[name], X.shape
    P64, Q64 = P.double().numpy(), Q.double().numpy()
    out = []
    for b in range(B):
        s, t = int(seeds[b]), int(pos[b])
        if name == "gumbel":
            noise = keyed.gumbel_noise(s, t + np.arange(g + 1), np.arange(P.shape[-1]))
            out.append(tuple(core.verify_block(X[b].numpy(), P64[b], Q64[b], noise,
                                               validate=False)))
        else:
            coins, u = keyed.call_uniforms(s, t, g, k)
            out.append(tuple(core.verify_block(X[b].numpy(), P64[b], Q64[b], coins, u,
                                               replacement=replacement, validate=False)))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, replacement", [(n, True) for n in RULES]
                         + [("rrs", False), ("optimal", False)])
def test_twin_matches_numpy_core_on_rows_off_by_their_tolerance(name, replacement, dtype):
    """Trees (k <= 4, gamma <= 4) whose rows sum to 1 only within the dtype's tolerance, each
    verified under 32 keys: every verdict is the numpy core's on the same values."""
    rng = np.random.default_rng(90)
    B, n_trees = 32, 6 if name == "optimal" else 20
    deep = 0
    for X, P, Q in random_trees(rng, n_trees, replacement, sizes=(3, 8, 20)):
        k = _k(name, X.shape[1])
        X, P, Q = X[:, :k], P[:, :k], Q[:, :k]
        # one scaled copy of the laws, shared by the branches (they share the prefixes)
        P = _off(rng, P[0, 0].numpy(), dtype)[None, None].expand(B, k, *P.shape[2:])
        Q = _off(rng, Q[0, 0].numpy(), dtype)[None, None].expand(B, k, *Q.shape[2:])
        X = X.expand(B, *X.shape[1:])
        seeds = torch.tensor(rng.integers(0, 2**62, B))
        pos = torch.tensor(rng.integers(0, 10**6, B))
        got = RULES[name].torch.verify(X, P, Q, seeds=seeds, positions=pos,
                                       replacement=replacement)
        rows = verdict_rows(got)
        assert rows == _core_rows(name, X, P, Q, seeds, pos, replacement), name
        deep += sum(n >= 1 for n, _, _ in rows)
    assert deep >= B  # verdicts past the first offset, not only first-token stops


def _half_tables(seed: int, dtype=torch.float16):
    """A (target, draft) pair of order-1 models on V = 4 whose table rows are scaled off 1 by
    ``1 +- 1e-2`` and rounded to ``dtype`` (duck-typed for the batched lookup), and the same
    rows renormalised in float64 as exact ``TabularLM`` models."""
    rng = np.random.default_rng(seed)
    out = []
    for lm in (coupling.TabularLM(4, order=1, seed=seed, concentration=0.7),
               coupling.TabularLM(4, order=1, seed=seed + 1, concentration=0.7)):
        signs = rng.choice([-1.0, 1.0], size=lm.table.shape[:-1] + (1,))
        half = torch.tensor(lm.table * (1.0 + 1e-2 * signs)).to(dtype).double().numpy()
        raw = SimpleNamespace(vocab_size=lm.vocab_size, order=lm.order, table=half)
        out.append((raw, coupling.TabularLM.from_table(half / half.sum(-1, keepdims=True))))
    return out


@pytest.mark.parametrize("name", list(RULES))
def test_core_on_renormalised_half_laws_is_lossless(name):
    """The numpy core's exact stream law on the float16 tables' rows divided by their float64
    sums is those renormalised models' target law (the law the parity above gives the twin)."""
    (_, target), (_, draft) = _half_tables(41)
    k = 1 if RULES[name].max_drafts == 1 else 2
    law = coupling.stream_law(name, target, draft, 2, 3, k=k)
    assert np.abs(law - coupling.target_law(target, 3)).sum() / 2 < 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("name", list(RULES))
def test_cuda_matches_cpu_on_half_precision_laws(name):
    """bfloat16 trees with rows off by 1e-2 (the engine's dtype on a GPU): the same verdicts on
    CUDA as on the CPU."""
    rng = np.random.default_rng(91)
    for X, P, Q in random_trees(rng, 10, True, sizes=(8, 40)):
        k, B = _k(name, X.shape[1]), 16
        P = _off(rng, P[0, 0].numpy(), torch.bfloat16)[None, None].expand(B, k, *P.shape[2:])
        Q = _off(rng, Q[0, 0].numpy(), torch.bfloat16)[None, None].expand(B, k, *Q.shape[2:])
        X = X[:, :k].expand(B, k, X.shape[2])
        seeds = torch.arange(B)
        cpu = RULES[name].torch.verify(X, P, Q, seeds=seeds, positions=7)
        gpu = RULES[name].torch.verify(X.cuda(), P.cuda(), Q.cuda(), seeds=seeds.cuda(),
                                       positions=7)
        assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True)), name


# ----------------------------------------------------------------------------- streams
@pytest.mark.parametrize("name", ["token", "block", "minhash"])
def test_chain_stream_with_float16_tables_is_the_renormalised_target(name):
    """200k requests, V=4, gamma=2, float16 tables with rows off by 1e-2: the first 3 tokens
    have the renormalised target's exact law."""
    (raw_t, target), (raw_d, _) = _half_tables(41)
    toks = simulate_stream(RULES[name].torch.verify, raw_t, raw_d, gamma=2, length=3,
                           B=200_000, seed=3, dtype=torch.float16)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


@pytest.mark.parametrize("name", ["rrs", "kseq", "optimal"])
def test_tree_stream_with_float16_tables_is_the_renormalised_target(name):
    """100k requests, V=4, k=3 i.i.d. branches, gamma=2, float16 tables as above."""
    (raw_t, target), (raw_d, _) = _half_tables(41)
    toks = simulate_tree_stream(RULES[name].torch.verify, raw_t, raw_d, gamma=2, k=3, length=3,
                                B=100_000, seed=4, dtype=torch.float16)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA
