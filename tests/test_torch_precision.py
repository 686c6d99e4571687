"""Every torch twin emits the law of the normalised target when its laws come in float16,
bfloat16 or float32 rows that sum to 1 only within their tolerance (``check_probs``: 2e-2,
1e-4).

The twins compute on ``p / sum p`` and ``q / sum q`` per row in float64, as the numpy cores do
(:func:`coupling.lm.check_tree`). Shown three ways:

* the issue's example, ``p = (.5, .51)``, ``q = (.5, .49)`` in float16: the first emitted
  token of 400k keyed calls has the law ``p / sum p`` (chi-square at ``ALPHA``) for every
  lossless rule, and a lossy rule's exact output law on the normalised laws
  (``rule.output_law``); the drafts themselves, which a rule taking the rows as they are
  emits here (both raw ratios are >= 1, so every draft passes), fail the same test;
* one coin between the drafted token's ratio on the raw rows and on the normalised laws: the
  twin rejects the draft, as the numpy core does, in every dtype;
* parity: on trees whose rows are scaled off 1 by up to the dtype's tolerance, for every
  draft law a rule takes (first tokens from ``rule.draw_drafts``), each request's verdict (its
  own keyed uniforms) is the numpy core's, ``RULES[name].verify_block``, on the same
  half-precision values; and the numpy core on those rows renormalised in float64 is
  lossless by exact enumeration (``stream_law == target_law``, TV < 1e-12), so the twin's
  law is the renormalised target's (a lossy rule's first token has its exact output law
  ``rule.output_law`` on the renormalised laws);
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
from coupling.dist import tuple_law
from coupling.rules import RULES

from .torch_helpers import (
    ALPHA,
    chi2_pvalue,
    draft_replacement,
    own_roots,
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
    """Branches a rule's twin verifies here: at most the rule's ``max_drafts``, but any number
    for ``gumbel``, whose walk takes any tree."""
    most = RULES[name].max_drafts
    return k if most is None or name == "gumbel" else min(k, most)


def _law_k(name: str) -> int:
    """Drafts of a call whose law the rule states: 2, or fewer if it takes fewer."""
    return min(2, RULES[name].max_drafts or 2)


def _draft_tuples(name: str, q: np.ndarray, k: int, replacement: bool, B: int,
                  seed: int) -> torch.Tensor:
    """``B`` draft tuples ``[B, k]`` from the rule's own draft law (``rule.draft_law``; a rule
    that judges blocks draws its branches' first tokens i.i.d. or successively from ``q``)."""
    rule = RULES[name]
    tuples, probs = rule.draft_law(q, k, replacement=replacement) if rule.unit == "token" \
        else tuple_law(q, k, replacement=replacement)
    return torch.tensor(tuples[np.random.default_rng(seed).choice(len(probs), B, p=probs)])


def _trees(rng: np.random.Generator, name: str, n: int, replacement: bool, sizes):
    """:func:`random_trees` with at most the rule's branches (:func:`_k`) and first tokens from
    its draft law."""
    for X, P, Q in random_trees(rng, n, replacement, sizes=sizes):
        k = _k(name, X.shape[1])
        yield own_roots(name, X[:, :k], Q[:, :k], replacement, rng), P[:, :k], Q[:, :k]


