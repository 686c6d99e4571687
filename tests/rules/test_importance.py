"""``is``: importance-sampling selection among k i.i.d. drafts, then speculative sampling against
the selected draft's law (Khisti et al.), with the weights p/q (the registry's ``is``) or an
optimal plan's weights; and the paper's Figure 2, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, check_sampler, optimal_acceptance, tv
from coupling.rules.common import categorical, residual
from coupling.rules.importance import ImportanceSampling, induced_law, selection_probs
from coupling.rules.importance.figure2 import PANELS, figure2_curves, figure2_point, panel_laws
from coupling.rules.token import verify as token_verify
from tests.strategies import distributions

from .multidraft_helpers import (
    check_exact_laws,
    check_stream_lossless,
    random_pq,
    sampled_stream_pvalue,
    stream_tv,
)

IS = RULES["is"]
IS_OPT = ImportanceSampling("optimal")


def _cases():
    rng = np.random.default_rng(3)
    for _ in range(8):
        V = int(rng.integers(2, 6))
        p, q = random_pq(rng, V, 0.5)
        for k in (1, 2, 3):
            yield p, q, k, True
    e = np.eye(4)
    q = np.array([0.4, 0.3, 0.2, 0.1])
    for p in (e[0], e[3], np.array([0, 0, 0.5, 0.5]), q):
        yield p, q, 2, True
    yield np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.3, 0.3, 0.3, 0.1]), 2, True
    yield np.array([0.0, 0.5, 0.0, 0.5]), np.array([0.5, 0.0, 0.5, 0.0]), 3, True


def test_weighted_selection_is_lossless_and_within_its_bounds():
    check_exact_laws(IS, list(_cases()), optimal=False)


def test_optimal_selection_attains_the_optimum():
    """Khisti et al.'s canonical decomposition: with an optimal plan's weights, both the
    selected-draft and the membership acceptance equal the LP optimum of k i.i.d. drafts."""
    check_exact_laws(IS_OPT, list(_cases()), optimal=True)
    for p, q, k, _ in _cases():
        opt = optimal_acceptance(p, q, k)
        assert IS_OPT.selected_acceptance(p, q, k) == pytest.approx(opt, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 5), k=st.integers(2, 3), data=st.data())
def test_weighted_selection_beats_token_verification(V, k, data):
    """min(p, q~) >= min(p, q) token by token (derived: Jensen), so the selected draft is
    accepted with probability >= 1 - TV; the membership acceptance is at least that."""
    p, q = data.draw(distributions(V)), data.draw(distributions(V))
    qt = induced_law(p, q, k, "weighted")
    assert qt.sum() == pytest.approx(1.0, abs=1e-12)
    assert (np.minimum(p, qt) >= np.minimum(p, q) - 1e-12).all()
    sel = IS.selected_acceptance(p, q, k)
    assert 1 - tv(p, q) - 1e-12 <= sel <= IS.acceptance(p, q, k) + 1e-12
    assert IS.acceptance(p, q, k) <= optimal_acceptance(p, q, k) + 1e-9


def test_two_draft_closed_form_of_the_induced_law():
    """With k = 2 and w = p/q > 0: q~(y) = 2 p(y) sum_z q(z) / (w(y) + w(z))."""
    p, q = random_pq(np.random.default_rng(8), 6)
    w = p / q
    want = 2 * p * (q[None, :] / (w[:, None] + w[None, :])).sum(1)
    assert induced_law(p, q, 2, "weighted") == pytest.approx(want, abs=1e-14)


def test_k1_is_the_token_rule_coin_for_coin():
    p, q = random_pq(np.random.default_rng(9), 5)
    for u in np.random.default_rng(1).random((200, 2)):
        x = categorical(q, u[0])
        assert IS.verify(p, q, [x], u) == token_verify(p, q, x, u[0], u[1])
    assert IS.acceptance(p, q, 1) == pytest.approx(1 - tv(p, q), abs=1e-15)


def test_uniforms_select_then_accept():
    """p = (.6, .3, .1), q = (.2, .3, .5), drafts (0, 1): weights p/q = (3, 1) select token 0 iff
    u[0] < 3/4; q~ = (.3175, .37, .3125), so the selected token 1 is accepted iff
    u[1] < .3/.37 = .8108; its rejection draws from (p - q~)_+, all on token 0."""
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.3, 0.5])
    assert induced_law(p, q, 2, "weighted") == pytest.approx([0.3175, 0.37, 0.3125], abs=1e-15)
    assert IS.verify(p, q, [0, 1], [0.74, 0.99, 0.5]) == 0        # q~(0) < p(0): always kept
    assert IS.verify(p, q, [0, 1], [0.76, 0.81, 0.5]) == 1
    assert IS.verify(p, q, [0, 1], [0.76, 0.82, 0.5]) == 0


def test_refuses_what_it_does_not_take():
    with pytest.raises(ValueError, match="selection"):
        ImportanceSampling("best")
    with pytest.raises(ValueError, match="does not support"):
        IS.acceptance([0.5, 0.5], [0.5, 0.5], 2, replacement=False)
    with pytest.raises(ValueError, match="enumeration"):
        IS.acceptance(np.full(3000, 1 / 3000), np.full(3000, 1 / 3000), 2)


# ----------------------------------------------------------------------------- Figure 2
@pytest.mark.parametrize("target, panel, q2, want", [
    ("uniform", "left", 1 / 9, (0.87654, 0.83745, 0.84480, 0.82435, 0.80247)),
    ("uniform", "left", 1 / 4, (1.0, 0.95461, 0.96408, 0.96406, 0.93750)),
    ("uniform", "right", 1 / 6, (0.88889, 0.80000, 0.81667, 0.81142, 0.77778)),
    ("uniform", "right", 5 / 12, (0.97222, 0.89286, 0.90385, 0.88889, 0.86111)),
    ("varied", "left", 0.0, (0.88889, 0.81481, 0.82828, 0.81142, 0.77778)),
    ("varied", "right", 5 / 12, (1.0, 0.92857, 0.94762, 0.96248, 0.94444)),
])
def test_figure2_points(target, panel, q2, want):
    c = figure2_point(panel, q2, target=target)
    got = (c["optimal"], c["is weighted, selected"], c["is weighted"], c["kseq"], c["rrs"])
    assert got == pytest.approx(want, abs=5e-6)
    assert c["is optimal selection"] == pytest.approx(c["optimal"], abs=1e-12)


@pytest.mark.parametrize("target, panel, lo, hi", [
    ("uniform", "left", 1 - np.sqrt(2 / 3), np.sqrt(2 / 3) - 1 / 3),
    ("uniform", "right", None, None),
    ("varied", "left", 1 / 9, 5 / 9),
    ("varied", "right", 5 / 18, 5 / 9),
])
def test_figure2_regions_of_acceptance_one(target, panel, lo, hi):
    """Where the optimum is 1: the intervals derived from the min cut (figure2's docstring).
    Every rule stays at or below it; the three practical ones reach 1 only at p = q."""
    xs = np.linspace(0.0, PANELS[panel][1], 241)
    c = figure2_curves(panel, xs, target=target)
    one = c["optimal"] > 1 - 1e-12
    if lo is None:
        assert not one.any()
    else:
        assert (one == ((xs >= lo - 1e-12) & (xs <= hi + 1e-12))).all()
    for name in ("is weighted", "is weighted, selected", "kseq", "rrs"):
        assert (c[name] <= c["optimal"] + 1e-9).all()
        for x in xs[c[name] > 1 - 1e-12]:
            p, q = panel_laws(panel, float(x), target=target)
            assert np.allclose(p, q)


# ----------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("rule", [IS, IS_OPT], ids=["weighted", "optimal"])
@pytest.mark.parametrize("k", [2, 3])
def test_sampler_matches_its_joint(rule, k):
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    assert check_sampler(rule, p, q, k, n=20_000, seed=k).ok


def test_sampled_stream_has_the_target_law():
    """4000 sampled 3-token streams (V = 3, gamma = 2, k = 2 i.i.d. branches) against the exact
    target law: chi-square at alpha 1e-3, fixed seed."""
    assert sampled_stream_pvalue("is", 2, True, seed=11) > 1e-3


@pytest.mark.parametrize("rule, k", [(IS, 2), (IS, 3), (IS_OPT, 2)])
def test_stream_law_is_the_target_law(rule, k):
    check_stream_lossless(rule, k, True)


# ----------------------------------------------------------------------------- negative control
class _AgainstQ(ImportanceSampling):
    """Broken on purpose: tests the selected draft against q instead of its own law q~."""

    name = "is_against_q"
    lossless = False

    def _joint(self, p, q, k, replacement):
        tuples, probs = self._draft_law(q, k, replacement)
        mass = probs[:, None] * selection_probs(p, q, k, self.selection)
        a = np.minimum(1.0, p / q)[tuples]
        J = np.outer((mass * (1 - a)).sum(1), residual(p, q)[0])
        np.add.at(J, (np.arange(len(tuples))[:, None], tuples), mass * a)
        return J

    def _verify(self, p, q, drafts, u, replacement):
        k = drafts.size
        row = np.ravel_multi_index(tuple(drafts), (p.size,) * k)
        y = int(drafts[categorical(selection_probs(p, q, k, self.selection)[row], float(u[0]))])
        return token_verify(p, q, y, float(u[k - 1]), float(u[k]))


def test_negative_control_fails():
    broken = _AgainstQ()
    p, q = np.array([0.3, 0.25, 0.2, 0.15, 0.1]), np.array([0.05, 0.1, 0.15, 0.3, 0.4])
    r = check_rule(broken, p, q, 2)
    assert not r.lossless and r.output_tv > 0.02, r
    assert not check_sampler(broken, p, q, 2, n=20_000, seed=1, reference=IS).ok
    assert stream_tv(broken, 2, True) > 0.005
