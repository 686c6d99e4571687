"""``kseq``'s batched torch twin (:mod:`coupling.rules.kseq.torch`) against its numpy core and its
exact laws.

* parity: fed the same uniforms, explicit (``accept_u [B, g, k]``, ``sample_u [B, g+1]``) or
  keyed by (seed, position) (:func:`coupling.keyed.call_uniforms`), the twin's verdict is the
  numpy core's, ``RULES["kseq"].verify_block``, on random trees and degenerate hypothesis laws
  (a core with rho pinned to 1 disagrees: the comparison can fail);
* the batched root ``kseq_rho`` equals the numpy root :func:`coupling.rules.kseq.rho.optimal_rho`
  row by row to 1e-12 relative and keeps the validity margin, on sparse, dense (V = 49152),
  clustered, float32-rounded and flat-margin laws;
* exact single-step law: over 200k keyed draws, the frequencies of (draft tuple, output) match
  ``RULES["kseq"].joint`` and the acceptance rate ``RULES["kseq"].acceptance``;
* whole-stream losslessness over draft trees of k = 3 i.i.d. branches with tabular models.

Batch invariance, one branch and CUDA (and parity on every rule): ``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given

import coupling
from coupling.rules import kseq as core_kseq
from coupling.rules.common import categorical
from coupling.rules.kseq import rho as core_rho
from coupling.rules.kseq.torch import kseq_rho, verify

from ..torch_helpers import (
    ALPHA,
    check_degenerate_parity,
    check_keyed_tree_parity,
    check_single_step_joint_law,
    chi2_pvalue,
    numpy_keyed_rows,
    random_pq,
    random_trees,
    simulate_tree_stream,
    string_counts,
    tree_instances,
    verdict_rows,
)

EPS = np.finfo(float).eps


@pytest.fixture(scope="module")
def models():
    return (coupling.TabularLM(4, order=1, seed=21, concentration=0.7),
            coupling.TabularLM(4, order=1, seed=22, concentration=0.7))


def _verify_rho_one(p, q, drafts, u_accept, u_resid):
    """K-SEQ with rho pinned to 1 instead of the smallest valid rho: a plausible wrong core."""
    for x, u in zip(drafts, u_accept, strict=True):
        if u * q[x] < p[x]:
            return int(x)
    return categorical(core_kseq.residual_at(p, q, drafts.size, 1.0), u_resid)


# ----------------------------------------------------------------------------- parity
def test_twin_matches_numpy_core_on_keyed_uniforms(monkeypatch):
    """200 whole trees (k <= 4, gamma <= 4, branches sharing prefixes): the twin's keyed verdict
    is the numpy core's on ``call_uniforms``. Negative control: the core with rho pinned to 1
    disagrees on some tree."""
    trees = list(random_trees(np.random.default_rng(60), 200, True))
    check_keyed_tree_parity("kseq", True, trees)
    monkeypatch.setattr(core_kseq, "verify", _verify_rho_one)
    differ = 0
    for seed, (X, P, Q) in enumerate(trees):
        kw = {"seeds": torch.tensor([seed]), "positions": torch.tensor([3 * seed])}
        differ += verdict_rows(verify(X, P, Q, **kw)) != numpy_keyed_rows("kseq", X, P, Q, **kw)
    assert differ > 0


@given(tree_instances())
# kseq's residual is exactly 0 on token 0 here: both backends must read it as 0 (64 ulps), or
# sample_u = 0 picks different tokens
@example((np.array([[0.5, 0.5], [1.0, 0.0]]), np.array([[1.0, 0.0]]), np.array([[0], [0]]),
          np.array([[0.5, 0.5]]), np.array([0.0, 0.0])))
def test_twin_matches_numpy_core_on_degenerate_laws(inst):
    """Hypothesis trees with zeros, ties and one-hots: the twin decides exactly like the core."""
    check_degenerate_parity("kseq", inst)


# ----------------------------------------------------------------------------- the root
def _residual_gap(p: np.ndarray, q: np.ndarray, m: int, rho: float) -> float:
    """How far ``rho`` is from valid (<= 0: its K-SEQ residual ``p - c min(q, p/rho)`` is a
    distribution). Where a token of p-mass has ``p/q < rho`` validity is ``c <= rho``, the
    validity margin; where none has, it is ``c <= min p/q`` (:mod:`coupling.rules.kseq.rho`:
    then rho = 1 is valid, and smallest, although the margin is negative)."""
    ratios = p[(p > 0) & (q > 0)] / q[(p > 0) & (q > 0)]
    if not ratios.size or (ratios < rho).any():
        return -core_rho.validity_margin(p, q, m, rho)
    return float(core_rho.geometric_c(core_rho.beta(p, q, rho), m)) - float(ratios.min())


def test_kseq_rho_matches_numpy_optimal_rho():
    """The batched root equals the numpy root to 1e-12 relative and is valid."""
    rng = np.random.default_rng(16)
    for V, m in [(2, 2), (3, 2), (5, 3), (50, 4), (7, 1), (30, 8), (10, 16), (300, 2)]:
        for a in (0.02, 0.05, 0.3, 1.0, 5.0):
            for _ in range(4):
                p, q = random_pq(rng, V, a)
                pt, qt = torch.tensor(p)[None], torch.tensor(q)[None]
                got = float(kseq_rho(pt, qt, torch.tensor([m]))[0])
                ref = core_rho.optimal_rho(p, q, m)
                assert abs(got - ref) <= 1e-12 * ref, (V, m, a, got, ref)
                assert _residual_gap(p, q, m, got) <= 64 * m * EPS, (V, m, a, got)
    # laws rounded through float32, as a model's softmax gives them: sums off by up to ~1e-7
    for V, m in [(5, 2), (50, 4), (300, 8)]:
        for _ in range(6):
            p, q = (x.astype(np.float32).astype(np.float64) for x in random_pq(rng, V, 0.3))
            got = float(kseq_rho(torch.tensor(p)[None], torch.tensor(q)[None],
                                 torch.tensor([m]))[0])
            ref = core_rho.optimal_rho(p, q, m)
            assert abs(got - ref) <= 1e-12 * ref, (V, m, got, ref)
    # batched rows with different m (one of them needing no root) give the per-row answers
    rows = [random_pq(rng, 20, 0.5) for _ in range(10)]
    ms = torch.tensor([1, 2, 3, 4, 2, 8, 16, 3, 2, 5])
    pt = torch.tensor(np.stack([r[0] for r in rows]))
    qt = torch.tensor(np.stack([r[1] for r in rows]))
    got = kseq_rho(pt, qt, ms)
    for i, (p, q) in enumerate(rows):
        ref = core_rho.optimal_rho(p, q, int(ms[i]))
        assert abs(float(got[i]) - ref) <= 1e-12 * ref


def test_kseq_rho_dense_laws_match_reference(monkeypatch):
    """Full-support laws at V = 49152 (thousands of ratios inside (1, m): the histogram
    passes run), and clustered ones (half the ratios equal: the bins cannot split them),
    batched with different m: the torch root equals the numpy root sorting every ratio, to
    1e-12."""
    rows = []
    for seed in range(3):
        rng = np.random.default_rng(40 + seed)
        z = rng.normal(scale=3.0, size=49152)
        p = np.exp(z - z.max())
        w = (np.exp(rng.normal(size=p.size)) if seed < 2
             else np.where(np.arange(p.size) % 2, 1.5, 1.0))
        rows.append((p / p.sum(), p * w / (p * w).sum()))
    P = torch.tensor(np.stack([r[0] for r in rows] * 2))
    Q = torch.tensor(np.stack([r[1] for r in rows] * 2))
    ms = torch.tensor([2, 4, 8, 8, 2, 4])
    got = kseq_rho(P, Q, ms)
    monkeypatch.setattr(core_rho, "SORT_AT_MOST", P.shape[1])  # the reference sorts all
    for i in range(P.shape[0]):
        p, q = P[i].numpy(), Q[i].numpy()
        want = core_rho.optimal_rho(p, q, int(ms[i]))
        assert abs(float(got[i]) - want) <= 1e-12 * want, (i, float(got[i]), want)
        assert core_rho.validity_margin(p, q, int(ms[i]), float(got[i])) >= 0.0


def test_kseq_rho_flat_margin_exact_root():
    """Where h = rho - c(beta) rounds to 0 over a whole interval (beta near 1, m = 16),
    the root is still found to a few ulps: dyadic laws (exact sums) whose smallest root
    is the last breakpoint p(y)/q(y) (above it every token lies below rho, g = D^16 > 0;
    just below it g = D^16 - q(y)(t - rho) turns negative within 1e-20). A root search on h
    alone returns a valid but up to 7% too large rho here (1.0746 for 1.0062)."""
    cases = [
        ([0.591796875, 0.408203125], [0.5634765625, 0.4365234375], 0),
        ([0.6748046875, 0.3251953125], [0.6728515625, 0.3271484375], 0),
        ([0.9521484375, 0.0478515625], [0.9462890625, 0.0537109375], 0),
        ([0.4794921875, 0.12890625, 0.3916015625], [0.4755859375, 0.1318359375, 0.392578125],
         0),
        ([0.6376953125, 0.3623046875], [0.650390625, 0.349609375], 1),
    ]
    for p, q, y in cases:
        p, q = np.array(p), np.array(q)
        root = p[y] / q[y]
        assert abs(core_rho.optimal_rho(p, q, 16) - root) <= 4 * EPS
        got = kseq_rho(torch.tensor(p)[None], torch.tensor(q)[None], torch.tensor([16]))
        assert abs(float(got[0]) - root) <= 4 * EPS


# ------------------------------------------------------------------ exact laws, streams
def test_single_step_joint_law():
    """Frequencies of (draft tuple, output) over 200k keyed draws vs the numpy exact joint."""
    check_single_step_joint_law("kseq", True, 3, 3, B=200_000)


def test_tree_stream_lossless(models):
    """100k requests, V=4, k=3 branches, gamma=2: first 3 tokens ~ target's exact law."""
    target, draft = models
    toks = simulate_tree_stream(verify, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2,
                                verifier_kw={"replacement": True})
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


# ----------------------------------------------------------------------------- validation
def test_validation():
    P = torch.full((2, 2, 2, 5), 0.2)
    Q = torch.full((2, 2, 1, 5), 0.2)
    X = torch.tensor([[[1], [1]], [[0], [2]]])
    with pytest.raises(ValueError, match="i.i.d. drafts only"):
        verify(X, P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="NaN or inf"):
        coupling.verify("kseq", X, P.index_fill(-1, torch.tensor([0]), float("nan")), Q,
                        seeds=0, positions=0)
