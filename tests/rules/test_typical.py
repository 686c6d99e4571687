"""``typical`` (LOSSY): Medusa's typical acceptance, with its exact output law and distortion;
and the accept-set core it shares with ``relaxed`` (:mod:`coupling.rules.acceptset`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, check_sampler, tuple_law, tv
from coupling.lp.solve import optimal_lossy_acceptance
from coupling.rules.common import categorical
from coupling.rules.typical import Typical, threshold
from tests.strategies import rule_pairs

TYPICAL = RULES["typical"]
VARIANTS = [TYPICAL, Typical(fallback="greedy"), Typical(eps=0.3, delta=0.9,
                                                          entropy_offset=1e-5),
            Typical(eps=0.0)]
MODES = [(1, True), (2, True), (3, True), (2, False), (3, False)]
P5 = np.array([0.45, 0.3, 0.15, 0.07, 0.03])
Q5 = np.array([0.1, 0.2, 0.3, 0.25, 0.15])


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs(), mode=st.sampled_from(MODES), which=st.integers(0, len(VARIANTS) - 1))
def test_reported_law_is_the_exact_output_law(pq, mode, which):
    """Closed-form output law == the enumerated joint's columns, acceptance == its trace, <= the
    LP optimum at the same distortion; never reported lossless."""
    p, q = pq
    k, rep = mode
    assume(rep or np.count_nonzero(q) >= k)
    r = check_rule(VARIANTS[which], p, q, k, replacement=rep)
    assert r.ok and not r.lossless, r


def test_labelled_lossy_and_the_lossless_check_fails():
    r = check_rule(TYPICAL, P5, Q5, 2)
    assert not TYPICAL.lossless and not r.lossless and r.output_tv > 0.05
    assert r.distortion == pytest.approx(r.output_tv, abs=1e-15)


def test_threshold_is_medusas():
    H = -float(P5 @ np.log(P5))
    assert threshold(P5) == pytest.approx(min(0.09, 0.3 * math.exp(-H)), rel=1e-15)
    Hc = -float(P5 @ np.log(P5 + 1e-5))
    assert threshold(P5, entropy_offset=1e-5) == pytest.approx(min(0.09, 0.3 * math.exp(-Hc)))


def test_every_token_above_the_threshold_outputs_the_draft():
    """A flat enough target puts every token above min(eps, delta e^-H): one draft is always
    output, so the law is q, the distortion TV(p, q) and the acceptance 1, exactly."""
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.2, 0.6])
    assert (p > threshold(p)).all()
    assert np.allclose(TYPICAL.output_law(p, q), q, atol=1e-16)
    assert TYPICAL.distortion(p, q) == pytest.approx(tv(p, q), abs=1e-15)
    assert TYPICAL.acceptance(p, q) == pytest.approx(1.0, abs=1e-15)


def test_greedy_fallback_on_one_draft_in_closed_form():
    """One draft, greedy fallback: an acceptable draft is output, else the argmax; so
    nu = q on A, plus q(A^c) on the argmax."""
    rule = Typical(fallback="greedy")
    p = np.array([0.55, 0.3, 0.1, 0.05])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    A = p > threshold(p)
    want = np.where(A, q, 0.0)
    want[0] += q[~A].sum()
    assert np.allclose(rule.output_law(p, q), want, atol=1e-15)
    assert rule.acceptance(p, q) == pytest.approx(q[A].sum(), abs=1e-15)


def test_buys_acceptance_above_the_lossless_optimum_at_its_distortion():
    """On flat targets typical accepts more than any lossless rule, and at its own distortion
    an optimal lossy coupling accepts more still (the LP of its information model)."""
    rng = np.random.default_rng(1)
    above = 0
    for _ in range(20):
        p, q = rng.dirichlet(np.full(5, 2.0)), rng.dirichlet(np.full(5, 2.0))
        a, D = TYPICAL.acceptance(p, q), TYPICAL.distortion(p, q)
        best = optimal_lossy_acceptance(p, q, 1, distortion=D)
        assert a <= best + 1e-9
        above += a > RULES["optimal"].acceptance(p, q) + 1e-9
    assert above >= 10


def test_full_vocabulary_closed_forms():
    """V = 49152, i.i.d. drafts: the output law is a law, the threshold is of order delta / V
    on a flat target (almost every draft is acceptable), and the distortion is large."""
    rng = np.random.default_rng(21)
    z = rng.normal(size=49152)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    q = np.exp(np.log(p) + 0.5 * rng.normal(size=p.size))
    q /= q.sum()
    assert threshold(p) < 10 / p.size
    for k in (1, 4):
        nu = TYPICAL.output_law(p, q, k)
        assert abs(nu.sum() - 1) < 1e-12 and nu.min() >= 0
        assert TYPICAL.acceptance(p, q, k) > RULES["optimal"].acceptance(p, q, k)
        assert 0.1 < TYPICAL.distortion(p, q, k) < 1


@pytest.mark.parametrize("k, rep", [(1, True), (2, True), (2, False), (3, True)])
def test_sampler_matches_joint(k, rep):
    assert check_sampler(TYPICAL, P5, Q5, k, replacement=rep, n=20_000, seed=10 + k).ok


class _FirstAcceptable(Typical):
    """Negative control: keeps the *first* acceptable draft (not the likeliest) and falls back
    to p itself."""

    name = "typical_first"

    def _verify(self, p, q, drafts, u, replacement):
        ok = drafts[p[drafts] > self.threshold(p)]
        return int(ok[0]) if ok.size else categorical(p, float(u[drafts.size]))


def test_negative_control_fails_against_the_exact_joint():
    assert not check_sampler(_FirstAcceptable(), P5, Q5, 2, n=20_000, seed=3,
                             reference=TYPICAL).ok


def test_parameters_are_validated():
    for kwargs in ({"eps": -1}, {"delta": float("nan")}, {"entropy_offset": True},
                   {"fallback": "sample"}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            Typical(**kwargs)


def test_joint_rows_are_the_draft_law():
    tuples, probs = tuple_law(Q5, 2, replacement=False)
    J = TYPICAL.joint(P5, Q5, 2, replacement=False)
    assert np.allclose(J.sum(axis=1), probs, atol=1e-16)
