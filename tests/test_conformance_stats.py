"""The conformance check's own false-positive rate and power.

* Calibration: under a lossless verifier the loops are i.i.d. draws from the target's law,
  so the test's false-positive rate is that of the likelihood-ratio test on multinomial
  counts. Null multinomials of the check's own laws measure it at 1e-2 .. 1e-4.
* End to end: every lossless rule of the package passes at the stated alpha on several
  seeds (``test_conformance.py`` checks the same rules exactly).
* Power: broken verifiers fail, including a subtle one whose worst sequence-level TV is
  about 0.01; a worst-case distortion at the reported detectable TV is caught at least
  90% of the time.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from coupling import target_law
from coupling.conformance import chain_law, check_verifier, from_rule, model_pairs
from coupling.conformance.stats import (
    detectable_tv,
    likelihood_ratio,
    null_rejections,
    tv_interval,
)

ALPHAS = np.array([1e-2, 1e-3, 1e-4])


@pytest.mark.parametrize("seed", [0, 1])
def test_false_positive_rate_on_null_multinomials(seed):
    """Rejections of 100 000 null count vectors per pair stay within 99.9% binomial limits
    (docs/conformance.md: 10^7 per pair, down to 1e-6)."""
    reps = 100_000
    total = np.zeros(ALPHAS.size, dtype=np.int64)
    for i, pair in enumerate(model_pairs(3, seed=seed)):
        P = np.asarray(target_law(pair.target, 4), dtype=np.float64)
        total += null_rejections(P, 20_000, reps, ALPHAS, seed=10 * seed + i)
    trials = reps * 6
    assert (total <= stats.binom.isf(1e-3, trials, ALPHAS)).all(), total
    assert (total >= stats.binom.ppf(1e-3, trials, ALPHAS)).all(), total  # not conservative


def test_null_rejections_counts_what_likelihood_ratio_decides():
    P = np.random.default_rng(2).dirichlet(np.ones(30))
    P[:5] = 1e-5
    P /= P.sum()
    rng = np.random.default_rng(0)
    counts = rng.multinomial(2000, P, size=300)
    direct = np.array([[likelihood_ratio(c, P).p_value < a for a in (0.05, 0.5)]
                       for c in counts]).sum(axis=0)
    assert (null_rejections(P, 2000, 300, [0.05, 0.5], seed=0, chunk=64) == direct).all()


def test_impossible_string_is_a_certain_failure():
    P = np.array([0.5, 0.5, 0.0])
    r = likelihood_ratio(np.array([400, 599, 1]), P)
    assert r.p_value == 0.0 and r.impossible == 1 and r.dof == 1


def test_detectable_tv_is_honest_for_the_worst_case_distortion():
    """A distortion d = c P s (s = +-1 on halves of the mass) has chi^2 = 4 TV^2, the worst
    case of the bound: at the detectable TV the test rejects about 90% of the time."""
    rng = np.random.default_rng(3)
    P = rng.dirichlet(np.ones(40))
    n, alpha = 20_000, 1e-6 / 6
    dof = likelihood_ratio(rng.multinomial(n, P), P).dof
    delta = detectable_tv(n, dof, alpha)
    order = np.argsort(P)
    s = np.where(np.cumsum(P[order]) <= 0.5, 1.0, -1.0)
    sign = np.empty_like(P)
    sign[order] = s
    d = P * sign
    d -= P * (d.sum() / 1.0)  # zero total, still proportional to P
    Q = P + d * (delta / (0.5 * np.abs(d).sum()))
    counts = rng.multinomial(n, Q, size=400)
    power = np.mean([likelihood_ratio(c, P).p_value < alpha for c in counts])
    assert 0.85 <= power, power


def test_tv_interval_covers_a_known_distortion():
    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(27))
    Q = 0.9 * P + 0.1 * rng.dirichlet(np.ones(27))
    true = 0.5 * np.abs(P - Q).sum()
    covered = 0
    for _ in range(50):
        halves = rng.multinomial(5000, Q, size=2)
        _, lo, hi = tv_interval(halves, P)
        covered += lo <= true <= hi
    assert covered >= 48


# ----------------------------------------------------------------- end to end: no false alarms
LOSSLESS = [
    ("token", 1, True), ("kseq", 2, True), ("rrs", 2, True), ("rrs", 2, False),
    ("optimal", 2, True), ("gumbel", 1, True), ("minhash", 1, True),
]


@pytest.mark.slow
@pytest.mark.parametrize("rule,k,replacement", LOSSLESS)
def test_every_lossless_rule_passes(rule, k, replacement):
    """Sampled at the default gammas and id space (the exact mode proves the same rules at
    gamma 2 in tests/test_conformance.py); seed per rule, so the rules see different pairs."""
    seed = 1 + LOSSLESS.index((rule, k, replacement))
    report = check_verifier(from_rule(rule, replacement=replacement), k=k,
                            replacement=replacement, draws=2_000, seed=seed, length=5)
    assert report.ok, report.table()


# ------------------------------------------------------------------------------ power
class Smoothed:
    """Speculative sampling told a smoothed draft law (1 - eps) q + eps / V: ratios and
    residuals slightly off everywhere; its worst sequence-level TV is about ``eps / 2``."""

    def __init__(self, eps: float):
        self.eps, self.name = eps, f"smoothed q (eps={eps})"

    def told(self, q):
        return (1.0 - self.eps) * q + self.eps / q.shape[-1]

    def law(self, drafts, p, q):
        x, P, R = drafts[0], p[0], self.told(q[0])
        g = x.size
        a = np.minimum(1.0, P[np.arange(g), x] / R[np.arange(g), x])
        tau = np.concatenate([[1.0], np.cumprod(a)]) * np.append(1.0 - a, 1.0)
        nxt = [np.maximum(P[i] - R[i], 0.0) for i in range(g)]
        nxt = [d / d.sum() if d.sum() > 0 else P[i] for i, d in enumerate(nxt)]
        return chain_law(x, tau, np.vstack(nxt + [P[g]]))

    def __call__(self, drafts, p, q, rng):
        x, P, R = drafts[0], p[0], self.told(q[0])
        for i in range(x.size):
            if not rng.random() * R[i, x[i]] < P[i, x[i]]:
                d = np.maximum(P[i] - R[i], 0.0)
                return np.append(x[:i], rng.choice(d.size, p=d / d.sum()))
        return np.append(x, rng.choice(P.shape[-1], p=P[-1]))


class NoResidual:
    """Resamples from p (not the residual) after a rejection: RULES' negative control."""

    name = "token, no residual"

    def __call__(self, drafts, p, q, rng):
        x, P, Q = drafts[0], p[0], q[0]
        for i in range(x.size):
            if not rng.random() * Q[i, x[i]] < P[i, x[i]]:
                return np.append(x[:i], rng.choice(P.shape[-1], p=P[i]))
        return np.append(x, rng.choice(P.shape[-1], p=P[-1]))


