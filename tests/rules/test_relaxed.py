"""``relaxed`` (LOSSY): top-k candidates within a probability margin of the best, with its
exact output law and distortion."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, check_sampler
from coupling.rules.common import categorical
from coupling.rules.relaxed import Relaxed
from tests.strategies import rule_pairs

RELAXED = RULES["relaxed"]
VARIANTS = [RELAXED, Relaxed(topk=2, delta=0.1), Relaxed(topk=3, delta=0.05,
                                                         fallback="sample"),
            Relaxed(topk=1, delta=0.0)]
MODES = [(1, True), (2, True), (3, True), (2, False), (3, False)]
P5 = np.array([0.45, 0.3, 0.15, 0.07, 0.03])
Q5 = np.array([0.1, 0.2, 0.3, 0.25, 0.15])


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs(), mode=st.sampled_from(MODES), which=st.integers(0, len(VARIANTS) - 1))
def test_reported_law_is_the_exact_output_law(pq, mode, which):
    p, q = pq
    k, rep = mode
    assume(rep or np.count_nonzero(q) >= k)
    r = check_rule(VARIANTS[which], p, q, k, replacement=rep)
    assert r.ok and not r.lossless, r


def test_api_defaults_are_greedy_exact_match():
    """topk = 1, delta = 0: the output is always the argmax, so nu is a point mass, the
    distortion 1 - max p and the acceptance P(argmax drafted) = 1 - (1 - q_max)^k."""
    rule = Relaxed(topk=1, delta=0.0)
    for k in (1, 3):
        assert np.allclose(rule.output_law(P5, Q5, k), np.eye(5)[0], rtol=0, atol=1e-15)
        assert rule.distortion(P5, Q5, k) == pytest.approx(1 - P5.max(), abs=1e-15)
        assert rule.acceptance(P5, Q5, k) == pytest.approx(1 - (1 - Q5[0]) ** k, abs=1e-15)


def test_margin_and_candidates():
    """With delta = 0.2 the candidates within 0.2 of 0.45 are tokens 0 and 1 (0.3), not 2."""
    rule = Relaxed(topk=10, delta=0.2)
    assert rule.accept_set(P5).tolist() == [True, True, False, False, False]
    assert Relaxed(topk=1, delta=1.0).accept_set(P5).tolist() == [True] + [False] * 4
    # tokens of zero probability are never candidates, whatever the margin
    p = np.array([0.5, 0.5, 0.0])
    assert RELAXED.output_law(p, np.array([0.0, 0.0, 1.0]))[2] == 0


def test_greedy_fallback_confines_the_output_to_the_top_k():
    """The distortion is at least 1 - p(top-k) (here topk = 2, tokens 0 and 1)."""
    rule = Relaxed(topk=2, delta=0.6)
    nu = rule.output_law(P5, Q5, 3)
    assert nu[2:].sum() == 0
    assert rule.distortion(P5, Q5, 3) >= 1 - P5[:2].sum() - 1e-15


def test_collapses_a_flat_target():
    rng = np.random.default_rng(21)
    z = rng.normal(size=49152)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    q = np.exp(np.log(p) + 0.5 * rng.normal(size=p.size))
    q /= q.sum()
    assert RELAXED.distortion(p, q, 4) > 0.99


@pytest.mark.parametrize("k, rep", [(1, True), (2, True), (2, False)])
def test_sampler_matches_joint(k, rep):
    rule = Relaxed(topk=3, delta=0.2, fallback="sample")
    assert check_sampler(rule, P5, Q5, k, replacement=rep, n=20_000, seed=20 + k).ok


class _KeepsFirst(Relaxed):
    """Negative control: outputs the first acceptable draft (not the likeliest)."""

    name = "relaxed_first"

    def _verify(self, p, q, drafts, u, replacement):
        ok = drafts[self.accept_set(p)[drafts]]
        return int(ok[0]) if ok.size else categorical(self.fallback_law(p), float(u[-1]))


def test_negative_control_fails_against_the_exact_joint():
    assert not check_sampler(_KeepsFirst(), P5, Q5, 2, n=20_000, seed=3, reference=RELAXED).ok


def test_parameters_are_validated():
    for kwargs, word in (({"topk": 0}, "topk"), ({"topk": 2.5}, "topk"),
                         ({"delta": -0.1}, "delta"), ({"fallback": "typical"}, "fallback")):
        with pytest.raises(ValueError, match=word):
            Relaxed(**kwargs)
