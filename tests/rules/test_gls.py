"""``gls``: Gumbel-max list sampling, its exact laws (m observed columns of k), its bounds, its
sampler, and its drafter invariance with the numpy core."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling import (
    RULES,
    accepted_length_law,
    check_rule,
    check_sampler,
    keyed,
    optimal_acceptance,
    tuple_law,
)
from coupling.check import trace_mass
from coupling.rules import gls
from coupling.rules.gls import Gls, laws, list_matching, list_noise, own_column
from coupling.rules.gumbel import conditional_noise, pair_from_noise
from tests.strategies import model_pair, rule_pairs

GLS = RULES["gls"]
P5 = np.array([0.45, 0.3, 0.15, 0.07, 0.03])
Q5 = np.array([0.1, 0.2, 0.3, 0.25, 0.15])


# ------------------------------------------------------------------ exact laws
@settings(max_examples=30, deadline=None)
@given(pq=rule_pairs(max_v=5), k=st.integers(1, 3))
def test_exact_and_between_its_bounds(pq, k):
    """Lossless, rows = the i.i.d. law, collision == trace, list matching <= own column <=
    collision <= the i.i.d. optimum."""
    p, q = pq
    r = check_rule(GLS, p, q, k)
    assert r.ok and r.lossless, r
    assert list_matching(p, q, k) <= own_column(p, q, k) + 1e-12
    assert own_column(p, q, k) <= r.acceptance + 1e-12 <= optimal_acceptance(p, q, k) + 2e-12


@settings(max_examples=30, deadline=None)
@given(pq=rule_pairs(max_v=4), K=st.integers(2, 3), data=st.data())
def test_law_of_m_observed_columns_of_k(pq, K, data):
    """The walk's step law: m of K columns drafted. Columns sum to p, rows to the i.i.d. law
    of m drafts, and the trace is the closed-form collision (exact and by quadrature)."""
    p, q = pq
    m = data.draw(st.integers(1, K))
    tuples, probs = tuple_law(q, m)
    J = laws.joint(p, q, tuples, K)
    assert np.abs(J.sum(axis=0) - p).max() < 1e-12
    assert np.abs(J.sum(axis=1) - probs).max() < 1e-12
    c = laws.collision(p, q, m, K, method="exact")
    assert trace_mass(J, tuples) == pytest.approx(c.sum(), abs=1e-12)
    assume(m >= 2)
    assert laws.collision(p, q, m, K, method="quad").sum() == pytest.approx(c.sum(), abs=1e-12)


def test_one_column_is_the_gumbel_coupling():
    rng = np.random.default_rng(2)
    for _ in range(20):
        p, q = rng.dirichlet(np.full(5, 0.5)), rng.dirichlet(np.full(5, 0.5))
        assert GLS.acceptance(p, q) == pytest.approx(RULES["gumbel"].acceptance(p, q), abs=1e-15)
        assert np.abs(GLS.joint(p, q) - RULES["gumbel"].joint(p, q)).max() < 1e-14
        u = np.clip(rng.random(6), 1e-12, None)
        assert GLS.verify(p, q, [2], u) == RULES["gumbel"].verify(p, q, [2], u)


def test_one_position_from_explicit_noise():
    """The deterministic core on explicit noise: K = 1 is the Gumbel pair, and the output is
    the target's token over the columns' maximum whatever q."""
    rng = np.random.default_rng(9)
    for _ in range(50):
        G = rng.gumbel(size=(3, 5))
        d, y = gls.list_from_noise(P5, Q5, G)
        assert y == gls.target_token(P5, G) == gls.list_from_noise(P5, P5[::-1], G)[1]
        assert d.tolist() == [int(np.argmax(np.log(Q5) + g)) for g in G]
        one, y1 = gls.list_from_noise(P5, Q5, G[:1])
        assert (int(one[0]), y1) == pair_from_noise(P5, Q5, G[0])


def test_collision_probability_against_literal_shared_noise():
    """20000 draws of K = 3 literal Gumbel columns on V = 1000: the sampled collision rate lies
    within 4 standard errors of the closed form (quadrature at this size)."""
    rng = np.random.default_rng(4)
    V, K, n = 1000, 3, 20_000
    z = rng.normal(size=V) * 2
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    q = np.exp(np.log(p) + rng.normal(size=V))
    q /= q.sum()
    hits = 0
    for _ in range(n // 2000):
        G = rng.gumbel(size=(2000, K, V))
        d = np.argmax(np.log(q) + G, axis=2)
        y = np.argmax(np.log(p) + G.max(axis=1), axis=1)
        hits += int((d == y[:, None]).any(axis=1).sum())
    a = GLS.acceptance(p, q, K)
    assert abs(hits / n - a) < 4 * np.sqrt(a * (1 - a) / n)


def test_full_vocabulary():
    """V = 49152 by quadrature: the bounds' order (gls is within 1e-5 of its own-column bound:
    a non-winning column rarely drafts Y), and a gap to the optimum wider with drafts than the
    Gumbel coupling's with one."""
    rng = np.random.default_rng(12)
    z = rng.normal(size=49152)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    q = np.exp(np.log(p) + 0.5 * rng.normal(size=p.size))
    q /= q.sum()
    gaps = []
    for k in (1, 2, 4):
        a = GLS.acceptance(p, q, k)
        assert list_matching(p, q, k) <= own_column(p, q, k) + 1e-12 <= a + 2e-12
        assert a - own_column(p, q, k) < 1e-5
        gaps.append(optimal_acceptance(p, q, k) - a)
    assert 0 < gaps[0] < min(gaps[1:])


