"""``gls``'s batched torch twin (:mod:`coupling.rules.gls.torch`): keyed noise columns, the
list drafter and the verifier.

* the keyed columns equal the numpy :func:`coupling.rules.gls.list_noise` (within
  ``keyed.NOISE_ULPS`` units where the libraries' ``log`` round apart); with one column they
  are the gumbel rule's noise, and their maximum is it shifted by log k;
* the law of the keyed construction: over 200k seeds the (draft tuple, output) frequencies at
  one position match the exact joint ``RULES["gls"].joint`` (chi-square) and the acceptance
  its closed form; i.i.d. columns drawn from the numpy generator agree too;
* drafter invariance: three drafters and k = 1, 2, 4 give one stream under a seed, the target
  sampled alone by keyed Gumbel-max; with k = 1 the twin is the gumbel twin, verdict for
  verdict; the stream has the target's law, and a drafter that reuses one column for every
  branch changes the acceptance, not the stream;
* parity with the numpy core (``verify_block`` fed ``G*``) and batch invariance:
  ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling import keyed
from coupling.dist import tuple_law
from coupling.rules import RULES
from coupling.rules.gls import list_noise as np_list_noise
from coupling.rules.gls.torch import draft, list_noise, verify
from coupling.rules.gumbel.torch import draft as gumbel_draft
from coupling.rules.gumbel.torch import verify as gumbel_verify
from coupling.torch_backend import gumbel_noise

from ..torch_helpers import (
    ALPHA,
    BatchedTabular,
    chi2_pvalue,
    random_pq,
    simulate_tree_stream,
    string_counts,
    tuple_rows,
)

CORE = RULES["gls"]


def branch_drafter(k: int):
    """Branch ``c`` (row ``b * k + c`` of the flattened tree) drafts with column ``c``."""

    def draw(q_rows, seeds, pos):
        N, V = q_rows.shape
        q = q_rows.view(N // k, k, V)
        return draft(q, seeds.view(N // k, k)[:, 0], pos.view(N // k, k)[:, 0]).reshape(-1)

    return draw


def test_keyed_columns_equal_the_numpy_ones():
    """The same keys and the same arithmetic; numpy's and torch's ``log`` and ``logaddexp``
    may round apart by an ulp (the promise of :mod:`coupling.keyed`): the columns and their
    maxima (from the shared G*) agree to ``keyed.NOISE_ULPS`` units and pick the same column,
    also on keys whose G* differs between the backends where numpy's SIMD loops are off."""
    for seed, pos, V, k in [(0, 0, 5, 1), (3, 17, 9, 2), (2**40, 10**6, 33, 8), (14, 10**6, 33, 8),
                            (12, 0, 5, 1)]:
        got = list_noise(torch.tensor(seed), torch.tensor(pos), V, k).numpy()
        want = np_list_noise(seed, pos, V, k)
        assert np.array_equal(got.argmax(0), want.argmax(0))
        for a, b in ((want, got), (want.max(0), got.max(0))):
            assert keyed.noise_gap(a, b) <= keyed.NOISE_ULPS
    G1 = list_noise(torch.tensor([4, 5]), torch.tensor([7, 7]), 20, 1)[:, 0]
    assert torch.equal(G1, gumbel_noise(torch.tensor([4, 5]), torch.tensor([7, 7]), 20,
                                        dtype=torch.float64))
    G = list_noise(torch.tensor([4, 5]), torch.tensor([7, 7]), 20, 3)
    assert torch.allclose(G.max(-2).values - np.log(3), G1, rtol=0, atol=1e-13)


def _one_position(p, q, k, B, columns):
    """Drafts of ``k`` branches and the verified token at one position, ``B`` seeds."""
    V = p.size
    seeds = torch.arange(B)
    Q = torch.tensor(q).expand(B, k, V)
    X = columns(Q, seeds)
    P = torch.tensor(p).expand(B, k, 2, V)
    ver = verify(X[:, :, None], P, Q[:, :, None], seeds=seeds, positions=0)
    return X, ver


