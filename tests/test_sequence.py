"""Speculative decoding over whole sequences (``coupling.sequence``): models, exact path and
stream laws, the block-level LPs, predictions from recorded laws, and Sun et al.'s example.

Exactness first (fractions and exact enumeration), then properties (hypothesis), then
statistics (chi-square with a stated false-positive rate and a negative control).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from coupling import (
    RULES,
    SolverError,
    TabularLM,
    TraceLM,
    accepted_length_law,
    block_efficiency,
    expected_accepted,
    full_information_accepted,
    lm,
    motivating_example,
    optimal_block_efficiency,
    optimal_expected_accepted,
    sample_stream,
    stream_law,
    target_law,
    tv,
    verifier_lp,
)
from coupling.lm import path_laws
from coupling.sequence import (
    conditional_tokens,
    constant_acceptance_efficiency,
    optimal_tokens,
    path_law,
    predicted_tokens,
)
from coupling.sequence import lp as lp_mod
from tests.strategies import as_tree, drafted_path, model_pair, rational_lm

F = Fraction
#: the rules whose call has a law given the drafted path, and their negative controls
CHAIN_RULES = ("token", "block", "token_no_residual", "block_plain_residual")


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


@pytest.mark.parametrize("rule", CHAIN_RULES)
def test_path_law_is_a_law(rule):
    x, P, Q = drafted_path()
    tau, nxt = path_law(rule, x, P, Q)
    assert tau.min() >= 0 and abs(tau.sum() - 1) < 1e-12
    assert np.all(nxt >= 0) and np.allclose(nxt.sum(axis=1), 1)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_verify_block_emission_law_chisquare(rule):
    # false-positive rate 1e-3 per test; fixed seed, so the outcome is deterministic
    x, P, Q = drafted_path(seed=4, conc=0.5)
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
        coins, u = rng.random((g, 1)), rng.random(g + 1)
        n_acc, _, y = RULES[rule].verify_block(*as_tree(x, P, Q), coins, u)
        counts[tuple(x[:n_acc].tolist()) + (y,)] += 1
    f_obs = np.array([counts[k] for k in keys], dtype=float)
    f_exp = np.array([expected[k] for k in keys]) * n
    assert stats.chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum()).pvalue > 1e-3


def test_path_law_is_defined_for_chain_rules_only():
    x, P, Q = drafted_path()
    with pytest.raises(ValueError, match="chain rules token and block"):
        path_law("kseq", x, P, Q)


# ------------------------------------------------------------------ whole-sequence losslessness


def test_stream_law_exact_rationals():
    # V = 3: with V = 2 both residuals are the same point mass, so the control cannot fail
    t, d = rational_lm(3, 2, seed=5), rational_lm(3, 2, seed=6)
    for rule in ("token", "block"):
        law = stream_law(rule, t, d, 3, 4, context=(1,))
        assert np.array_equal(law, target_law(t, 4, context=(1,)))
    assert not np.array_equal(
        stream_law("block_plain_residual", t, d, 3, 4, context=(1,)), target_law(t, 4, context=(1,))
    )


def _stream_chisquare(rule, n, seed):
    t, d = model_pair(3, 2, 4, 0.3)
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
@pytest.mark.parametrize("rule", ["token", "block", "gumbel"])
def test_stream_chisquare_lossless(rule):
    # 4-token prefixes, V = 3, gamma = 3: false-positive rate 1e-3 per rule (fixed seed)
    assert _stream_chisquare(rule, 12_000, seed=11) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["block_plain_residual", "gumbel_emit_draft"])
def test_stream_chisquare_negative_control_fails(rule):
    # block verification with the plain residual (exact TV 0.049 here), or the Gumbel rule
    # emitting its draft at a disagreement, must be rejected
    assert _stream_chisquare(rule, 12_000, seed=11) < 1e-6


# ------------------------------------------------------------------ efficiency and the block LPs


@pytest.mark.parametrize("V, gamma, seed", [(2, 2, 0), (2, 3, 1), (3, 2, 2), (3, 3, 3), (2, 4, 4)])
def test_efficiency_ordering_and_full_information_optimum(V, gamma, seed):
    t, d = model_pair(V, 2, seed, 0.5)
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
    t, d = model_pair(3, 2, 0, 0.5)
    assert optimal_expected_accepted(t, d, 2) > expected_accepted("block", t, d, 2) + 1e-3


def test_accepted_length_law_matches_exact_and_float():
    te, de = rational_lm(3, 1, seed=8), rational_lm(3, 1, seed=9)

    def tf(ctx=()):
        return te(ctx).astype(float)

    def df(ctx=()):
        return de(ctx).astype(float)

    for rule in ("token", "block"):
        exact = accepted_length_law(rule, te, de, 3)
        assert sum(exact) == 1
        assert np.allclose(exact.astype(float), accepted_length_law(rule, tf, df, 3), atol=1e-14)


def _const(law):
    return lambda ctx=(): law


@pytest.mark.parametrize(
    "make",
    [
        # peaked laws whose tiny coefficients HiGHS's presolve drops (it then reports the LP
        # infeasible)
        lambda: model_pair(2, 1, 87, 0.05),
        # an instance where a single HiGHS solve stops 3e-7 below block verification
        lambda: model_pair(2, 1, 91, 0.05),
        # an instance where a single solve returns z >= -1.5e-8, violating A z = b by 1.5e-8,
        # with a value above gamma
        lambda: (
            _const(np.array([0.99999998465, 1.535e-08])),
            _const(np.array([0.999999999914, 8.6e-11])),
        ),
        # only a geometric-mean row scaling passes the checks here
        lambda: model_pair(2, 1, 14, 0.05),
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
    # as built, HiGHS drops this LP's tiny coefficients and reports it infeasible
    monkeypatch.setattr(lp_mod, "_VERIFIER_ATTEMPTS", lp_mod._VERIFIER_ATTEMPTS[:1])
    with pytest.raises(SolverError, match="Fraction models"):
        verifier_lp(*model_pair(2, 1, 87, 0.05), 3).solve()


def test_verifier_lp_checks_reject_bad_solutions():
    t, d = motivating_example(exact=False)[:2]
    lp = verifier_lp(t, d, 2)
    value, z, y = lp.solve()
    A = lp.matrix()
    b = np.array([float(v) for v in lp.b])
    c = np.array([float(v) for v in lp.c])
    n_str = len(b) - len(lp.paths)
    caps = np.minimum(lp_mod._emitted_mass(A, b, n_str), np.repeat(b[n_str:], len(lp.outs)))
    defects = lp_mod._verifier_defects
    assert defects(A, b, c, z, y, caps, 2) == []
    assert value == pytest.approx(11 / 9, abs=1e-9)
    negative = z.copy()
    negative[np.argmax(z)] += 1e-8
    negative[np.argmin(z)] -= 1e-8
    assert any("down to" in m for m in defects(A, b, c, negative, y, caps, 2))
    assert any("A z - b" in m for m in defects(A, b, c, negative, y, caps, 2))
    # a feasible but suboptimal verifier: always emit one target token (value 0)
    outs = lp.outs
    idle = np.zeros(lp.n_var)
    for k in range(len(lp.paths)):
        for o, (tau, y_tok) in enumerate(outs):
            if tau == 0:
                idle[k * len(outs) + o] = b[n_str + k] * float(t(())[y_tok])
    assert np.abs(A @ idle - b).max() < 1e-12  # lossless, so only optimality can flag it
    assert any("not optimal" in m for m in defects(A, b, c, idle, y, caps, 2))
    assert any("outside [0, gamma" in m for m in defects(A, b, c, z, y, caps, 1))


@pytest.mark.parametrize("alpha", [1.5, -1.0, float("nan"), float("inf"), 2, True, "0.5", None])
def test_constant_acceptance_efficiency_rejects_non_probabilities(alpha):
    with pytest.raises(ValueError, match="alpha must be"):
        constant_acceptance_efficiency(alpha, 3)


def test_constant_acceptance_efficiency_accepts_probabilities():
    assert constant_acceptance_efficiency(F(1, 2), 2) == F(7, 4)
    assert constant_acceptance_efficiency(1, 3) == 4
    assert constant_acceptance_efficiency(0.0, 3) == 1
    assert constant_acceptance_efficiency(np.float64(0.5), 1) == 1.5


# ------------------------------------------------------------------ predictions from recorded laws


@pytest.mark.parametrize("rule", ["token", "block"])
def test_conditional_tokens_are_the_exact_expectation_given_the_path(rule):
    for seed in range(5):
        x, P, Q = drafted_path(seed=seed)
        tau, _ = path_law(rule, x, P, Q)
        expect = 1.0 + float(np.arange(tau.size) @ tau)
        assert conditional_tokens(rule, *as_tree(x, P, Q), 0) == pytest.approx(expect,
                                                                                abs=1e-12)


def test_block_prediction_is_not_the_expectation_given_the_whole_block():
    """1 + sum_i w_i conditions each term on the prefix only: on this path every stopping
    probability after the third position is 1, so the call surely emits 4 tokens, while the
    prediction says 3.316 (it is right on average over the drafts, not path by path)."""
    x, P, Q = drafted_path(seed=0)
    predicted, w = predicted_tokens("block", *as_tree(x, P, Q), 0)
    assert w[-1] == pytest.approx(1.0) and predicted < 3.5
    assert conditional_tokens("block", *as_tree(x, P, Q), 0) == pytest.approx(4.0, abs=1e-12)


def test_block_prediction_averages_to_its_block_efficiency():
    """Sun et al.'s identity P(tau >= i | X^i) = w_i: the prediction 1 + sum_i w_i from the
    drafted laws, averaged over the drafts, is the exact block efficiency."""
    t, d = model_pair(3, 2, 4, 0.5)
    mean = sum(qx * predicted_tokens("block", *as_tree(x, P, Q), 0)[0]
               for x, qx, P, Q in path_laws(t, d, 3, context=(1,)))
    assert mean == pytest.approx(block_efficiency("block", t, d, 3, context=(1,)), abs=1e-12)


def test_token_prediction_on_constant_laws_is_the_closed_form():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
    x, P, Q = np.array([0, 1, 2]), np.tile(p, (4, 1)), np.tile(q, (3, 1))
    tokens, beta = predicted_tokens("token", *as_tree(x, P, Q), 0)
    assert beta == pytest.approx([1 - tv(p, q)] * 3, abs=1e-15)
    assert tokens == pytest.approx(constant_acceptance_efficiency(1 - tv(p, q), 3), rel=1e-14)


def test_optimal_prediction_bounds_every_single_step_rule():
    """On one recorded call the LP-optimal verifier of the same draft law predicts at least
    as many tokens as any lossless single-step rule of that law (a lossy rule may pass it:
    it pays in distortion)."""
    t, d = model_pair(4, 1, 2, 0.5)
    rng = np.random.default_rng(0)
    T, D, ctx = lm.check_models(t, d, (1,))
    for k, rep in [(1, True), (2, True), (2, False)]:
        drafts, P, Q = lm.draft_tree(T, D, 3, rng, ctx, k=k, replacement=rep)
        best = optimal_tokens(drafts, P, Q, 0, replacement=rep)
        for name, rule in RULES.items():
            if rule.unit == "token" and rule.lossless and rule.supports(k, rep):
                tokens, _ = predicted_tokens(name, drafts, P, Q, 0, replacement=rep)
                assert 1.0 <= tokens <= best + 1e-12, (name, k, rep)


@pytest.mark.parametrize(
    "call, msg",
    [
        (lambda x, P, Q: predicted_tokens("token", x, P, Q, 1), "branch=1"),
        (lambda x, P, Q: predicted_tokens("token", x.astype(float), P, Q, 0), "integer"),
        (lambda x, P, Q: predicted_tokens("token", x, P[:, :2], Q, 0), "p must be"),
        (lambda x, P, Q: predicted_tokens("token", x + 4, P, Q, 0), "token ids"),
        (lambda x, P, Q: conditional_tokens("kseq", x, P, Q, 0), "exact path law"),
    ],
)
def test_predictions_validate_the_record(call, msg):
    x, P, Q = as_tree(*drafted_path())
    with pytest.raises(ValueError, match=msg):
        call(x, P, Q)


def test_predictions_refuse_a_draft_of_zero_draft_probability():
    x, P, Q = drafted_path()
    Q = Q.copy()
    Q[1] = 0.0
    Q[1, (x[1] + 1) % Q.shape[1]] = 1.0
    with pytest.raises(ValueError, match="probability 0 to a draft"):
        predicted_tokens("block", *as_tree(x, P, Q), 0)


# ------------------------------------------------------------------ argument validation


def test_analysis_validates_arguments():
    t, d = model_pair(3, 1, 0)
    with pytest.raises(ValueError, match="gamma"):
        block_efficiency("block", t, d, 0)
    with pytest.raises(ValueError, match="rule"):
        block_efficiency("no_such_rule", t, d, 2)
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


@pytest.mark.parametrize("rule", ["token", "block", "gumbel"])
def test_enumeration_size_guard_covers_every_rule(monkeypatch, rule):
    monkeypatch.setattr(lm, "MAX_PATHS", 10)  # 3**3 = 27 paths
    t, d = model_pair(3, 0, 0)
    with pytest.raises(ValueError, match="draft paths"):
        accepted_length_law(rule, t, d, 3)
    accepted_length_law(rule, t, d, 2)  # 9 paths: fine


_BAD_CONTEXTS = [(0.9,), (True,), (2.7,), (np.float64(1.5),), (np.nan,), ("a",), (None,)]


@pytest.mark.parametrize("ctx", _BAD_CONTEXTS)
@pytest.mark.parametrize(
    "call",
    [
        lambda t, d, ctx: t(ctx),
        lambda t, d, ctx: sample_stream("token", t, d, 2, 2, np.random.default_rng(0), context=ctx),
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
    t, d = model_pair(3, 1, 0)
    with pytest.raises(ValueError, match="integer token ids"):
        call(t, d, ctx)


def test_integral_context_tokens_are_accepted():
    t, d = model_pair(3, 1, 0)
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


def test_gamma_errors_name_gamma():
    lm = TabularLM(2, 0, seed=0)
    with pytest.raises(ValueError, match=r"^gamma must be a positive integer"):
        stream_law("token", lm, lm, 0, 2)
