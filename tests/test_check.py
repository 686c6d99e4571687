"""The validation harness itself: it passes exact rules and catches broken ones."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from coupling import NEGATIVE_CONTROLS, RULES, tuple_law
from coupling.check import RuleReport, check_rule, check_sampler, draw_drafts, trace_mass
from coupling.rules import token as token_mod
from coupling.rules.token import Token

TOKEN_NO_RESIDUAL = NEGATIVE_CONTROLS["token_no_residual"]

P = np.array([0.5, 0.2, 0.2, 0.1])
Q = np.array([0.1, 0.3, 0.2, 0.4])


def test_report_fields_for_token():
    r = check_rule(RULES["token"], P, Q)
    assert isinstance(r, RuleReport) and r.ok
    assert r.acceptance == pytest.approx(0.6, abs=1e-15)
    assert r.optimum == pytest.approx(0.6, abs=1e-12)
    assert r.output_tv < 1e-15 and r.draft_err < 1e-15 and r.acceptance_err < 1e-15


def test_broken_output_law_is_caught():
    r = check_rule(TOKEN_NO_RESIDUAL, P, Q)
    assert not r.lossless and not r.ok


class _WideBound(Token):
    def _bound(self, p, q, k, replacement):
        return 0.0, 1.0


def test_wrong_closed_form_is_caught():
    class BadAcceptance(_WideBound):
        name = "token_bad_acceptance"

        def _acceptance(self, p, q, k, replacement):
            return token_mod.acceptance(p, q) + 1e-6

    r = check_rule(BadAcceptance(), P, Q)
    assert r.lossless and not r.ok and r.acceptance_err > 5e-7


def test_above_optimum_is_caught():
    """A 'rule' claiming more than the LP optimum must fail even if its joint is fine."""

    class TooGood(_WideBound):
        name = "too_good"

        def _acceptance(self, p, q, k, replacement):
            return 0.9

    r = check_rule(TooGood(), P, Q)
    assert not r.within_optimum and not r.ok


def test_out_of_bound_is_caught():
    class BadBound(Token):
        name = "bad_bound"

        def _bound(self, p, q, k, replacement):
            return 0.7, 0.8

    assert not check_rule(BadBound(), P, Q).ok


def test_wrong_draft_marginal_is_caught():
    class BadRows(Token):
        name = "bad_rows"

        def _joint(self, p, q, k, replacement):
            return token_mod.joint(p, p)  # pretends the drafts come from p

    r = check_rule(BadRows(), P, Q)
    assert r.draft_err > 0.1 and not r.ok


def test_trace_mass_counts_repeated_tokens_once():
    tuples = np.array([[0, 0], [0, 1]])
    J = np.array([[0.3, 0.1], [0.2, 0.4]])
    assert trace_mass(J, tuples) == pytest.approx(0.3 + 0.2 + 0.4)


def test_sampler_check_passes_exact_and_fails_broken():
    ok = check_sampler(RULES["token"], P, Q, n=3000, seed=2)
    assert ok.ok and ok.alpha == 1e-3
    bad = check_sampler(TOKEN_NO_RESIDUAL, P, Q, n=3000, seed=2, reference=RULES["token"])
    assert not bad.ok


@pytest.mark.parametrize("rep", [True, False])
def test_draw_drafts_follow_tuple_law(rep):
    rng = np.random.default_rng(4)
    q = np.array([0.5, 0.3, 0.15, 0.05])
    tuples, probs = tuple_law(q, 2, replacement=rep)
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    n = 20000
    counts = np.zeros(len(tuples))
    for _ in range(n):
        counts[index[tuple(int(x) for x in draw_drafts(q, 2, rep, rng))]] += 1
    m = probs > 0
    assert counts[~m].sum() == 0
    stat = ((counts[m] - n * probs[m]) ** 2 / (n * probs[m])).sum()
    assert stats.chi2.sf(stat, m.sum() - 1) > 1e-3


def test_check_sampler_refuses_settings_that_pass_any_rule():
    """n = 0 draws nothing and alpha <= 0 rejects nothing: either would pass the broken
    token_no_residual rule (ok=True)."""
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    for n in (0, -5, 2.5):
        with pytest.raises(ValueError, match="n must be a positive integer"):
            check_sampler(TOKEN_NO_RESIDUAL, p, q, 1, n=n, reference=RULES["token"])
    for alpha in (0.0, -1.0, 1.0):
        with pytest.raises(ValueError, match="alpha must lie in"):
            check_sampler(TOKEN_NO_RESIDUAL, p, q, 1, n=100, alpha=alpha,
                          reference=RULES["token"])
    assert not check_sampler(TOKEN_NO_RESIDUAL, p, q, 1, n=2000,
                             reference=RULES["token"]).ok