def test_subtle_verifier_has_sequence_tv_about_one_percent():
    report = check_verifier(Smoothed(0.02), exact=True, gamma=2, id_space=None)
    assert not report.ok
    assert 0.008 <= report.tv <= 0.015, report.table()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_subtle_verifier_fails_at_default_draws(seed):
    report = check_verifier(Smoothed(0.02), seed=seed, gamma=2, id_space=None)
    assert not report.ok, report.table()


@pytest.mark.parametrize("verify", [NoResidual(), Smoothed(0.1)], ids=lambda v: v.name)
def test_broken_verifiers_fail(verify):
    """A blatantly broken verifier fails at an early reading of its first failing pair: the
    check stops there, with fewer loops than asked."""
    report = check_verifier(verify, draws=3_000, seed=5, gamma=2)
    assert not report.ok, report.table()
    assert report.p_value < report.alpha
    assert sum(r.draws for r in report.pairs) < 3_000 * 6


def test_the_sequential_reading_keeps_its_false_positive_rate_and_stops_early():
    """The readings split each pair's level (half at the last): a lossless verifier passes at
    every seed tried and runs every loop; a lossy one stops within the first readings; the
    readings fall on whole batches."""
    from coupling.conformance import from_rule
    from coupling.conformance.check import looks
    from coupling.conformance.museum import ArgmaxVerifier

    assert looks(20_000) == [1024, 2304, 4864, 9984, 20_000] and looks(100) == [100]
    for seed in range(3):
        ok = check_verifier(from_rule("token"), draws=2_000, seed=seed, gamma=2)
        assert ok.ok and all(r.draws == 2_000 for r in ok.pairs), ok.table()
    bad = check_verifier(ArgmaxVerifier(), seed=0, gamma=2)
    assert not bad.ok and bad.pairs[0].draws == looks(20_000)[0] and len(bad.pairs) == 1
    assert "stopped after 1 of 6 pairs" in bad.test
