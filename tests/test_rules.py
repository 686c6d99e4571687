"""Exact, statistical and edge-case tests of the single-step verification rules."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from coupling.check import check_rule, check_sampler
from coupling.dist import check_pair, tuple_law, tv
from coupling.rules import RULES, Rule, gumbel, kseq, rrs, token
from coupling.rules.token import TOKEN_NO_RESIDUAL
from coupling.solve import solve_coupling

MODES = [(1, True), (2, True), (3, True), (2, False), (3, False)]


@st.composite
def pairs(draw, max_v: int = 6):
    """(p, q) over V <= max_v tokens, with zeros, ties, one-hots and p == q mixed in."""
    V = draw(st.integers(2, max_v))
    w = st.lists(st.integers(0, 12), min_size=V, max_size=V).filter(lambda a: sum(a) > 0)
    a = np.array(draw(w), dtype=float)
    kind = draw(st.sampled_from(["free", "free", "free", "equal", "onehot_p", "onehot_q"]))
    if kind == "equal":
        b = a.copy()
    else:
        b = np.array(draw(w), dtype=float)
    p, q = a / a.sum(), b / b.sum()
    if kind == "onehot_p":
        p = np.eye(V)[draw(st.integers(0, V - 1))]
    if kind == "onehot_q":
        q = np.eye(V)[draw(st.integers(0, V - 1))]
    return p, q


def _supported(rule: Rule, q: np.ndarray, k: int, rep: bool) -> bool:
    return rule.supports(k, rep) and (rep or np.count_nonzero(q) >= k)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pq=pairs(), mode=st.sampled_from(MODES))
def test_every_rule_is_exact(pq, mode):
    """Lossless (TV < 1e-12), draft marginal, closed form == trace, <= LP, within own bound."""
    p, q = pq
    k, rep = mode
    ran = 0
    for name, rule in RULES.items():
        if not _supported(rule, q, k, rep):
            continue
        r = check_rule(rule, p, q, k, replacement=rep)
        assert r.ok, (name, r)
        ran += 1
    assume(ran > 0)


@settings(max_examples=40, deadline=None)
@given(pq=pairs(), mode=st.sampled_from(MODES))
def test_specific_guarantees(pq, mode):
    p, q = pq
    k, rep = mode
    assume(rep or np.count_nonzero(q) >= k)
    opt = solve_coupling(p, q, k, replacement=rep).acceptance
    assert abs(RULES["optimal"].acceptance(p, q, k, replacement=rep) - opt) < 1e-9
    t = tv(p, q)
    if k == 1:
        assert abs(RULES["token"].acceptance(p, q) - (1 - t)) < 1e-15
        for name in ("gumbel", "minhash"):
            a = RULES[name].acceptance(p, q)
            assert (1 - t) / (1 + t) - 1e-12 <= a <= 1 - t + 1e-12, name
    if rep:
        assert RULES["kseq"].acceptance(p, q, k) >= (1 - 1 / math.e) * opt - 1e-12
    # rrs starts with a speculative-sampling step: never below 1 - TV
    assert RULES["rrs"].acceptance(p, q, k, replacement=rep) >= 1 - t - 1e-12


def test_exact_rational_values():
    p = np.array([1 / 3, 2 / 3])
    q = np.array([2 / 3, 1 / 3])
    assert RULES["token"].acceptance(p, q) == pytest.approx(2 / 3, abs=1e-15)
    # gumbel collision sum_i 1/sum_j max(p_j/p_i, q_j/q_i) = 1/3 + 1/3: on two tokens the
    # drafter-invariant coupling is optimal here
    exact = sum(
        1
        / sum(
            max(Fraction(pj) / Fraction(pi), Fraction(qj) / Fraction(qi))
            for pj, qj in [(Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))]
        )
        for pi, qi in [(Fraction(1, 3), Fraction(2, 3)), (Fraction(2, 3), Fraction(1, 3))]
    )
    assert exact == Fraction(2, 3)
    assert RULES["gumbel"].acceptance(p, q) == pytest.approx(2 / 3, abs=1e-15)
    # minhash: sum min (1 + |p - q|) / (1 + TV) = (2/3)(4/3) / (4/3) = 2/3
    assert RULES["minhash"].acceptance(p, q) == pytest.approx(2 / 3, abs=1e-15)
    # k = 2 i.i.d.: OPT = 1 - p(H^c) ... both prefixes: H = {1}: 1 - 2/3 + 1 - (2/3)^2 = 8/9
    assert RULES["optimal"].acceptance(p, q, 2) == pytest.approx(8 / 9, abs=1e-15)


def test_kseq_rho_is_smallest_valid():
    rng = np.random.default_rng(3)
    for _ in range(30):
        V = int(rng.integers(3, 9))
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        for k in (2, 3, 5):
            rho = kseq.optimal_rho(p, q, k)
            assert 1.0 <= rho <= k
            res = kseq.residual_law(p, q, k)
            assert res.min() >= 0 and abs(res.sum() - 1) < 1e-12
            if rho > 1.0 + 1e-9:
                # slightly smaller rho: the residual would need negative mass
                r2 = rho * (1 - 1e-7)
                beta = np.minimum(q, p / r2).sum()
                c = (1 - (1 - beta) ** k) / beta
                assert (p - c * np.minimum(q, p / r2)).min() < 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    V=st.sampled_from([2, 3, 5, 12]),
    alpha=st.sampled_from([0.02, 0.1, 0.5, 2.0]),
    k=st.sampled_from([2, 3, 4, 8, 16]),
    mix=st.booleans(),
    binned=st.booleans(),
)
def test_kseq_rho_against_high_precision_root(seed, V, alpha, k, mix, binned):
    """``optimal_rho`` against the smallest root of g(rho) = rho beta - 1 + (1 - beta)^k
    bisected at 300 digits on the very float inputs: the acceptance 1 - (1 - beta)^k it
    gives is within 1e-14 of the optimum's, and rho is valid (g >= -1e-15), including
    peaked laws and p close to q (mix), where g is flat. ``binned``: the histogram passes
    narrow the bracket even for these few ratios (``SORT_AT_MOST = 0``), as they do where
    thousands lie inside (1, k)."""
    import mpmath as mp

    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(V, alpha)), rng.dirichlet(np.full(V, alpha))
    if mix:
        q = 0.9 * p + 0.1 * q
    p, q = check_pair(p, q)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kseq, "SORT_AT_MOST", 0 if binned else kseq.SORT_AT_MOST)
        rho = kseq.optimal_rho(p, q, k)
    with mp.workdps(300):
        P, Q = [mp.mpf(float(x)) for x in p], [mp.mpf(float(x)) for x in q]

        def beta(r):
            return sum(min(b, a / r) for a, b in zip(P, Q, strict=True))

        def g(r):
            b = beta(r)
            return r * b - 1 + (1 - b) ** k

        lo, hi = mp.mpf(1), mp.mpf(k)
        if g(lo) >= 0:
            hi = lo
        for _ in range(110):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if g(mid) >= 0 else (mid, hi)
        acc_opt, acc = 1 - (1 - beta(hi)) ** k, 1 - (1 - beta(mp.mpf(rho))) ** k
        assert float(acc_opt - acc) <= 1e-14, (float(hi), rho)
        assert float(g(mp.mpf(rho))) >= -1e-15


def test_k1_rules_coincide_with_token():
    rng = np.random.default_rng(5)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    J = token.joint(p, q)
    for name in ("kseq", "rrs", "optimal"):
        np.testing.assert_allclose(RULES[name].joint(p, q, 1), J, atol=1e-15)


# ------------------------------------------------------------------- statistics
# Each chi-square test has false-positive rate alpha = 1e-3 when the sampler is exact;
# seeds are fixed, so outcomes are reproducible.
P4 = np.array([0.5, 0.2, 0.2, 0.1])
Q4 = np.array([0.1, 0.3, 0.2, 0.4])


SAMPLER_CASES = [
    (name, k, rep)
    for name, rule in RULES.items()
    for k, rep in [(1, True), (2, True), (3, True), (2, False), (3, False)]
    if rule.supports(k, rep)
]


@pytest.mark.parametrize("name,k,rep", SAMPLER_CASES)
def test_sampler_matches_joint(name, k, rep):
    rule = RULES[name]
    rep_ = check_sampler(rule, P4, Q4, k, replacement=rep, n=4000, seed=11 + k, alpha=1e-3)
    assert rep_.ok, rep_


def test_negative_control_fails():
    """Speculative sampling without the residual correction must be caught both ways."""
    assert not check_rule(TOKEN_NO_RESIDUAL, P4, Q4).ok
    s = check_sampler(TOKEN_NO_RESIDUAL, P4, Q4, n=4000, seed=1, reference=RULES["token"])
    assert not s.ok and s.pvalue < 1e-12


def test_negative_control_rrs_without_renormalising():
    """RRS without replacement that keeps testing against q (not q minus the drafted
    tokens) is not lossless; the exact check must see it."""

    def broken_joint(p, q, k=1, *, replacement=True):
        tuples, probs = tuple_law(q, k, replacement=False)
        J = np.zeros((tuples.shape[0], p.size))
        for t, x in enumerate(tuples):
            r, surv = p, probs[t]
            for xi in x:
                a = min(1.0, r[xi] / q[xi])
                J[t, xi] += surv * a
                surv *= 1 - a
                d = np.maximum(r - q, 0)
                r = d / d.sum() if d.sum() > 0 else r
            J[t] += surv * r
        return J

    broken = Rule(
        "rrs_no_renorm",
        "",
        "",
        lambda k, r: True,
        rrs.acceptance,
        broken_joint,
        rrs.sample,
        rrs.bound,
    )
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    for k in (2, 3):
        r = check_rule(broken, p, q, k, replacement=False)
        assert not r.lossless and r.output_tv > 0.04, r
        assert check_rule(RULES["rrs"], p, q, k, replacement=False).ok


def test_gumbel_pair_matches_exact_joint():
    """The analytic joint of the shared-noise pair agrees with literal shared noise."""
    rng = np.random.default_rng(7)
    n = 20000
    J = gumbel.joint(P4, Q4)
    counts = np.zeros_like(J)
    for _ in range(n):
        x, y = gumbel.gumbel_pair(P4, Q4, rng)
        counts[x, y] += 1
    from scipy import stats

    m = J.ravel() > 0
    assert counts.ravel()[~m].sum() == 0
    stat = ((counts.ravel()[m] - n * J.ravel()[m]) ** 2 / (n * J.ravel()[m])).sum()
    assert stats.chi2.sf(stat, m.sum() - 1) > 1e-3


def test_minhash_darts_match_exact_joint():
    """Literal dart throwing vs the closed-form law (the collision exceeds sum min / sum max)."""
    rng = np.random.default_rng(8)
    n = 20000
    J = gumbel.minhash_joint(P4, Q4)
    counts = np.zeros_like(J)
    for _ in range(n):
        x, y = gumbel.minhash_pair(P4, Q4, rng, block=16)
        counts[x, y] += 1
    from scipy import stats

    m = J.ravel() > 0
    assert counts.ravel()[~m].sum() == 0
    stat = ((counts.ravel()[m] - n * J.ravel()[m]) ** 2 / (n * J.ravel()[m])).sum()
    assert stats.chi2.sf(stat, m.sum() - 1) > 1e-3
    smin = np.minimum(P4, Q4).sum() / np.maximum(P4, Q4).sum()
    assert gumbel.minhash_acceptance(P4, Q4) > smin


def test_gumbel_drafter_invariance():
    """Given the noise, the output never depends on q."""
    rng = np.random.default_rng(9)
    V = 50
    p = rng.dirichlet(np.ones(V))
    for _ in range(200):
        G = rng.gumbel(size=V)
        outs = {gumbel.gumbel_pair_from_noise(p, rng.dirichlet(np.ones(V)), G)[1] for _ in range(5)}
        assert len(outs) == 1


def test_gumbel_conditional_noise_respects_draft():
    rng = np.random.default_rng(10)
    q = rng.dirichlet(np.ones(30))
    q[3] = 0.0
    q /= q.sum()
    for x in (0, 7, 29):
        for _ in range(50):
            G = gumbel.conditional_noise(q, x, rng.random(31) * (1 - 1e-12) + 1e-300)
            with np.errstate(divide="ignore"):
                assert int(np.argmax(np.log(q) + G)) == x


def test_gumbel_acceptance_fast_equals_quadratic():
    rng = np.random.default_rng(12)
    for _ in range(20):
        V = 40
        p, q = rng.dirichlet(np.ones(V) * 0.3), rng.dirichlet(np.ones(V) * 0.3)
        p[rng.integers(V)] = 0
        p /= p.sum()
        direct = sum(
            1 / np.maximum(p / p[i], q / q[i]).sum() for i in range(V) if p[i] > 0 and q[i] > 0
        )
        assert abs(gumbel.acceptance(p, q) - direct) < 1e-13


# ---------------------------------------------------------------- degenerate inputs
@pytest.mark.parametrize("name", list(RULES))
def test_degenerate_inputs(name):
    rule = RULES[name]
    V = 4
    cases = {
        "equal": (P4, P4, 1.0),
        "disjoint": (np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.25, 0.75]), 0.0),
        "onehot_p": (np.eye(V)[2], Q4, None),
        "onehot_q": (P4, np.eye(V)[0], None),
        "tiny": (
            np.array([1e-300, 0.5, 0.5 - 1e-300, 0]),
            np.array([0.5, 1e-300, 0.25, 0.25]),
            None,
        ),
    }
    for case, (p, q, expected) in cases.items():
        for k, rep in [(1, True), (2, True), (2, False)]:
            if not _supported(rule, q, k, rep):
                continue
            r = check_rule(rule, p, q, k, replacement=rep)
            assert r.ok, (case, k, rep, r)
            if expected is not None:
                assert r.acceptance == pytest.approx(expected, abs=1e-12), (case, k, rep)
            # the sampler runs on every draftable tuple and returns a token of p > 0
            rng = np.random.default_rng(0)
            drafts = np.flatnonzero(q > 0)[:k] if not rep else np.full(k, int(np.argmax(q)))
            y = rule.sample(p, q, drafts, rng, replacement=rep)
            assert p[y] > 0


@pytest.mark.parametrize("name", list(RULES))
def test_invalid_inputs_raise(name):
    rule = RULES[name]
    rng = np.random.default_rng(0)
    q = np.array([0.5, 0.5, 0.0])
    p = np.array([0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="q = 0"):
        rule.sample(p, q, np.array([2]), rng)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        rule.acceptance(p, np.array([0.5, 0.5]))
    with pytest.raises(ValueError):
        rule.joint(np.array([0.5, 0.6]), np.array([0.5, 0.5]))
    if not rule.supports(2, True):
        with pytest.raises(ValueError, match="does not support"):
            rule.acceptance(p, q, 2)
    if not rule.supports(2, False):
        with pytest.raises(ValueError, match="does not support"):
            rule.acceptance(p, q, 2, replacement=False)


def test_rrs_without_replacement_k2_fast_path_matches_enumeration():
    rng = np.random.default_rng(13)
    for _ in range(30):
        V = int(rng.integers(2, 8))
        p, q = rng.dirichlet(np.ones(V) * 0.7), rng.dirichlet(np.ones(V) * 0.7)
        fast = rrs.acceptance(p, q, 2, replacement=False)
        slow = 1 - rrs._reject_paths(p, q, q.copy(), 1.0, 2)
        assert abs(fast - slow) < 1e-13


def test_large_vocabulary_closed_forms_run():
    rng = np.random.default_rng(14)
    V = 49152
    z = rng.normal(size=V) * 2
    p = np.exp(z) / np.exp(z).sum()
    q = np.exp(z + rng.normal(size=V)) / np.exp(z + rng.normal(size=V) * 0).sum()
    q = q / q.sum()
    opt = {k: RULES["optimal"].acceptance(p, q, k) for k in (1, 2, 4, 8)}
    assert all(opt[a] <= opt[b] + 1e-12 for a, b in [(1, 2), (2, 4), (4, 8)])
    for name, rule in RULES.items():
        for k in (1, 2, 4, 8):
            if rule.supports(k, True) and name != "optimal":
                a = rule.acceptance(p, q, k)
                assert 0 <= a <= opt[k] + 1e-9, (name, k)
                d = np.array([int(np.argmax(q))] * k)
                y = rule.sample(p, q, d, rng)
                assert 0 <= y < V and p[y] > 0
    assert (
        RULES["rrs"].acceptance(p, q, 2, replacement=False)
        <= RULES["optimal"].acceptance(p, q, 2, replacement=False) + 1e-9
    )
    with pytest.raises(ValueError, match="no exact large-vocabulary sampler"):
        RULES["optimal"].sample(p, q, np.array([1, 2]), rng)


def _dense_laws(V: int, seed: int, clustered: bool = False):
    """Full-support laws as a plain softmax makes them (every token has mass, thousands of
    ratios p/q inside (1, k)); ``clustered``: p = q times one of two constants, so that
    half the ratios are equal and no bin can split them."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=3.0, size=V)
    p = np.exp(z - z.max())
    q = p * np.exp(rng.normal(size=V))
    if clustered:
        q = p * np.where(np.arange(V) % 2 == 0, 1.0, 1.5)
    return check_pair(p / p.sum(), q / q.sum())


