"""``gumbel``'s batched torch twin (:mod:`coupling.rules.gumbel.torch`) against its numpy core and
its exact laws.

* noise precomputed by the drafter gives the verdict of the noise the twin hashes itself;
* drafter invariance: different drafters (models, i.i.d. or shared-noise drafting, k = 1 or 3)
  give identical streams under one seed, equal to plain keyed Gumbel-max sampling of the
  target; the output never reads q;
* the exact collision law with a shared-noise drafter (chi-square against
  ``RULES["gumbel"].joint``) and its acceptance;
* whole-stream losslessness over trees of k = 3 i.i.d. branches; a verifier reusing one noise
  vector for every offset must fail.

Parity with the numpy core (fed ``keyed.gumbel_noise``), batch invariance and CUDA:
``tests/rules/test_twins.py``.

Chi-square tests at ``ALPHA = 1e-4`` with fixed seeds (:mod:`tests.torch_helpers`).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling
from coupling.rules import RULES
from coupling.rules.gumbel.torch import draft, target_tokens, verify
from coupling.torch_backend import gumbel_noise, walk_tree

from ..torch_helpers import (
    ALPHA,
    BatchedTabular,
    chi2_pvalue,
    iid_drafter,
    random_pq,
    simulate_tree_stream,
    string_counts,
)

CORE = RULES["gumbel"]


@pytest.fixture(scope="module")
def models():
    return (coupling.TabularLM(4, order=1, seed=21, concentration=0.7),
            coupling.TabularLM(4, order=1, seed=22, concentration=0.7))


def gumbel_drafter(q_rows, seeds, pos):
    return draft(q_rows, seeds, pos)


# ----------------------------------------------------------------------------- parity
def test_precomputed_noise_gives_the_same_verdict():
    rng = np.random.default_rng(18)
    B, k, g, V = 16, 2, 3, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g)))
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 100, B))
    t = pos.view(B, 1, 1) + torch.arange(g).view(1, 1, g)
    X = draft(Q, seeds.view(B, 1, 1), t)
    noise = gumbel_noise(seeds[:, None], pos[:, None] + torch.arange(g + 1), V, dtype=torch.float64)
    a = verify(X, P, Q, seeds=seeds, positions=pos)
    b = verify(X, P, Q, seeds=seeds, positions=pos, noise=noise)
    assert torch.equal(a.tokens, b.tokens)
    assert a.accepted.sum() > 0  # shared-noise drafts are accepted sometimes
    # the drafter's positions only: the bonus position is hashed in the call, where reached
    # (a drafter with the target's laws drafts the target's tokens: every row reaches it)
    Q2 = P[:, :, :g].clone()
    X2 = draft(Q2, seeds.view(B, 1, 1), t)
    for x, q in ((X, Q), (X2, Q2)):
        want = verify(x, P, q, seeds=seeds, positions=pos)
        c = verify(x, P, q, seeds=seeds, positions=pos, noise=noise[:, :-1])
        assert torch.equal(want.tokens, c.tokens)
        for row in range(B):  # one row: the single-row path reads views of the noise
            one = slice(row, row + 1)
            d = verify(x[one], P[one], q[one], seeds=seeds[one], positions=pos[one],
                       noise=noise[one, :-1])
            assert torch.equal(d.tokens, want.tokens[one])
    assert bool((want.accepted == g).all())
    # noise of the wrong positions changes the stream (the check can fail)
    e = verify(X, P, Q, seeds=seeds, positions=pos, noise=noise.roll(1, dims=1))
    assert not torch.equal(a.tokens, e.tokens)
    with pytest.raises(ValueError, match="noise must be"):
        verify(X, P, Q, seeds=seeds, positions=pos, noise=noise[:, :-2])


@pytest.mark.parametrize("ahead", [1, 2000, 10**9])
def test_chains_look_ahead_to_the_walks_verdict(monkeypatch, ahead):
    """One branch per request: the target's tokens of several positions per call (``AHEAD``
    entries: one position, some, every position at once) give the tree walk's verdict,
    which precomputed noise forces, on rows that stop early, late and at the bonus."""
    rng = np.random.default_rng(5)
    B, g, V = 12, 5, 70
    P = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B, 1, g + 1)))
    Q = P[:, :, :g].clone()
    Q[: B // 2] = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B // 2, 1, g)))
    seeds, pos = torch.arange(B) + 40, torch.tensor(rng.integers(0, 100, B))
    X = draft(Q, seeds.view(B, 1, 1), pos.view(B, 1, 1) + torch.arange(g))
    noise = gumbel_noise(seeds[:, None], pos[:, None] + torch.arange(g + 1), V, dtype=torch.float64)
    monkeypatch.setattr(coupling.rules.gumbel.torch, "AHEAD", ahead)
    got = verify(X, P, Q, seeds=seeds, positions=pos)
    walk = verify(X, P, Q, seeds=seeds, positions=pos, noise=noise)
    assert all(torch.equal(a, b) for a, b in zip(got, walk, strict=True))
    assert {0, g} <= set(got.accepted.tolist())


# ----------------------------------------------------------------------------- invariance
def test_drafter_invariance(models):
    """Three different drafters (two draft models, i.i.d. or shared-noise drafting, k=1 or 3)
    give identical streams under one seed, equal to plain keyed Gumbel sampling of the target."""
    target, draft_lm = models
    other = coupling.TabularLM(4, order=1, seed=99, concentration=0.3)
    B, L = 4000, 6
    runs = [
        simulate_tree_stream(verify, target, draft_lm, 3, 1, L, B, seed=5, drafter=gumbel_drafter),
        simulate_tree_stream(verify, target, other, 3, 1, L, B, seed=5, drafter=gumbel_drafter),
        simulate_tree_stream(verify, target, draft_lm, 2, 3, L, B, seed=5, drafter=iid_drafter(8)),
        simulate_tree_stream(verify, target, target, 4, 2, L, B, seed=5, drafter=iid_drafter(9)),
    ]
    for r in runs[1:]:
        assert torch.equal(r, runs[0])
    # plain autoregressive Gumbel-max sampling with the same keyed noise
    T = BatchedTabular(target)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * 5
    tail, out = T.start(B), []
    for t in range(L):
        G = gumbel_noise(seeds, torch.full((B,), t), 4, dtype=torch.float64)
        y = torch.argmax(T.laws(tail).log() + G, -1)
        out.append(y)
        tail = T.push(tail, y)
    assert torch.equal(torch.stack(out, 1), runs[0])


def test_output_ignores_q():
    rng = np.random.default_rng(13)
    B, k, g, V = 50, 2, 3, 20
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g + 1)))
    X = torch.tensor(rng.integers(0, V, (B, k, g)))
    outs = []
    for a in (0.1, 1.0, 10.0):
        Q = torch.tensor(rng.dirichlet(np.full(V, a), size=(B, k, g))) + 1e-3
        Q = Q / Q.sum(-1, keepdim=True)
        outs.append(verify(X, P, Q, seeds=torch.arange(B), positions=3).tokens)
    outs.append(verify(X, P, None, seeds=torch.arange(B), positions=3).tokens)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


# ----------------------------------------------------------------------------- exact laws
def test_shared_noise_collision_law():
    """Drafter argmax(log q + G), verifier argmax(log p + G): the (draft, output) law is the
    exact Gumbel coupling joint of coupling.rules.gumbel (chi-square), and the acceptance
    is its closed form."""
    rng = np.random.default_rng(14)
    V, B = 4, 200_000
    p, q = random_pq(rng, V, 0.8)
    seeds, pos = torch.arange(B), torch.full((B,), 17)
    x = draft(torch.tensor(q).expand(B, V), seeds, pos)
    ver = verify(x[:, None, None], torch.tensor(p).expand(B, 1, 2, V),
                 torch.tensor(q).expand(B, 1, 1, V), seeds=seeds, positions=pos)
    counts = np.bincount((x * V + ver.tokens[:, 0]).numpy(), minlength=V * V)
    assert chi2_pvalue(counts, CORE.joint(p, q).ravel()) > ALPHA
    want = CORE.acceptance(p, q)
    acc = ver.accepted.double().mean().item()
    assert abs(acc - want) < 5 * (want * (1 - want) / B) ** 0.5


def test_tree_stream_lossless(models):
    """100k requests, V=4, k=3 branches, gamma=2: first 3 tokens ~ target's exact law."""
    target, draft_lm = models
    toks = simulate_tree_stream(verify, target, draft_lm, gamma=2, k=3, length=3, B=100_000,
                                seed=2)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) > ALPHA