def test_equal_models_reject_only_where_a_branch_left():
    """q = p: the first offset accepts surely (Y is the winning column's draft); with one
    survivor of k = 2 the unseen column can win, so a later offset may reject (drafter
    invariance keeps all k columns in the target's token)."""
    p = np.array([0.5, 0.3, 0.2])
    assert laws.acceptance(p, p, 2, 2) == pytest.approx(1.0, abs=1e-15)
    one_of_two = laws.acceptance(p, p, 1, 2)
    assert 0.5 < one_of_two < 1
    t, _ = model_pair(3, 1, 0)
    law = accepted_length_law("gls", t, t, 1, k=2)
    assert law[1] == pytest.approx(1.0, abs=1e-12)
    assert accepted_length_law("gls", t, t, 2, k=2)[2] < 1 - 1e-3


def test_predict_uses_the_surviving_columns_of_k():
    drafts = np.array([[0, 1], [0, 2], [1, 0]])
    p = np.tile(P5[:3] / P5[:3].sum(), (3, 3, 1))
    q = np.tile(Q5[:3] / Q5[:3].sum(), (3, 2, 1))
    beta = GLS.predict(drafts, p, q, 0)
    assert beta[0] == pytest.approx(laws.acceptance(p[0, 0], q[0, 0], 3, 3), abs=1e-12)
    assert beta[1] == pytest.approx(laws.acceptance(p[0, 0], q[0, 0], 2, 3), abs=1e-12)


# ------------------------------------------------------------------ sampler
@pytest.mark.parametrize("k", [2, 3])
def test_sampler_matches_joint(k):
    assert check_sampler(GLS, P5, Q5, k, n=20_000, seed=k).ok


class _FirstColumn(Gls):
    """Negative control: the target reads column 0 only (its token is still ~p, but this is
    another coupling)."""

    name = "gls_first_column"

    def _verify(self, p, q, drafts, u, replacement):
        G = conditional_noise(q, int(drafts[0]), u[: p.size + 1])
        return int(np.argmax(np.log(p) + G))


class _MeanColumn(Gls):
    """Negative control: the target reads the columns' mean (its token is no draw of p)."""

    name = "gls_mean_column"
    lossless = False

    def _verify(self, p, q, drafts, u, replacement):
        V = p.size
        G = np.stack([conditional_noise(q, int(x), u[c * (V + 1):(c + 1) * (V + 1)])
                      for c, x in enumerate(drafts)])
        return int(np.argmax(np.log(p) + G.mean(axis=0)))