def _off(rng: np.random.Generator, law: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``law [..., V]`` with each row scaled by a factor in ``1 +- OFF``, in ``dtype``."""
    scale = 1.0 + OFF[dtype] * rng.uniform(-1.0, 1.0, size=law.shape[:-1] + (1,))
    return torch.tensor(law * scale).to(dtype)


# ----------------------------------------------------------------------------- the example
@pytest.mark.parametrize("name", list(RULES))
def test_issue_example_first_token_law(name):
    """float16 ``p = (.5, .51)``, ``q = (.5, .49)``, one draft per branch from the rule's draft
    law on ``q / sum q``: the first token of 400k calls has the law ``p / sum p`` (a lossy
    rule: its exact output law on the normalised laws)."""
    rule = RULES[name]
    p = torch.tensor([0.5, 0.51], dtype=torch.float16)
    q = torch.tensor([0.5, 0.49], dtype=torch.float16)
    pbar, qbar = (t.double().numpy() / t.double().sum().item() for t in (p, q))
    B, k = 400_000, _law_k(name)
    replacement = draft_replacement(name, k)
    X = _draft_tuples(name, qbar, k, replacement, B, seed=7)[:, :, None]
    P, Q = p.expand(B, k, 2, 2), q.expand(B, k, 1, 2)
    ver = rule.torch.verify(X, P, Q, seeds=torch.arange(B), positions=0,
                            replacement=replacement)
    want = pbar if rule.lossless else rule.output_law(pbar, qbar, k, replacement=replacement)
    counts = np.bincount(ver.tokens[:, 0].numpy(), minlength=2)
    assert chi2_pvalue(counts, want) > ALPHA
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
    rows (it renormalises them itself) and the request's keyed uniforms as the rule's twin
    draws them (``rule.call_uniforms``), or its shared noise (``rule.shared_noise``); its value
    checks hold float64 rows to 1e-9, so they are left to the twin's (``validate=False``)."""
    core, (B, k, g) = RULES[name], X.shape
    P64, Q64 = P.double().numpy(), Q.double().numpy()
    out = []
    for b in range(B):
        s, t = int(seeds[b]), int(pos[b])
        if core.shared_noise:
            noise = keyed.gumbel_noise(s, t + np.arange(g + 1), np.arange(P.shape[-1]))
            out.append(tuple(core.verify_block(X[b].numpy(), P64[b], Q64[b], noise,
                                               validate=False)))
        else:
            coins, u = core.call_uniforms(s, t, g, k)
            out.append(tuple(core.verify_block(X[b].numpy(), P64[b], Q64[b], coins, u,
                                               replacement=replacement, validate=False)))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name, replacement", [(n, r) for n, rule in RULES.items()
                                               for r in (rule.draft_laws if _k(n, 2) > 1
                                                         else (True,))])
def test_twin_matches_numpy_core_on_rows_off_by_their_tolerance(name, replacement, dtype):
    """Trees (k <= 4, gamma <= 4) of every draft law the rule takes, whose rows sum to 1 only
    within the dtype's tolerance, each verified under 32 keys: every verdict is the numpy
    core's on the same values."""
    rng = np.random.default_rng(90)
    B, n_trees = 32, 6 if name == "optimal" else 20
    deep = 0
    for X, P, Q in _trees(rng, name, n_trees, replacement, sizes=(3, 8, 20)):
        k = X.shape[1]
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
    sums is those renormalised models' target law (the law the parity above gives the twin);
    a lossy rule's first token has its exact output law on the renormalised first laws."""
    (_, target), (_, draft) = _half_tables(41)
    rule, k = RULES[name], _law_k(name)
    replacement = draft_replacement(name, k)
    law = coupling.stream_law(name, target, draft, 2, 3, k=k, replacement=replacement)
    if rule.lossless:
        assert np.abs(law - coupling.target_law(target, 3)).sum() / 2 < 1e-12
    else:
        first = law.reshape(4, -1).sum(1)
        want = rule.output_law(target(()), draft(()), k, replacement=replacement)
        assert np.abs(first - want).sum() / 2 < 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("name", list(RULES))
def test_cuda_matches_cpu_on_half_precision_laws(name):
    """bfloat16 trees with rows off by 1e-2 (the engine's dtype on a GPU): the same verdicts on
    CUDA as on the CPU."""
    rng = np.random.default_rng(91)
    replacement = draft_replacement(name, 2)
    for X, P, Q in _trees(rng, name, 10, replacement, sizes=(8, 40)):
        k, B = X.shape[1], 16
        P = _off(rng, P[0, 0].numpy(), torch.bfloat16)[None, None].expand(B, k, *P.shape[2:])
        Q = _off(rng, Q[0, 0].numpy(), torch.bfloat16)[None, None].expand(B, k, *Q.shape[2:])
        X = X.expand(B, k, X.shape[2])
        seeds, kw = torch.arange(B), {"positions": 7, "replacement": replacement}
        cpu = RULES[name].torch.verify(X, P, Q, seeds=seeds, **kw)
        gpu = RULES[name].torch.verify(X.cuda(), P.cuda(), Q.cuda(), seeds=seeds.cuda(), **kw)
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