@pytest.mark.parametrize("clustered", [False, True], ids=["dense", "clustered"])
def test_kseq_rho_binned_equals_sorted(monkeypatch, clustered):
    """Where more than ``SORT_AT_MOST`` ratios lie inside (1, k), histogram passes narrow the
    bracket before the sort; the root equals the one from sorting every ratio (to 1e-12,
    summation order), is valid, and 1e-9 less is not. Clustered ratios (half of them equal)
    stay inside whatever the bins: the sort then takes them all."""
    for V, seed in [(3000, 0), (49152, 1)]:
        p, q = _dense_laws(V, seed, clustered)
        for k in (2, 4, 8):
            ratio = p / q
            assert np.count_nonzero((ratio > 1) & (ratio < k)) > kseq.SORT_AT_MOST
            binned = kseq.optimal_rho(p, q, k)
            monkeypatch.setattr(kseq, "SORT_AT_MOST", V)
            sorted_ = kseq.optimal_rho(p, q, k)
            monkeypatch.undo()
            assert abs(binned - sorted_) <= 1e-12 * sorted_, (V, k, binned, sorted_)
            assert kseq._h(p, q, k, binned) >= 0.0
            if binned > 1.0:
                assert kseq._h(p, q, k, binned * (1 - 1e-9)) < 0.0


