"""``greedy``: the greedy draft law (the k-1 likeliest tokens of q and one draw from the rest)
and the verifier that attains the LP optimum of that law (Hu et al., ICLR 2025)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, check_sampler, tv
from coupling.rules.common import categorical, residual
from coupling.rules.greedy import Greedy, last_draft_law, top_tokens
from coupling.rules.token import verify as token_verify
from tests.strategies import distributions

from .multidraft_helpers import (
    check_exact_laws,
    check_stream_lossless,
    random_pq,
    sampled_stream_pvalue,
    stream_tv,
)

GREEDY = RULES["greedy"]


def _cases():
    rng = np.random.default_rng(3)
    for _ in range(12):
        V = int(rng.integers(2, 8))
        p, q = random_pq(rng, V, 0.5)
        for k in range(1, min(V, 5) + 1):
            yield p, q, k, k == 1
    e = np.eye(4)
    q = np.array([0.4, 0.3, 0.2, 0.1])
    for p in (e[0], e[3], np.array([0, 0, 0.5, 0.5]), q, np.full(4, 0.25)):
        for k in (1, 2, 3, 4):
            yield p, q, k, k == 1
    ties, zeros = np.array([0.3, 0.3, 0.3, 0.1]), np.array([0.5, 0.0, 0.5, 0.0])
    yield np.array([0.1, 0.2, 0.3, 0.4]), ties, 3, False
    yield np.array([0.0, 0.5, 0.0, 0.5]), zeros, 2, False       # disjoint supports


# ----------------------------------------------------------------------------- exact laws
def test_lossless_and_optimal_for_its_draft_law():
    """Exact joint: output law p (TV < 1e-12), rows the greedy law, acceptance = trace = the
    LP optimum over the greedy law (coupling.solve_draft_law), inside its bound."""
    check_exact_laws(GREEDY, list(_cases()), optimal=True)


def test_the_lp_of_its_law_agrees_across_solvers():
    rng = np.random.default_rng(4)
    for _ in range(5):
        p, q = random_pq(rng, 6)
        for k in (2, 3, 4):
            a = GREEDY.acceptance(p, q, k, replacement=False)
            for solver in ("pot", "highs"):
                assert GREEDY.optimum(p, q, k, replacement=False, solver=solver) \
                    == pytest.approx(a, abs=1e-9)


def test_draft_law_rows():
    q = np.array([0.1, 0.4, 0.2, 0.3])
    tuples, probs = GREEDY.draft_law(q, 3, replacement=False)
    assert tuples.tolist() == [[1, 3, 0], [1, 3, 2]]
    assert probs == pytest.approx([1 / 3, 2 / 3], abs=1e-15)
    tuples, probs = GREEDY.draft_law(q, 1)
    assert tuples.ravel().tolist() == [0, 1, 2, 3] and probs == pytest.approx(q, abs=1e-16)


def test_no_draft_law_dominates():
    """Exact values: greedy beats both optima of k draws on a point-mass target and loses to
    them elsewhere (and wins again at k = 3)."""
    p, q = np.array([1.0, 0, 0]), np.array([0.4, 0.3, 0.3])
    assert GREEDY.acceptance(p, q, 2, replacement=False) == 1.0
    assert RULES["optimal"].acceptance(p, q, 2, replacement=False) == pytest.approx(26 / 35)
    assert RULES["optimal"].acceptance(p, q, 2) == pytest.approx(0.64)
    p = np.array([0.3, 0.25, 0.2, 0.15, 0.1])
    q = np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    g2 = GREEDY.acceptance(p, q, 2, replacement=False)
    assert g2 == pytest.approx(0.7, abs=1e-12)
    assert g2 < RULES["optimal"].acceptance(p, q, 2) < RULES["optimal"].acceptance(
        p, q, 2, replacement=False)
    assert GREEDY.acceptance(p, q, 3, replacement=False) > RULES["optimal"].acceptance(p, q, 3)


# ----------------------------------------------------------------------------- the core
def test_verify_on_hand_worked_uniforms():
    """p = (.5, .3, .2), q = (.2, .2, .6), k = 2: T = {2}, g = (.5, .5, 0). Draft 1 is accepted
    iff its coin u[1] < .3/.5; else the residual (p - g)_+ = (0, 0, .2) emits the top token 2.
    The deterministic draft's coin u[0] is not read."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    for u0 in (0.0, 0.5, 0.99):
        assert GREEDY.verify(p, q, [2, 1], [u0, 0.59, 0.5], replacement=False) == 1
        assert GREEDY.verify(p, q, [2, 1], [u0, 0.61, 0.5], replacement=False) == 2
        assert GREEDY.verify(p, q, [2, 0], [u0, 0.999, 0.5], replacement=False) == 0