@pytest.mark.parametrize("broken", [_FirstColumn(), _MeanColumn()], ids=lambda r: r.name)
def test_negative_controls_fail_against_the_exact_joint(broken):
    with np.errstate(divide="ignore"):
        assert not check_sampler(broken, P5, Q5, 2, n=20_000, seed=7, reference=GLS).ok


# ------------------------------------------------------------------ drafter invariance
def _decode(target, draft, k: int, seed: int, length: int, *, broken: str = ""):
    """Engine mode with the numpy core: branch c drafts with column c of the keyed
    ``list_noise``; the call is verified with the target's keyed noise G*. ``broken``: a
    negative control's verifier, reading column 0 (``"column0"``) or the maximum over the
    surviving branches' columns only (``"survivors"``) instead of G*."""
    V, gamma, out = target(()).size, 3, []
    while len(out) < length:
        t0, ctx = len(out), tuple(out)
        noise = np.stack([list_noise(seed, t0 + i, V, k) for i in range(gamma + 1)])
        X = gls.draft_block(draft, ctx, gamma, noise[:gamma])
        P = np.stack([np.stack([target(ctx + tuple(x[:i])) for i in range(gamma + 1)])
                      for x in X])
        if broken == "survivors":
            out += _walk_survivor_columns(X, P, noise)
            continue
        G = keyed.gumbel_noise(seed, t0 + np.arange(gamma + 1), np.arange(V))
        if broken == "column0":
            G = noise[:, 0]
        n, j, y = GLS.verify_block(X, P, None, G)
        out += X[j, :n].tolist() + [y]
    return out[:length]


def _alone(target, seed: int, length: int) -> list[int]:
    """The target sampled alone: argmax log p_t + G*(seed, t), token by token."""
    out: list[int] = []
    for t in range(length):
        G = keyed.gumbel_noise(seed, [t], np.arange(target(()).size))[0]
        out.append(int(np.argmax(np.log(target(tuple(out))) + G)))
    return out


def _walk_survivor_columns(X, P, noise) -> list[int]:
    """The broken walk: the token at each offset maximises over the survivors' columns."""
    alive, out = np.ones(X.shape[0], dtype=bool), []
    for i in range(X.shape[1] + 1):
        ref = int(np.flatnonzero(alive)[0])
        y = int(np.argmax(np.log(P[ref, i]) + noise[i, alive].max(axis=0)))
        out.append(y)
        if i == X.shape[1] or not (alive & (X[:, i] == y)).any():
            return out
        alive &= X[:, i] == y
    return out


def test_seeded_stream_is_the_target_alone_for_every_drafter_and_every_k():
    """Three drafters (two models and the target itself) and k = 1, 2, 4: one stream per seed,
    the target's own keyed Gumbel-max stream (the gumbel rule's). Two broken verifiers must
    fail: one reading column 0 (invariant, but not the target's stream), one reading only the
    surviving branches' columns (its stream depends on the drafter)."""
    target, _ = model_pair(6, 1, 0, 0.5)
    drafters = [model_pair(6, 1, s, 0.5)[1] for s in (1, 2)] + [target]
    for seed in (3, 11):
        for d in drafters:
            for k in (1, 2, 4):
                assert _decode(target, d, k, seed, 30) == _alone(target, seed, 30), (seed, k)
    assert _decode(target, drafters[0], 4, 3, 30, broken="column0") != _alone(target, 3, 30)
    streams = {tuple(_decode(target, d, 4, 3, 30, broken="survivors")) for d in drafters}
    assert len(streams) > 1


def test_keyed_columns_are_the_gumbel_rules_noise_at_k_one_and_its_maximum_above():
    V = 50
    G1 = list_noise(7, 12, V, 1)
    assert np.array_equal(G1[0], keyed.gumbel_noise(7, [12], np.arange(V))[0])
    G = list_noise(7, 12, V, 4)
    assert np.allclose(G.max(axis=0) - np.log(4), G1[0], rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match="k"):
        list_noise(7, 12, V, 0)


def test_verify_block_validates_the_noise():
    X, P = np.zeros((2, 1), dtype=np.int64), np.full((2, 2, 3), 1 / 3)
    with pytest.raises(ValueError, match="noise"):
        GLS.verify_block(X, P, None, np.zeros((3, 3)))
