"""``gbv``'s batched torch twin, held to the numpy core: the same decisions on the same
uniforms for every ranking, ties broken by token id, the same decisions at a large vocabulary,
and the exact law on one tree (keyed parity, batch invariance, one path and CUDA:
``tests/rules/test_twins.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules import gbv
from coupling.rules.gbv import GBV, GBVControl
from coupling.rules.gbv import torch as gbv_torch
from tests.rules.tree_twins import (
    numpy_verdicts,
    outcome_pvalue,
    twin_verdicts,
)
from tests.strategies import drafted_trees

GBV_RULE = RULES["gbv"]


@pytest.mark.parametrize("V, gamma, k", [(2, 3, 4), (3, 2, 3), (4, 3, 2), (6, 2, 3),
                                         (4, 4, 1)])
@pytest.mark.parametrize("conc", [0.3, 1.0])
@pytest.mark.parametrize("rank", gbv.RANKS)
def test_same_uniforms_same_decisions_as_numpy(V, gamma, k, conc, rank):
    drafts, P, Q = drafted_trees(V, gamma, k, 300, seed=V + gamma, conc=conc)
    rng = np.random.default_rng(k)
    coins, u = rng.random((300, gamma, k)), rng.random((300, gamma + 1))
    assert twin_verdicts(GBV_RULE, drafts, P, Q, coins, u, rank=rank) \
        == numpy_verdicts(GBV(rank), drafts, P, Q, coins, u)


def test_ties_are_broken_by_token_id_like_the_numpy_core():
    """Laws on a grid of eighths: many tokens tie at key 1 (p >= q) and at equal ratios."""
    rng = np.random.default_rng(3)
    drafts, P, Q = drafted_trees(4, 2, 3, 200, seed=6, conc=1.0)
    P = np.round(P * 8) + 1
    P = P / P.sum(-1, keepdims=True)
    Q = np.round(Q * 8) + 1
    Q = Q / Q.sum(-1, keepdims=True)
    coins, u = rng.random((200, 2, 3)), rng.random((200, 3))
    assert twin_verdicts(GBV_RULE, drafts, P, Q, coins, u) \
        == numpy_verdicts(GBV_RULE, drafts, P, Q, coins, u)


def test_the_twin_samples_the_exact_law_of_a_tree():
    """20000 keyed copies of one three-path tree against gbv.law: chi-square with
    false-positive rate 1e-3 (fixed seeds); the law of the unskewed control is rejected by
    the same counts."""
    drafts, P, Q = drafted_trees(3, 2, 3, 1, seed=3, conc=1.0)
    x, p, q = drafts[0], P[0], Q[0]
    law = gbv.law(x, p, q)
    assert len(law) == 3
    assert outcome_pvalue(GBV_RULE, law, x, p, q, 20_000) > 1e-3
    broken = GBVControl("unskewed").tree_law(x, p, q, True)
    assert outcome_pvalue(GBV_RULE, broken, x, p, q, 20_000) < 1e-6


def test_inputs_are_checked():
    drafts, P, Q = (torch.tensor(a) for a in drafted_trees(3, 2, 2, 2, seed=1))
    with pytest.raises(ValueError, match="i.i.d. paths"):
        GBV_RULE.torch.verify(drafts, P, Q, seeds=0, positions=0, replacement=False,
                              validate=False)
    with pytest.raises(ValueError, match="rank must be one of"):
        GBV_RULE.torch.verify(drafts, P, Q, seeds=0, positions=0, rank="p/q")


def _rows(seed: int, R: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Normalised float64 row pairs of several kinds: smooth, sparse (zeros in ``p`` and in
    ``q``) and on a grid of eighths (ties at every key)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.3), R)
    q = rng.dirichlet(np.full(V, 0.3), R)
    p[R // 3: 2 * R // 3] *= rng.random((2 * R // 3 - R // 3, V)) < 0.6
    q[R // 3: 2 * R // 3] *= rng.random((2 * R // 3 - R // 3, V)) < 0.6
    p[2 * R // 3:] = np.round(p[2 * R // 3:] * 8 * V / 4) + 1
    q[2 * R // 3:] = np.round(q[2 * R // 3:] * 8 * V / 4) + 1
    return p / p.sum(-1, keepdims=True), q / q.sum(-1, keepdims=True)


def _numpy_below(p: np.ndarray, q: np.ndarray, rank: str) -> np.ndarray:
    return np.stack([gbv.skew(q[r], gbv.rank_order(p[r], q[r], rank), 0.0, 1.0, 1)[1]
                     for r in range(p.shape[0])])


@pytest.mark.parametrize("rank", gbv.RANKS)
def test_mass_below_is_the_numpy_cores_rank_cumsum(rank):
    """F^- of every token with q > 0, for a batch of rows (padded) and row by row (the CPU
    chunk at a large vocabulary), against the numpy core's sort and cumulative sum."""
    p, q = _rows(1, 12, 300)
    want = _numpy_below(p, q, rank)
    pt, qt = torch.tensor(p), torch.tensor(q)
    batch = gbv_torch.mass_below(pt, qt, rank).numpy()
    single = np.concatenate([gbv_torch.mass_below(pt[r:r + 1], qt[r:r + 1], rank).numpy()
                             for r in range(12)])
    mass = q > 0
    np.testing.assert_allclose(batch[mass], want[mass], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(single[mass], want[mass], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("rank", gbv.RANKS)
def test_mass_below_token_needs_no_sort(rank):
    """F^-(t) of one token per row, tokens of capped key 1 and under it mixed in one batch, and
    each row alone: the numpy core's value at t."""
    p, q = _rows(2, 12, 300)
    want = _numpy_below(p, q, rank)
    rng = np.random.default_rng(3)
    pt, qt = torch.tensor(p), torch.tensor(q)
    for _ in range(20):
        t = np.array([rng.choice(np.flatnonzero(q[r] > 0)) for r in range(12)])
        tt = torch.tensor(t)
        key = gbv_torch.rank_keys(pt[torch.arange(12), tt], qt[torch.arange(12), tt], rank)
        got = gbv_torch.mass_below_token(pt, qt, tt, key, rank).numpy()
        alone = [float(gbv_torch.mass_below_token(pt[r:r + 1], qt[r:r + 1], tt[r:r + 1],
                                                  key[r:r + 1], rank)) for r in range(12)]
        np.testing.assert_allclose(got, want[np.arange(12), t], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(alone, want[np.arange(12), t], rtol=1e-12, atol=1e-15)


def _large_trees(B: int, k: int, g: int, V: int, seed: int):
    """``B`` i.i.d.-path trees over a vocabulary of ``V``: softmax laws per node (target logits
    ``N(0, 3^2)``, draft logits those plus ``N(0, 1)``), shared along shared prefixes."""
    rng = np.random.default_rng(seed)
    drafts = np.zeros((B, k, g), dtype=np.int64)
    P, Q = np.zeros((B, k, g + 1, V)), np.zeros((B, k, g, V))
    for b in range(B):
        laws: dict = {}
        for j in range(k):
            for d in range(g + 1):
                prefix = tuple(drafts[b, j, :d])
                if prefix not in laws:
                    z = rng.normal(0.0, 3.0, V)
                    zq = z + rng.normal(0.0, 1.0, V)
                    laws[prefix] = (np.exp(z - z.max()), np.exp(zq - zq.max()))
                pd, qd = (x / x.sum() for x in laws[prefix])
                P[b, j, d] = pd
                if d < g:
                    Q[b, j, d] = qd
                    drafts[b, j, d] = rng.choice(V, p=qd)
    return drafts, P, Q


@pytest.mark.parametrize("rank", gbv.RANKS)
def test_same_decisions_as_numpy_at_a_large_vocabulary(rank):
    """V = 40000: the twin's chunks are single requests (one row per sort on a CPU); the
    decisions are still the numpy core's."""
    drafts, P, Q = _large_trees(6, 3, 3, 40_000, seed=5)
    rng = np.random.default_rng(6)
    coins, u = rng.random((6, 3, 3)), rng.random((6, 4))
    assert twin_verdicts(GBV_RULE, drafts, P, Q, coins, u, rank=rank) \
        == numpy_verdicts(GBV(rank), drafts, P, Q, coins, u)