def test_verify_is_the_token_rule_for_the_last_draft_and_any_tie_break():
    """Given the top set T, the verifier is speculative sampling of x against p with proposal
    g_T, coin for coin, whichever top set a drafter picked among tied tokens: lossless for
    any tie-break that depends on q alone."""
    p, q = np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.3, 0.3, 0.3, 0.1])
    rng = np.random.default_rng(5)
    for drafts in ([0, 1, 2], [0, 1, 3], [1, 2, 0], [2, 0, 3]):
        top = np.array(drafts[:-1])
        g = last_draft_law(q, top)
        for u in rng.random((50, 4)):
            want = token_verify(p, g, drafts[-1], u[2], u[3])
            assert GREEDY.verify(p, q, drafts, u, replacement=False) == want


def test_refuses_drafts_that_are_not_greedy():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    with pytest.raises(ValueError, match="no greedy draft tuple"):
        GREEDY.verify(p, q, [0, 2], [0.5] * 3, replacement=False)
    with pytest.raises(ValueError, match="does not support"):
        GREEDY.acceptance(p, q, 2)                       # i.i.d. drafts: not its law
    with pytest.raises(ValueError, match="cannot draw k=3 distinct"):
        GREEDY.draft_law(np.array([0.5, 0.5, 0.0]), 3, replacement=False)


# ----------------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 6), data=st.data())
def test_acceptance_properties(V, data):
    """At least 1 - TV, equal to it at k = 1, at most 1, non-decreasing in k, and the
    closed form p(T) + sum min(p, g) off T."""
    p, q = data.draw(distributions(V)), data.draw(distributions(V))
    n = np.count_nonzero(q)
    accs = [GREEDY.acceptance(p, q, k, replacement=k == 1) for k in range(1, n + 1)]
    assert accs[0] == pytest.approx(1 - tv(p, q), abs=1e-12)
    assert all(1 - tv(p, q) - 1e-12 <= a <= 1.0 for a in accs)
    assert all(b >= a - 1e-12 for a, b in zip(accs, accs[1:], strict=False))
    for k in range(2, n + 1):
        top = top_tokens(q, k)
        off = np.setdiff1d(np.arange(V), top)
        closed = p[top].sum() + np.minimum(p, last_draft_law(q, top))[off].sum()
        assert accs[k - 1] == pytest.approx(min(1.0, closed), abs=1e-12)


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("k", [2, 3])
def test_sampler_matches_its_joint(k):
    """Chi-square of 20000 (greedy tuple, output) pairs against the exact joint, alpha 1e-3."""
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    assert check_sampler(GREEDY, p, q, k, replacement=False, n=20_000, seed=k).ok


def test_sampled_stream_has_the_target_law():
    """4000 sampled 3-token streams (V = 3, gamma = 2, k = 2 greedy branches) against the exact
    target law: chi-square at alpha 1e-3, fixed seed."""
    assert sampled_stream_pvalue("greedy", 2, False, seed=9) > 1e-3


@pytest.mark.parametrize("k", [2, 3])
def test_stream_law_is_the_target_law(k):
    """Exact law of the first 3 tokens over greedy draft trees equals the target's."""
    check_stream_lossless(GREEDY, k, False)


# ----------------------------------------------------------------------------- negative control
class _LastAgainstQ(Greedy):
    """Broken on purpose: tests the sampled draft against q, forgetting that it was drawn from q
    off the top tokens."""

    name = "greedy_against_q"
    lossless = False

    def _joint(self, p, q, k, replacement):
        tuples, probs = self._draft_law(q, k, replacement)
        r, _ = residual(p, q)
        x = tuples[:, -1]
        a = np.minimum(1.0, p[x] / q[x])
        J = np.outer(probs * (1 - a), r)
        J[np.arange(x.size), x] += probs * a
        return J

    def _verify(self, p, q, drafts, u, replacement):
        x = int(drafts[-1])
        return x if u[-2] * q[x] < p[x] else categorical(residual(p, q)[0], float(u[-1]))


def test_negative_control_fails():
    """Testing the last draft against q is lossy: the exact check, the sampler's chi-square and
    the exact stream law all see it."""
    broken = _LastAgainstQ()
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    r = check_rule(broken, p, q, 2, replacement=False)
    assert not r.lossless and r.output_tv > 0.05, r
    assert not check_sampler(broken, p, q, 2, replacement=False, n=20_000, seed=1,
                             reference=GREEDY).ok
    assert stream_tv(broken, 2, False) > 0.01