def test_kseq_rho_large_vocabulary_path():
    """The vectorised breakpoint search (V >= 64) finds the smallest valid rho too."""
    rng = np.random.default_rng(15)
    V = 3000
    z = rng.normal(scale=2.0, size=V)
    p = np.exp(z) / np.exp(z).sum()
    q = np.exp(z + rng.normal(size=V))
    p, q = check_pair(p, q / q.sum())  # the arrays the rule itself sees (renormalised)
    for k in (2, 4, 8):
        rho = kseq.optimal_rho(p, q, k)
        assert 1.0 < rho <= k
        assert kseq._h(p, q, k, rho) >= 0.0
        assert kseq._h(p, q, k, rho * (1 - 1e-9)) < 0.0
        res = kseq.residual_law(p, q, k)
        assert res.min() >= 0.0 and abs(res.sum() - 1.0) < 1e-12
        # output law from the closed-form pieces: c * min(q, p / rho) + (1 - beta)^k * res == p
        beta = np.minimum(q, p / rho).sum()
        c = (1 - (1 - beta) ** k) / beta
        out = c * np.minimum(q, p / rho) + (1 - beta) ** k * res
        assert 0.5 * np.abs(out - p).sum() < 1e-12


@pytest.mark.parametrize("name", ["rrs", "optimal"])
def test_repeated_drafts_without_replacement_is_an_error(name):
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    with pytest.raises(ValueError, match="repeat a token"):
        RULES[name].sample(p, q, np.array([2, 2]), np.random.default_rng(0), replacement=False)