def test_negative_control_reused_noise(models):
    """Gumbel verification that reuses one noise vector for every offset must fail."""
    target, draft_lm = models

    def broken(x, P, Q, *, seeds, positions, **kw):
        B, k, g = x.shape

        def step(p_i, q_i, xx, alive, coins, u, i, act):
            return target_tokens(p_i, seeds[act], positions[act])  # BUG: no + i

        z = torch.zeros(B, g + 1, dtype=torch.float64)
        return walk_tree(step, x, P, Q, z[:, :g, None].expand(B, g, k), z,
                         bonus=lambda pg, u, act: target_tokens(pg, seeds[act], positions[act]))

    toks = simulate_tree_stream(broken, target, draft_lm, gamma=2, k=1, length=3, B=100_000,
                                seed=2, drafter=gumbel_drafter)
    assert chi2_pvalue(string_counts(toks, 4), coupling.target_law(target, 3)) < ALPHA


# ----------------------------------------------------------------------------- validation
def test_draft_validation():
    with pytest.raises(ValueError, match="q must be a floating tensor"):
        draft(torch.zeros(3, dtype=torch.long), 0, 0)
    # a NaN or negative entry would simply never win the argmax: refused like elsewhere
    for bad, msg in ((float("nan"), "NaN or inf"), (-0.25, "negative"), (0.75, "sum to 1")):
        with pytest.raises(ValueError, match=msg):
            draft(torch.tensor([0.25, 0.5, bad]), 0, 0)