@pytest.mark.parametrize("V, k", [(3, 2), (3, 3), (4, 2)])
def test_keyed_construction_has_the_exact_gls_law(V, k):
    rng = np.random.default_rng(12 + k)
    p, q = random_pq(rng, V, 0.8)
    B = 200_000
    X, ver = _one_position(p, q, k, B, lambda Q, s: draft(Q, s, 0))
    tuples, _ = tuple_law(q, k)
    row = tuple_rows(X, tuples, V)
    counts = np.bincount((row * V + ver.tokens[:, 0]).numpy(), minlength=len(tuples) * V)
    assert chi2_pvalue(counts, CORE.joint(p, q, k).ravel()) > ALPHA
    acc, want = ver.accepted.double().mean().item(), CORE.acceptance(p, q, k)
    assert abs(acc - want) < 5 * np.sqrt(want * (1 - want) / B)


def test_one_column_for_every_branch_is_another_coupling():
    """Negative control: a drafter that gives every branch column 0 (one shared noise vector,
    so identical drafts) keeps the stream but not the gls law."""
    rng = np.random.default_rng(14)
    p, q = random_pq(rng, 3, 0.8)
    k, B = 2, 200_000

    def shared(Q, s):
        return gumbel_draft(Q[:, 0], s, 0)[:, None].expand(-1, k)

    X, ver = _one_position(p, q, k, B, shared)
    tuples, _ = tuple_law(q, k)
    counts = np.bincount((tuple_rows(X, tuples, 3) * 3 + ver.tokens[:, 0]).numpy(),
                         minlength=len(tuples) * 3)
    assert chi2_pvalue(counts, CORE.joint(p, q, k).ravel()) < ALPHA


def _alone(target, length: int, B: int, seed: int) -> torch.Tensor:
    """The target sampled alone by keyed Gumbel-max."""
    T = BatchedTabular(target)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * seed
    tail, out = T.start(B), []
    for t in range(length):
        G = gumbel_noise(seeds, torch.full((B,), t), target.vocab_size, dtype=torch.float64)
        tok = torch.argmax(T.laws(tail).log() + G, -1)
        out.append(tok)
        tail = T.push(tail, tok)
    return torch.stack(out, 1)


def test_drafter_invariance():
    target = coupling.TabularLM(4, order=1, seed=21, concentration=0.7)
    alone = _alone(target, 10, 400, 4)
    drafters = [coupling.TabularLM(4, order=1, seed=s, concentration=c)
                for s, c in ((22, 0.7), (23, 0.2))] + [target]
    for d in drafters:
        for k in (1, 2, 4):
            toks = simulate_tree_stream(verify, target, d, gamma=3, k=k, length=10, B=400,
                                        seed=4, drafter=branch_drafter(k))
            assert torch.equal(toks, alone), k


def test_k1_is_the_gumbel_twin():
    rng = np.random.default_rng(3)
    B, g, V = 200, 3, 12
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g)))
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 1000, B))
    t = pos.view(B, 1) + torch.arange(g)
    X = torch.stack([draft(Q[:, :, i], seeds, t[:, i]) for i in range(g)], -1)
    Xg = torch.stack([gumbel_draft(Q[:, 0, i], seeds, t[:, i]) for i in range(g)], -1)[:, None]
    assert torch.equal(X, Xg)
    a = verify(X, P, Q, seeds=seeds, positions=pos)
    b = gumbel_verify(X, P, Q, seeds=seeds, positions=pos)
    assert torch.equal(a.tokens, b.tokens) and int(a.accepted.sum()) > 0


def test_tree_stream_lossless():
    target = coupling.TabularLM(4, order=1, seed=21, concentration=0.7)
    d = coupling.TabularLM(4, order=1, seed=22, concentration=0.7)
    toks = simulate_tree_stream(verify, target, d, gamma=2, k=3, length=3, B=100_000, seed=2,
                                drafter=branch_drafter(3))
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


def test_drafter_validates():
    with pytest.raises(ValueError, match="q must be"):
        draft(torch.ones(3), 0, 0)
    with pytest.raises(ValueError, match="k must be"):
        list_noise(0, 0, 5, 0)
