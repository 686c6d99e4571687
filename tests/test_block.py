"""Block verification and sequence-level analysis (coupling.block).

Exactness first (fractions and exact enumeration), then properties (hypothesis), then
statistics (chi-square with a stated false-positive rate and a negative control).
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling.block import (
    NEGATIVE_CONTROLS,
    RULES,
    TabularLM,
    TraceLM,
    accepted_length,
    accepted_length_law,
    block_efficiency,
    block_weights,
    constant_acceptance_efficiency,
    expected_accepted,
    full_information_accepted,
    gumbel_match,
    motivating_example,
    optimal_block_efficiency,
    optimal_expected_accepted,
    path_law,
    path_laws,
    sample_block,
    sample_stream,
    stream_law,
    target_law,
    verifier_lp,
    verify_block,
    verify_block_gumbel,
)
from coupling.dist import tv

F = Fraction


def pair(V, order, seed, conc=1.0):
    return (
        TabularLM(V, order, seed=seed, concentration=conc),
        TabularLM(V, order, seed=seed + 1000, concentration=conc),
    )


def rational_lm(V, order, seed, denom=7):
    """A random context-dependent model with exact Fraction laws (no zeros)."""
    rng = np.random.default_rng(seed)
    table = {}
    for key in itertools.product(range(V + 1), repeat=order):
        w = rng.integers(1, denom, size=V)
        table[key] = np.array([F(int(v), int(w.sum())) for v in w], dtype=object)

    def lm(ctx=()):
        tail = tuple(ctx[-order:]) if order else ()
        return table[(V,) * (order - len(tail)) + tail]

    return lm


# ------------------------------------------------------------------ the paper's example


def test_motivating_example_exact_fractions():
    t, d, g = motivating_example()
    assert expected_accepted("token", t, d, g) == F(10, 9)
    assert expected_accepted("block", t, d, g) == F(11, 9)
    assert block_efficiency("block", t, d, g) == F(20, 9)


@pytest.mark.parametrize("solver", ["pot", "highs", "cvxpy"])
def test_motivating_example_transport_bound_is_12_9(solver):
    t, d, g = motivating_example(exact=False)
    assert optimal_expected_accepted(t, d, g, solver=solver) == pytest.approx(12 / 9, abs=1e-7)
    assert optimal_block_efficiency(t, d, g, solver=solver) == pytest.approx(21 / 9, abs=1e-7)


def test_motivating_example_full_information_is_11_9_exactly():
    # the best lossless verifier, even knowing both models, accepts 11/9: an exact dual bound
    t, d, g = motivating_example()
    lp = verifier_lp(t, d, g)
    value, _, y = lp.solve()
    assert value == pytest.approx(11 / 9, abs=1e-9)
    assert lp.dual_bound(y, limit_denominator=1000) == F(11, 9)


# ------------------------------------------------------------------ models


def test_tabular_lm_is_seeded_and_order_limited():
    a, b = TabularLM(4, 2, seed=3), TabularLM(4, 2, seed=3)
    assert np.array_equal(a.table, b.table)
    assert not np.array_equal(a.table, TabularLM(4, 2, seed=4).table)
    # the law depends on the last two tokens only, and short contexts have their own rows
    assert np.array_equal(a((0, 1, 2, 3)), a((3, 2, 3)))
    assert not np.array_equal(a((2, 3)), a((3,)))
    assert not np.array_equal(a(()), a((0,)))
    for row in a.table.reshape(-1, 4):
        assert row.min() >= 0 and abs(row.sum() - 1) < 1e-12
    c = TabularLM(3, 0, seed=1)
    assert np.array_equal(c(()), c((0, 1, 2)))


def test_tabular_lm_concentration_controls_spread():
    sharp = TabularLM(20, 1, seed=0, concentration=0.05).table.max(axis=-1).mean()
    flat = TabularLM(20, 1, seed=0, concentration=50.0).table.max(axis=-1).mean()
    assert sharp > 0.5 > 0.2 > flat


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(vocab_size=0), "vocab_size"),
        (dict(vocab_size=3, order=-1), "order"),
        (dict(vocab_size=3, concentration=0.0), "concentration"),
        (dict(vocab_size=3, concentration=float("nan")), "concentration"),
        (dict(vocab_size=1000, order=3), "lower order"),
    ],
)
def test_tabular_lm_validates(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        TabularLM(**kwargs)


def test_tabular_lm_rejects_bad_context_and_tables():
    lm = TabularLM(3, 1, seed=0)
    with pytest.raises(ValueError, match="outside"):
        lm((0, 3))
    with pytest.raises(ValueError, match="shape"):
        TabularLM.from_table(np.ones((3, 3)) / 3)
    with pytest.raises(ValueError, match="sums to"):
        TabularLM.from_table(np.ones((4, 3)))
    const = TabularLM.constant([0.25, 0.75])
    assert np.array_equal(const((1, 0, 1)), [0.25, 0.75])


def test_trace_lm_replays_a_path():
    t = TabularLM(4, 2, seed=5)
    path = (2, 0, 3)
    dists = np.stack([t((1,) + path[:i]) for i in range(4)])
    tr = TraceLM((1,), path, dists)
    assert np.array_equal(tr((1, 2, 0)), t((1, 2, 0)))
    with pytest.raises(KeyError):
        tr((1, 3))
    with pytest.raises(ValueError, match="dists must have shape"):
        TraceLM((), path, dists[:2])


# ------------------------------------------------------------------ per-path laws


def _path(V=4, gamma=3, seed=0, conc=0.7):
    t, d = pair(V, 2, seed, conc)
    rng = np.random.default_rng(seed)
    ctx = (1,)
    xs = []
    for _ in range(gamma):
        xs.append(int(rng.choice(V, p=d(ctx + tuple(xs)))))
    P = np.stack([t(ctx + tuple(xs[:i])) for i in range(gamma + 1)])
    Q = np.stack([d(ctx + tuple(xs[:i])) for i in range(gamma)])
    return np.array(xs), P, Q


@pytest.mark.parametrize(
    "rule", [r for r in RULES + NEGATIVE_CONTROLS if not r.startswith("gumbel")]
)
def test_path_law_is_a_law(rule):
    x, P, Q = _path()
    tau, nxt = path_law(rule, x, P, Q)
    assert tau.min() >= 0 and abs(tau.sum() - 1) < 1e-12
    assert np.all(nxt >= 0) and np.allclose(nxt.sum(axis=1), 1)


def test_block_weights_closed_form():
    # w_i = min_{0<=j<=i} prod_{k=j+1}^{i} p_k(x_k)/q_k(x_k)
    for seed in range(5):
        x, P, Q = _path(seed=seed)
        w, h = block_weights(x, P, Q)
        r = P[np.arange(3), x] / Q[np.arange(3), x]
        for i in range(4):
            expect = min(np.prod(r[j:i]) for j in range(i + 1))
            assert w[i] == pytest.approx(min(expect, 1.0), rel=1e-12)
        assert np.all((h >= 0) & (h <= 1)) and h[3] == w[3]


def test_gamma_one_block_equals_token():
    x, P, Q = _path(gamma=1)
    for a, b in zip(path_law("token", x, P, Q), path_law("block", x, P, Q), strict=True):
        assert np.allclose(a, b, atol=1e-15)


def test_prefix_acceptance_identity_exact():
    # P(tau >= i | X^i = x^i) = w_i(x^i), in exact rationals
    t, d = rational_lm(3, 2, seed=1), rational_lm(3, 2, seed=2)
    gamma = 3
    acc = {}
    for x, qx, P, Q in path_laws(t, d, gamma, context=(0,)):
        tau, _ = path_law("block", x, P, Q)
        w, _ = block_weights(x, P, Q)
        for i in range(gamma + 1):
            pre = tuple(x[:i].tolist())
            num, den, wi = acc.get(pre, (F(0), F(0), w[i]))
            assert wi == w[i]
            acc[pre] = (num + qx * sum(tau[i:]), den + qx, wi)
    for pre, (num, den, wi) in acc.items():
        assert num / den == wi, pre


def test_degenerate_equal_models_accept_everything():
    t = TabularLM(3, 1, seed=0)
    for rule in RULES:
        law = accepted_length_law(rule, t, t, 3)
        assert law[3] == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------------------ sampler vs exact law


def test_uniforms_drive_decisions_and_match_accepted_length():
    x, P, Q = _path(seed=2)
    rng = np.random.default_rng(0)
    for _ in range(200):
        u = rng.random(4)
        for rule in RULES:
            out = verify_block(rule, x, P, Q, None, uniforms=u)
            tau = accepted_length(rule, x, P, Q, u[:3])
            assert np.array_equal(out[:-1], x[:tau]) and out.size == tau + 1
            assert np.array_equal(out, verify_block(rule, x, P, Q, None, uniforms=u))


def test_block_scans_past_first_failure():
    # a position whose coin fails does not stop block verification: tau is the last success
    x, P, Q = _path(seed=3)
    _, h = block_weights(x, P, Q)
    u = np.array([0.999999, 0.999999, 0.0])  # only the last coin can succeed (h_3 = w_3 > 0)
    assert h[3] > 0 and P[0, x[0]] < 0.999999 * Q[0, x[0]]  # position 1's token coin fails
    assert accepted_length("block", x, P, Q, u) == 3
    assert accepted_length("token", x, P, Q, u) == 0


@pytest.mark.parametrize("rule", RULES)
def test_verify_block_emission_law_chisquare(rule):
    # false-positive rate 1e-3 per test; fixed seed, so the outcome is deterministic
    x, P, Q = _path(seed=4, conc=0.5)
    tau, nxt = path_law(rule, x, P, Q)
    V, g = P.shape[1], x.size
    expected = {
        tuple(x[:t].tolist()) + (y,): tau[t] * nxt[t, y]
        for t in range(g + 1)
        for y in range(V)
        if tau[t] * nxt[t, y] > 0
    }
    keys = list(expected)
    rng = np.random.default_rng(123)
    n = 20_000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(verify_block(rule, x, P, Q, rng).tolist())] += 1
    f_obs = np.array([counts[k] for k in keys], dtype=float)
    f_exp = np.array([expected[k] for k in keys]) * n
    assert stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue > 1e-3


# ------------------------------------------------------------------ whole-sequence losslessness


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed, conc", [(0, 1.0), (4, 0.3), (7, 3.0)])
def test_stream_law_is_target_law(gamma, seed, conc):
    t, d = pair(3, 2, seed, conc)
    target = target_law(t, 4, context=(2,))
    for rule in RULES:
        assert tv(stream_law(rule, t, d, gamma, 4, context=(2,)), target) < 1e-12


@pytest.mark.parametrize("gamma", [2, 3])
def test_negative_controls_are_lossy(gamma):
    t, d = pair(3, 2, 4, 0.3)
    target = target_law(t, 4)
    for rule in NEGATIVE_CONTROLS:
        assert tv(stream_law(rule, t, d, gamma, 4), target) > 1e-2, rule


def test_stream_law_exact_rationals():
    # V = 3: with V = 2 both residuals are the same point mass, so the control cannot fail
    t, d = rational_lm(3, 2, seed=5), rational_lm(3, 2, seed=6)
    for rule in RULES:
        law = stream_law(rule, t, d, 3, 4, context=(1,))
        assert np.array_equal(law, target_law(t, 4, context=(1,)))
    assert not np.array_equal(
        stream_law("block-plain-residual", t, d, 3, 4, context=(1,)), target_law(t, 4, context=(1,))
    )


def _stream_chisquare(rule, n, seed):
    t, d = pair(3, 2, 4, 0.3)
    expected = target_law(t, 4)
    rng = np.random.default_rng(seed)
    counts = np.zeros(81)
    for _ in range(n):
        s = sample_stream(rule, t, d, 3, 4, rng)
        counts[int(np.ravel_multi_index(tuple(s), (3,) * 4))] += 1
    f_exp = expected * n
    # pool the cells with expected count < 5 so the chi-square approximation holds
    small = f_exp < 5
    f_obs = np.append(counts[~small], counts[small].sum())
    f_exp = np.append(f_exp[~small], f_exp[small].sum())
    if f_exp[-1] == 0:
        f_obs, f_exp = f_obs[:-1], f_exp[:-1]
    return stats.chisquare(f_obs, f_exp).pvalue


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES + ("gumbel",))
def test_stream_chisquare_lossless(rule):
    # 4-token prefixes, V = 3, gamma = 3: false-positive rate 1e-3 per rule (fixed seed)
    assert _stream_chisquare(rule, 12_000, seed=11) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["block-plain-residual", "gumbel-emit-draft"])
def test_stream_chisquare_negative_control_fails(rule):
    # block verification with the plain residual (exact TV 0.049 here), or the Gumbel rule
    # emitting its draft at a disagreement, must be rejected
    assert _stream_chisquare(rule, 12_000, seed=11) < 1e-6


# ------------------------------------------------------------------ efficiency


@given(
    st.integers(2, 4),
    st.integers(1, 3),
    st.integers(0, 2),
    st.integers(0, 10_000),
    st.sampled_from([0.3, 1.0, 3.0]),
)
@settings(max_examples=25)
def test_block_never_below_token(V, gamma, order, seed, conc):
    t, d = pair(V, order, seed, conc)
    tok = expected_accepted("token", t, d, gamma)
    blk = expected_accepted("block", t, d, gamma)
    assert blk >= tok - 1e-12
    if gamma == 1:
        assert blk == pytest.approx(tok, abs=1e-12)


@given(st.integers(2, 5), st.integers(1, 4), st.integers(0, 10_000))
@settings(max_examples=25)
def test_token_constant_acceptance_closed_form(V, gamma, seed):
    # context-independent models: every position accepts w.p. alpha = 1 - TV(p, q)
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    t, d = TabularLM.constant(p), TabularLM.constant(q)
    alpha = 1 - tv(p, q)
    got = block_efficiency("token", t, d, gamma)
    closed = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert got == pytest.approx(closed, rel=1e-12)
    assert constant_acceptance_efficiency(alpha, gamma) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("V, gamma, seed", [(2, 2, 0), (2, 3, 1), (3, 2, 2), (3, 3, 3), (2, 4, 4)])
def test_efficiency_ordering_and_full_information_optimum(V, gamma, seed):
    t, d = pair(V, 2, seed, 0.5)
    tok = expected_accepted("token", t, d, gamma)
    blk = expected_accepted("block", t, d, gamma)
    lp = verifier_lp(t, d, gamma)
    full, _, y = lp.solve()
    bound = float(lp.dual_bound(y))
    lcp = optimal_expected_accepted(t, d, gamma)
    assert tok <= blk + 1e-12
    assert full == pytest.approx(blk, abs=1e-8)  # block is the full-information optimum
    assert blk <= bound + 1e-12 and bound - blk < 1e-8  # rigorous upper bound, tight
    assert full <= lcp + 1e-9  # transport relaxation bounds everything
    assert full_information_accepted(t, d, gamma) == pytest.approx(full)


def test_transport_bound_strictly_above_achievable_somewhere():
    t, d = pair(3, 2, 0, 0.5)
    assert optimal_expected_accepted(t, d, 2) > expected_accepted("block", t, d, 2) + 1e-3


def test_accepted_length_law_matches_exact_and_float():
    te, de = rational_lm(3, 1, seed=8), rational_lm(3, 1, seed=9)

    def tf(ctx=()):
        return te(ctx).astype(float)

    def df(ctx=()):
        return de(ctx).astype(float)

    for rule in RULES:
        exact = accepted_length_law(rule, te, de, 3)
        assert sum(exact) == 1
        assert np.allclose(exact.astype(float), accepted_length_law(rule, tf, df, 3), atol=1e-14)


# ------------------------------------------------------------------ sampling API and validation


def test_sample_block_shapes_and_determinism():
    t, d = pair(5, 1, 0)
    for rule in RULES:
        a = sample_block(rule, t, d, 4, np.random.default_rng(1), context=(2,))
        b = sample_block(rule, t, d, 4, np.random.default_rng(1), context=(2,))
        assert np.array_equal(a, b) and 1 <= a.size <= 5 and a.dtype == np.int64
        assert a.min() >= 0 and a.max() < 5


def test_inverse_cdf_final_token():
    x, P, Q = _path(seed=0)
    u = np.array([0.0, 0.0, 0.0, 0.0])  # accept everything, first bonus token of positive mass
    out = verify_block("token", x, P, Q, None, uniforms=u)
    assert np.array_equal(out[:3], x) and out[3] == np.flatnonzero(P[3] > 0)[0]
    u[3] = np.nextafter(1.0, 0.0)
    assert verify_block("token", x, P, Q, None, uniforms=u)[3] == np.flatnonzero(P[3] > 0)[-1]


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda x, P, Q: verify_block("nope", x, P, Q, np.random.default_rng()), "rule must be"),
        (
            lambda x, P, Q: verify_block("block", x, P[:2], Q, np.random.default_rng()),
            "shape mismatch",
        ),
        (
            lambda x, P, Q: verify_block("block", x[:2], P, Q, np.random.default_rng()),
            "shape mismatch",
        ),
        (lambda x, P, Q: verify_block("block", x, P, Q, None), "rng must be"),
        (
            lambda x, P, Q: verify_block("block", x, P, Q, None, uniforms=[0.1, 0.2, 0.3]),
            "rng must be",
        ),
        (
            lambda x, P, Q: verify_block("block", x, P, Q, None, uniforms=[0.1, 1.0, 0.3, 0.2]),
            r"\[0, 1\)",
        ),
        (
            lambda x, P, Q: verify_block("block", x, P, Q, None, uniforms=[0.1]),
            "uniforms must have",
        ),
        (lambda x, P, Q: verify_block("block", x + 10, P, Q, None, uniforms=[0.1] * 4), "outside"),
        (
            lambda x, P, Q: verify_block("block", x.astype(float), P, Q, None, uniforms=[0.1] * 4),
            "integer",
        ),
        (lambda x, P, Q: verify_block("block", x, P * 2, Q, None, uniforms=[0.1] * 4), "sums to"),
        (lambda x, P, Q: verify_block("block", x, P, -Q, None, uniforms=[0.1] * 4), "negative"),
    ],
)
def test_verify_block_validates(call, msg):
    x, P, Q = _path()
    with pytest.raises(ValueError, match=msg):
        call(x, P, Q)


def test_zero_probability_draft_is_rejected():
    x, P, Q = _path()
    Q = Q.copy()
    Q[1] = 0.0
    Q[1, (x[1] + 1) % Q.shape[1]] = 1.0
    with pytest.raises(ValueError, match="draft probability"):
        path_law("block", x, P, Q)


def test_analysis_validates_arguments():
    t, d = pair(3, 1, 0)
    with pytest.raises(ValueError, match="gamma"):
        block_efficiency("block", t, d, 0)
    with pytest.raises(ValueError, match="rule"):
        block_efficiency("greedy", t, d, 2)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        block_efficiency("block", t, TabularLM(4, 1, seed=0), 2)
    with pytest.raises(ValueError, match="draft paths"):
        block_efficiency("block", TabularLM(50, 0), TabularLM(50, 0), 4)
    with pytest.raises(ValueError, match="too large"):
        verifier_lp(TabularLM(6, 0), TabularLM(6, 0), 4)

    def bad(ctx=()):
        return np.array([0.5, 0.6, -0.1])

    with pytest.raises(ValueError, match=r"target\(\(\)\) has negative"):
        block_efficiency("block", bad, d, 2)


# ------------------------------------------------------------------ drafter-invariant (Gumbel) rule


@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_gumbel_stream_law_is_target_law(gamma):
    t, d = pair(3, 2, 4, 0.3)
    target = target_law(t, 4, context=(1,))
    assert tv(stream_law("gumbel", t, d, gamma, 4, context=(1,)), target) < 1e-12
    assert tv(stream_law("gumbel-emit-draft", t, d, gamma, 4, context=(1,)), target) > 0.1


def test_gumbel_exact_rationals_and_binary_maximality():
    t, d = rational_lm(3, 1, seed=3), rational_lm(3, 1, seed=4)
    assert np.array_equal(stream_law("gumbel", t, d, 2, 3), target_law(t, 3))
    # with two tokens the Gumbel-max coupling is a maximal coupling: it matches token verification
    te, de, g = motivating_example()
    assert expected_accepted("gumbel", te, de, g) == F(10, 9)
    tb, db = rational_lm(2, 2, seed=5), rational_lm(2, 2, seed=6)
    assert expected_accepted("gumbel", tb, db, 3) == expected_accepted("token", tb, db, 3)


def test_gumbel_match_formula():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.2, 0.3, 0.1, 0.4])
    c = gumbel_match(p, q)
    assert c[3] == 0 and np.all(c <= np.minimum(p, q) + 1e-15)
    assert c[1] == pytest.approx(1 / (0.5 / 0.3 + 1 + 0.2 / 0.3 + 0.4 / 0.3))
    assert (1 - tv(p, q)) / (1 + tv(p, q)) <= c.sum() <= 1 - tv(p, q)
    # Monte Carlo check of the exponential-race formula (fixed seed; 5 sigma)
    rng = np.random.default_rng(7)
    G = rng.gumbel(size=(200_000, 4))
    with np.errstate(divide="ignore"):
        x, y = np.argmax(np.log(q) + G, axis=1), np.argmax(np.log(p) + G, axis=1)
    for b in range(4):
        freq = np.mean((x == b) & (y == b))
        assert abs(freq - c[b]) < 5 * np.sqrt(c[b] * (1 - c[b]) / 200_000) + 1e-12


@given(st.integers(2, 4), st.integers(1, 3), st.integers(0, 10_000))
@settings(max_examples=15)
def test_gumbel_never_above_token(V, gamma, seed):
    t, d = pair(V, 1, seed)
    assert (
        expected_accepted("gumbel", t, d, gamma) <= expected_accepted("token", t, d, gamma) + 1e-12
    )


def test_gumbel_emission_law_chisquare():
    # emitted tokens of sample_block("gumbel") vs the exact outcome law; false-positive rate 1e-3
    t, d = pair(3, 2, 4, 0.5)
    from coupling.block import _Cache, _outcomes

    law = {}
    for emitted, _, prob in _outcomes("gumbel", _Cache(t, "t"), _Cache(d, "d"), 3, (0,)):
        law[emitted] = law.get(emitted, 0.0) + prob
    keys = list(law)
    rng = np.random.default_rng(99)
    n = 20_000
    counts = dict.fromkeys(keys, 0)
    for _ in range(n):
        counts[tuple(sample_block("gumbel", t, d, 3, rng, context=(0,)).tolist())] += 1
    f_obs = np.array([counts[k] for k in keys], float)
    f_exp = np.array([law[k] for k in keys]) * n
    assert f_obs.sum() == n and abs(f_exp.sum() - n) < 1e-6
    small = f_exp < 5
    f_obs = np.append(f_obs[~small], f_obs[small].sum())
    f_exp = np.append(f_exp[~small], f_exp[small].sum())
    assert stats.chisquare(f_obs, f_exp).pvalue > 1e-3


def test_verify_block_gumbel_reference():
    x, P, _ = _path(seed=1)
    G = np.random.default_rng(0).gumbel(size=P.shape)
    out = verify_block_gumbel(x, P, G)
    y = [int(np.argmax(np.log(P[i]) + G[i])) for i in range(4)]
    tau = next((i for i in range(3) if x[i] != y[i]), 3)
    assert np.array_equal(out, np.append(x[:tau], y[tau]))
    # drafts equal to the target's own Gumbel-max picks are all accepted
    assert np.array_equal(verify_block_gumbel(np.array(y[:3]), P, G), y)
    with pytest.raises(ValueError, match="gumbels"):
        verify_block_gumbel(x, P, G[:2])
    with pytest.raises(ValueError, match="verify_block_gumbel"):
        verify_block("gumbel", x, P, _path(seed=1)[2], np.random.default_rng())


def test_position_gumbels_are_keyed_by_position():
    from coupling.block import position_gumbels

    a = position_gumbels(3, [10, 11, 12], 5)
    assert a.shape == (3, 5)
    assert np.array_equal(a[1:], position_gumbels(3, [11, 12], 5))
    assert not np.array_equal(a, position_gumbels(4, [10, 11, 12], 5))


# ------------------------------------------------------------------ verifier LP, ill-conditioned


def _const(law):
    return lambda ctx=(): law


@pytest.mark.parametrize(
    "make",
    [
        # presolve dropped coefficients below 1e-9: HiGHS called it infeasible
        lambda: pair(2, 1, 87, 0.05),
        # HiGHS stopped 3e-7 below block verification, a feasible verifier
        lambda: pair(2, 1, 91, 0.05),
        # returned z >= -1.5e-8 violating A z = b by 1.5e-8, with a value above gamma
        lambda: (
            _const(np.array([0.99999998465, 1.535e-08])),
            _const(np.array([0.999999999914, 8.6e-11])),
        ),
        # only a geometric-mean row scaling passes the checks here
        lambda: pair(2, 1, 14, 0.05),
    ],
)
def test_verifier_lp_peaked_float_laws_are_solved_correctly(make):
    t, d = make()
    gamma = 3
    lp = verifier_lp(t, d, gamma)
    value, z, _ = lp.solve()
    blk = expected_accepted("block", t, d, gamma)
    bound = min(optimal_expected_accepted(t, d, gamma), gamma)
    assert blk - 1e-9 <= value <= bound + 1e-9  # block is feasible; transport is a relaxation
    assert z.min() >= -1e-9
    b = np.array([float(v) for v in lp.b])
    assert np.abs(lp.matrix() @ z - b).max() <= 1e-9
    assert full_information_accepted(t, d, gamma) == pytest.approx(value, abs=1e-9)


def test_verifier_lp_raises_solver_error_when_no_solve_passes_the_checks(monkeypatch):
    import coupling.block as block
    from coupling.solve import SolverError

    # as built, HiGHS drops this LP's tiny coefficients and reports it infeasible
    monkeypatch.setattr(block, "_VERIFIER_ATTEMPTS", block._VERIFIER_ATTEMPTS[:1])
    with pytest.raises(SolverError, match="Fraction models"):
        verifier_lp(*pair(2, 1, 87, 0.05), 3).solve()


def test_verifier_lp_checks_reject_bad_solutions():
    import coupling.block as block

    t, d = motivating_example(exact=False)[:2]
    lp = verifier_lp(t, d, 2)
    value, z, y = lp.solve()
    A = lp.matrix()
    b = np.array([float(v) for v in lp.b])
    c = np.array([float(v) for v in lp.c])
    n_str = len(b) - len(lp.paths)
    caps = np.minimum(block._emitted_mass(A, b, n_str), np.repeat(b[n_str:], len(lp.outs)))
    assert block._verifier_defects(A, b, c, z, y, caps, 2) == []
    assert value == pytest.approx(11 / 9, abs=1e-9)
    negative = z.copy()
    negative[np.argmax(z)] += 1e-8
    negative[np.argmin(z)] -= 1e-8
    assert any("down to" in m for m in block._verifier_defects(A, b, c, negative, y, caps, 2))
    assert any("A z - b" in m for m in block._verifier_defects(A, b, c, negative, y, caps, 2))
    # a feasible but suboptimal verifier: always emit one target token (value 0)
    outs = lp.outs
    idle = np.zeros(lp.n_var)
    for k in range(len(lp.paths)):
        for o, (tau, y_tok) in enumerate(outs):
            if tau == 0:
                idle[k * len(outs) + o] = b[n_str + k] * float(t(())[y_tok])
    assert np.abs(A @ idle - b).max() < 1e-12  # lossless, so only optimality can flag it
    assert any("not optimal" in m for m in block._verifier_defects(A, b, c, idle, y, caps, 2))
    assert any("outside [0, gamma" in m for m in block._verifier_defects(A, b, c, z, y, caps, 1))


# ------------------------------------------------------------------ argument validation


@pytest.mark.parametrize(
    "p, q, msg",
    [
        ([0.5, 0.5], [0.9, 0.05, 0.05], "same vocabulary"),
        ([0.5, 0.3, 0.2], [0.5, 0.5], "same vocabulary"),
        ([3.0, 1.0], [0.5, 0.5], "p sums to"),
        ([1.5, -0.5], [0.5, 0.5], "p has negative"),
        ([np.nan, 1.0], [0.5, 0.5], "p contains NaN"),
        ([0.5, 0.5], [0.5, 0.6], "q sums to"),
        (np.array([F(1, 2), F(1, 2)], dtype=object), [0.5, 0.5], "q: exact laws"),
    ],
)
def test_gumbel_match_validates(p, q, msg):
    with pytest.raises(ValueError, match=msg):
        gumbel_match(np.asarray(p), np.asarray(q))


def test_gumbel_match_exact():
    p = np.array([F(1, 2), F(1, 2)], dtype=object)
    q = np.array([F(1, 4), F(3, 4)], dtype=object)
    assert gumbel_match(p, q).tolist() == [F(1, 4), F(1, 2)]  # V = 2: min(p, q)


@pytest.mark.parametrize("alpha", [1.5, -1.0, float("nan"), float("inf"), 2, True, "0.5", None])
def test_constant_acceptance_efficiency_rejects_non_probabilities(alpha):
    with pytest.raises(ValueError, match="alpha must be"):
        constant_acceptance_efficiency(alpha, 3)


def test_constant_acceptance_efficiency_accepts_probabilities():
    assert constant_acceptance_efficiency(F(1, 2), 2) == F(7, 4)
    assert constant_acceptance_efficiency(1, 3) == 4
    assert constant_acceptance_efficiency(0.0, 3) == 1
    assert constant_acceptance_efficiency(np.float64(0.5), 1) == 1.5


@pytest.mark.parametrize("rule", ["token", "block", "gumbel"])
def test_enumeration_size_guard_covers_every_rule(monkeypatch, rule):
    import coupling.block as block

    monkeypatch.setattr(block, "MAX_PATHS", 10)  # 3**3 = 27 paths
    t, d = pair(3, 0, 0)
    with pytest.raises(ValueError, match="draft paths"):
        accepted_length_law(rule, t, d, 3)
    accepted_length_law(rule, t, d, 2)  # 9 paths: fine


_BAD_CONTEXTS = [(0.9,), (True,), (2.7,), (np.float64(1.5),), (np.nan,), ("a",), (None,)]


@pytest.mark.parametrize("ctx", _BAD_CONTEXTS)
@pytest.mark.parametrize(
    "call",
    [
        lambda t, d, ctx: t(ctx),
        lambda t, d, ctx: sample_block("token", t, d, 2, np.random.default_rng(0), context=ctx),
        lambda t, d, ctx: sample_stream("block", t, d, 2, 3, np.random.default_rng(0), context=ctx),
        lambda t, d, ctx: expected_accepted("block", t, d, 2, context=ctx),
        lambda t, d, ctx: expected_accepted("gumbel", t, d, 2, context=ctx),
        lambda t, d, ctx: list(path_laws(t, d, 2, context=ctx)),
        lambda t, d, ctx: optimal_expected_accepted(t, d, 1, context=ctx),
        lambda t, d, ctx: verifier_lp(t, d, 1, context=ctx),
        lambda t, d, ctx: target_law(t, 2, context=ctx),
        lambda t, d, ctx: stream_law("token", t, d, 1, 2, context=ctx),
    ],
)
def test_non_integer_context_tokens_are_rejected(call, ctx):
    t, d = pair(3, 1, 0)
    with pytest.raises(ValueError, match="integer token ids"):
        call(t, d, ctx)


def test_integral_context_tokens_are_accepted():
    t, d = pair(3, 1, 0)
    assert np.array_equal(t((1.0,)), t((1,)))
    assert np.array_equal(t((np.int64(2),)), t((2,)))
    assert expected_accepted("block", t, d, 2, context=(2.0,)) == expected_accepted(
        "block", t, d, 2, context=(2,)
    )
    trace = TraceLM([0], [1], np.array([[0.5, 0.5], [0.25, 0.75]]))
    assert np.array_equal(trace((0.0, 1.0)), [0.25, 0.75])
    with pytest.raises(ValueError, match="integer token ids"):
        trace((0, 0.5))


@pytest.mark.parametrize(
    "call",
    [
        lambda lm: target_law(lm, 0),
        lambda lm: stream_law("token", lm, lm, 1, 0),
        lambda lm: sample_stream("token", lm, lm, 1, -2, np.random.default_rng(0)),
    ],
)
def test_length_errors_name_length(call):
    lm = TabularLM(2, 0, seed=0)
    with pytest.raises(ValueError, match=r"^length must be a positive integer"):
        call(lm)


def test_gamma_errors_still_name_gamma():
    lm = TabularLM(2, 0, seed=0)
    with pytest.raises(ValueError, match=r"^gamma must be a positive integer"):
        stream_law("token", lm, lm, 0, 2)


def test_position_gumbels_of_no_positions_is_an_empty_block():
    from coupling.block import position_gumbels

    assert position_gumbels(0, [], 3).shape == (0, 3)
    assert np.array_equal(position_gumbels(7, [4, 9], 3)[1], position_gumbels(7, [9], 3)[0])
