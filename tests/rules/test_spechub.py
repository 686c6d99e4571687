"""``spechub``: two drafts, one of them the hub (the likeliest draft token), verified by a staged
fill of the transport plan (Sun et al., EMNLP 2024)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, check_sampler, tv
from coupling.rules.common import categorical
from coupling.rules.spechub import SpecHub, hub_plan
from coupling.rules.spechub import joint as hub_joint
from tests.strategies import distributions

from .multidraft_helpers import (
    check_exact_laws,
    check_stream_lossless,
    random_pq,
    sampled_stream_pvalue,
    stream_tv,
)

HUB = RULES["spechub"]


def _cases():
    rng = np.random.default_rng(3)
    for _ in range(15):
        V = int(rng.integers(2, 8))
        p, q = random_pq(rng, V, 0.5)
        yield p, q, 2, False
        yield p, q, 1, True
    e = np.eye(4)
    q = np.array([0.4, 0.3, 0.2, 0.1])
    for p in (e[0], e[3], np.array([0, 0, 0.5, 0.5]), q, np.full(4, 0.25)):
        yield p, q, 2, False
    yield np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.3, 0.3, 0.3, 0.1]), 2, False   # tied hub
    yield np.array([0.0, 0.5, 0.0, 0.5]), np.array([0.5, 0.0, 0.5, 0.0]), 2, False   # disjoint
    yield np.array([0.3, 0.7]), np.array([0.9, 0.1]), 2, False                         # V = 2


def test_lossless_and_optimal_for_its_draft_law():
    """Exact joint: output law p, rows the hub pair law, acceptance = trace = the LP optimum
    over the hub law, inside its bound."""
    check_exact_laws(HUB, list(_cases()), optimal=True)


def test_draft_law_rows():
    q = np.array([0.1, 0.5, 0.4])
    tuples, probs = HUB.draft_law(q, 2, replacement=False)
    assert tuples.tolist() == [[0, 1], [1, 0], [1, 2], [2, 1]]
    assert probs == pytest.approx([0.1, 0.5 * 0.2, 0.5 * 0.8, 0.4], abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(V=st.integers(2, 6), data=st.data())
def test_its_acceptance_is_greedy_at_k2_and_at_least_one_minus_tv(V, data):
    """The hub set law is the greedy k = 2 set law, so both rules attain the same optimum; and
    the closed form min(1, p_a + sum min(p_i, q_i / (1 - q_a))) >= 1 - TV."""
    p, q = data.draw(distributions(V)), data.draw(distributions(V))
    if np.count_nonzero(q) < 2:
        return
    a = HUB.acceptance(p, q, 2, replacement=False)
    assert a == pytest.approx(RULES["greedy"].acceptance(p, q, 2, replacement=False), abs=1e-14)
    assert 1 - tv(p, q) - 1e-12 <= a <= 1.0
    J = hub_joint(p, q)
    assert np.abs(J.sum(0) - p).max() < 1e-12


def test_no_provable_acceleration_over_rrs_on_every_pair():
    """Exact counterexample: the hub is drafted every time but p puts no mass there."""
    p, q = np.array([0.0, 0.0, 1.0]), np.array([0.4, 0.4, 0.2])
    assert HUB.acceptance(p, q, 2, replacement=False) == pytest.approx(1 / 3)
    assert RULES["rrs"].acceptance(p, q, 2) == pytest.approx(0.36)
    assert RULES["rrs"].acceptance(p, q, 2, replacement=False) == pytest.approx(0.4667, abs=1e-4)


def test_verify_on_hand_worked_uniforms():
    """p = (.1, .2, .7), q = (.5, .3, .2): hub 0, c = (0, .3, .2), L1 = .1 (row (1, 0)),
    p' = (0, 0, .5), L2 = .3 + 0 = .3 ((0, 1) keeps .3, (0, 2) sends .2 to 2), p'_a = 0."""
    p, q = np.array([0.1, 0.2, 0.7]), np.array([0.5, 0.3, 0.2])
    P = hub_plan(p, q)
    assert (P.hub, P.L1, P.L2, P.pa1) == (0, pytest.approx(0.1), pytest.approx(0.3), 0.0)
    assert HUB.verify(p, q, [1, 0], [0.6, 0.9, 0.5], replacement=False) == 1  # .6 * .3 < .2
    assert HUB.verify(p, q, [0, 2], [0.9, 0.99, 0.5], replacement=False) == 2  # .99 * .2 < .5
    # row (0, 1): token 1 has p' = 0, so it is never accepted there; the hub then gets
    # p_a / L2 = 1/3 of the row
    assert HUB.verify(p, q, [0, 1], [0.3, 0.0, 0.5], replacement=False) == 0
    assert HUB.verify(p, q, [0, 1], [0.4, 0.0, 0.5], replacement=False) == 2


def test_refuses_what_is_not_a_hub_pair():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    with pytest.raises(ValueError, match="no hub pair"):
        HUB.verify(p, q, [0, 1], [0.5] * 3, replacement=False)
    with pytest.raises(ValueError, match="k <= 2"):
        HUB.acceptance(p, q, 3, replacement=False)
    with pytest.raises(ValueError, match="does not support"):
        HUB.acceptance(p, q, 2)


# ----------------------------------------------------------------------------- statistics
def test_sampler_matches_its_joint():
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    assert check_sampler(HUB, p, q, 2, replacement=False, n=20_000, seed=2).ok


def test_sampled_stream_has_the_target_law():
    """4000 sampled 3-token streams (V = 3, gamma = 2, hub pairs at every call) against the exact
    target law: chi-square at alpha 1e-3, fixed seed."""
    assert sampled_stream_pvalue("spechub", 2, False, seed=10) > 1e-3


def test_stream_law_is_the_target_law():
    check_stream_lossless(HUB, 2, False)


# ----------------------------------------------------------------------------- negative control
class _StageTwoAgainstP(SpecHub):
    """Broken on purpose: stage 2 tests the non-hub draft against p_i, not against what stage 1
    left of it, p'_i = (p_i - q_i)_+."""

    name = "spechub_stage_two_against_p"
    lossless = False

    def _joint(self, p, q, k, replacement):
        J = hub_joint(p, q)
        tuples, probs = self._draft_law(q, k, replacement)
        P = hub_plan(p, q)
        for t, (x1, x2) in enumerate(tuples):
            if x1 == P.hub:                    # row (a, i): accept i w.p. min(1, p_i / c_i)
                a = min(1.0, p[x2] / P.c[x2])
                J[t] = probs[t] * (1 - a) * P.resid
                J[t, x2] += probs[t] * a
        return J

    def _verify(self, p, q, drafts, u, replacement):
        P = hub_plan(p, q)
        x1, x2 = int(drafts[0]), int(drafts[1])
        if x1 == P.hub:
            return x2 if u[1] * P.c[x2] < p[x2] else categorical(P.resid, float(u[2]))
        return super()._verify(p, q, drafts, u, replacement)


def test_negative_control_fails():
    broken = _StageTwoAgainstP()
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    r = check_rule(broken, p, q, 2, replacement=False)
    assert not r.lossless and r.output_tv > 0.01, r
    assert not check_sampler(broken, p, q, 2, replacement=False, n=20_000, seed=1,
                             reference=HUB).ok
    assert stream_tv(broken, 2, False) > 0.005