@pytest.mark.parametrize("k", [0, -3, 2.9, True])
def test_kseq_rho_and_residual_refuse_a_bad_k(k):
    """int(k) once read 2.9 as 2, True as 1, and 0 or -3 as a rho of 1."""
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    with pytest.raises(ValueError, match="positive integer number of drafts"):
        kseq.optimal_rho(p, q, k)
    with pytest.raises(ValueError, match="positive integer number of drafts"):
        kseq.residual_law(p, q, k)


def test_optimal_refuses_a_draft_tuple_whose_probability_underflows():
    p, q = np.array([0.5, 0.5]), np.array([1 - 1e-200, 1e-200])
    with pytest.raises(ValueError, match="probability 0 as a tuple"):
        RULES["optimal"].sample(p, q, [1, 1], np.random.default_rng(0))
    assert RULES["optimal"].sample(p, q, [0, 1], np.random.default_rng(0)) in (0, 1)


def test_optimal_verify_reads_the_plan_row_of_the_drafted_tuple():
    """The deterministic core (the engine's path) finds the drafted tuple's plan row: with a
    uniform at the row's cumulative breakpoints it emits exactly that row's tokens, and a tuple
    the rule cannot have drafted (a repeat without replacement) is refused by name."""
    from coupling.rules import optimal as opt

    p, q = np.array([0.1, 0.4, 0.2, 0.3]), np.array([0.3, 0.1, 0.4, 0.2])
    for replacement in (True, False):
        P, tuples = opt.plan(p, q, 2, replacement)
        for t, x in enumerate(tuples):
            row = P[t] / P[t].sum()
            if row.sum() == 0:
                continue
            edges = np.cumsum(row)
            for y in np.flatnonzero(row > 1e-12):
                u = (edges[y] - row[y] / 2) / edges[-1]      # the middle of y's interval
                assert opt.verify(p, q, x, u, replacement=replacement) == y
    with pytest.raises(ValueError, match="no draft tuple of this rule"):
        opt.verify(p, q, np.array([2, 2]), 0.5, replacement=False)


@pytest.mark.parametrize("block", [0, -5, 2.5, True])
def test_minhash_pair_refuses_a_bad_block(block):
    with pytest.raises(ValueError, match="block must be a positive integer"):
        gumbel.minhash_pair([0.5, 0.5], [0.5, 0.5], np.random.default_rng(0), block=block)
