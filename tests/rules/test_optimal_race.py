"""``optimal``'s race through the min cut (:mod:`coupling.rules.optimal.race`): an exact optimal
sampler for i.i.d. drafts at full vocabulary.

Exhaustive tuple enumeration on small vocabularies (k = 2..4, and 5..8 on V = 3), degenerate
laws, negative controls that must fail, the sampler against its exact joint, consistency at
V = 49152 (loads, residual, acceptance, sampled outputs), the rule's dispatch between plan and
race, and the twin bound to ``Optimal(sampler="race")``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling import RULES, check_rule, check_sampler, stream_law, target_law, tuple_law, tv
from coupling.rules import optimal as opt
from coupling.rules.optimal import Optimal, optimal_acceptance, race_plan, uses_race
from tests.strategies import model_pair, rule_pairs

P5 = np.array([0.45, 0.3, 0.15, 0.07, 0.03])
Q5 = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
RACE = Optimal(sampler="race")
EDGE = [
    (np.array([.25, .25, .25, .25]), np.array([.1, .1, .4, .4])),       # ratio ties
    (np.array([1.0, 0, 0]), np.array([.2, .3, .5])),                    # p one-hot
    (np.array([.2, .3, .5]), np.array([0, 1.0, 0])),                    # q one-hot
    (np.array([.4, .4, .2, 0]), np.array([0, .2, .3, .5])),             # supports differ
    (np.array([.6, .4]), np.array([1e-9, 1 - 1e-9])),                   # tiny q
    (np.array([.3, .7]), np.array([.3, .7])),                           # p == q
    (np.array([.5, .5 - 1e-13, 1e-13]), np.array([1e-300, .5, .5 - 1e-300])),
]


def _softmax_pair(rng, V: int, scale: float, noise: float):
    z = rng.normal(size=V) * scale
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    q = np.exp(np.log(p) + noise * rng.normal(size=V))
    return p, q / q.sum()


# ------------------------------------------------------------------ exact, by enumeration
@settings(max_examples=60, deadline=None)
@given(pq=rule_pairs(max_v=5), k=st.integers(2, 4))
def test_lossless_and_optimal_by_enumeration(pq, k):
    """Every tuple enumerated: the output law is p (TV < 1e-12), the acceptance the LP optimum."""
    p, q = pq
    r = check_rule(RACE, p, q, k)
    assert r.ok and r.lossless, r
    assert abs(r.trace_acceptance - r.optimum) < 1e-12, r


@pytest.mark.parametrize("case", range(len(EDGE)))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_edge_laws(case, k):
    p, q = EDGE[case]
    r = check_rule(RACE, p / p.sum(), q / q.sum(), k)
    assert r.ok and abs(r.trace_acceptance - r.optimum) < 1e-12, r


@pytest.mark.parametrize("k", [5, 6, 8])
def test_up_to_eight_drafts_on_three_tokens(k):
    rng = np.random.default_rng(k)
    for _ in range(4):
        p, q = rng.dirichlet(np.full(3, 0.6)), rng.dirichlet(np.full(3, 0.6))
        J = RACE.joint(p, q, k)
        assert tv(J.sum(axis=0), p) < 1e-12
        tuples, _ = tuple_law(q, k)
        member = np.zeros(J.shape, dtype=bool)
        member[np.arange(len(tuples))[:, None], tuples] = True
        assert abs(J[member].sum() - optimal_acceptance(p, q, k)) < 1e-12


def test_exact_loads_equal_the_joint():
    """The closed-form part-A loads are the enumerated mass each H token is output with."""
    rng = np.random.default_rng(8)
    for _ in range(10):
        p, q = rng.dirichlet(np.full(4, 0.5)), rng.dirichlet(np.full(4, 0.5))
        plan = race_plan(p, q, 3)
        tuples, _ = tuple_law(q, 3)
        J = RACE.joint(p, q, 3)
        hit = plan.in_h[tuples].any(axis=1)
        assert np.abs(np.where(plan.in_h, J[hit].sum(axis=0), 0) - plan.loads_a).max() < 1e-13


# ------------------------------------------------------------------ negative controls
def _broken_joint(plan, p, q, k):
    tuples, probs = tuple_law(q, k)
    return sum(probs[t] * plan.conditional(tuples[t]) for t in np.flatnonzero(probs > 0))


def test_negative_controls_fail_the_exact_check():
    """A residual drawn from p itself, and equal part-A weights (a uniformly chosen H-draft
    wins, overloading tokens of H): both output laws are off p."""
    p, q = np.array([.241, .001, .545, .213]), np.array([.092, .31, .395, .203])
    plan = race_plan(p, q, 3)
    plan.__dict__["residual"] = p.copy()
    assert tv(_broken_joint(plan, p, q, 3), p) > 1e-3
    plan = race_plan(p, q, 3)
    plan.logw_a[np.isfinite(plan.logw_a)] = 0.0
    assert tv(_broken_joint(plan, p, q, 3), p) > 1e-2


class _ResidualFromP(Optimal):
    name = "optimal_race_residual_from_p"

    def _verify(self, p, q, drafts, u, replacement):
        plan = race_plan(p, q, drafts.size)
        plan.__dict__["residual"] = p.copy()
        return plan.verify(drafts, u)


def test_sampler_matches_joint_and_a_broken_one_fails():
    p, q = np.array([.35, .05, .4, .2]), np.array([.1, .45, .15, .3])
    for k in (2, 3):
        assert check_sampler(RACE, p, q, k, n=20_000, seed=k).ok
    assert not check_sampler(_ResidualFromP(sampler="race"), p, q, 3, n=20_000, seed=1,
                             reference=RACE).ok


# ------------------------------------------------------------------ full vocabulary
@pytest.mark.parametrize("k", [2, 4, 8])
def test_full_vocabulary_plan_is_optimal_and_feasible(k):
    """V = 49152 (three laws): the plan's acceptance is the optimum, p - loads >= 0 (the
    residual needs no clipping), part B serves H^c exactly, rejected mass = residual mass."""
    rng = np.random.default_rng(5)
    for scale, noise in ((1.0, 0.5), (2.5, 1.0), (4.0, 2.0)):
        p, q = _softmax_pair(rng, 49152, scale, noise)
        plan = race_plan(p, q, k)
        raw = p - plan.loads_a - plan.loads_b
        assert abs(plan.acceptance - optimal_acceptance(p, q, k)) < 1e-12
        assert raw.min() > -1e-13
        assert np.abs(raw[~plan.in_h]).max(initial=0.0) < 1e-13
        rejected = float(q[~plan.in_h].sum()) ** k - plan.loads_b.sum()
        assert abs(rejected - np.clip(raw, 0, None).sum()) < 1e-12


def test_full_vocabulary_samples_the_target():
    """20000 calls of the registry's rule, k = 4 i.i.d. drafts at V = 49152: outputs ~ p (top
    30 tokens and the rest pooled; chi-square, false-positive rate 1e-3), acceptance within 4
    standard errors of the optimum."""
    rng = np.random.default_rng(5)
    p, q = _softmax_pair(rng, 49152, 2.5, 1.0)
    k, n = 4, 20_000
    drafts = rng.choice(p.size, size=(n, k), p=q)
    u = rng.random((n, k + 1))
    rule = RULES["optimal"]
    ys = np.array([rule.verify(p, q, d, uu) for d, uu in zip(drafts, u, strict=True)])
    top = np.sort(np.argsort(-p)[:30])
    inside = np.isin(ys, top)
    obs = np.append(np.bincount(np.searchsorted(top, ys[inside]), minlength=30), (~inside).sum())
    exp = np.append(p[top], 1 - p[top].sum()) * n
    assert stats.chi2.sf(float(((obs - exp) ** 2 / exp).sum()), 30) > 1e-3
    opt_ = optimal_acceptance(p, q, k)
    acc = np.mean([y in d for y, d in zip(ys, drafts, strict=True)])
    assert abs(acc - opt_) < 4 * np.sqrt(opt_ * (1 - opt_) / n)


# ------------------------------------------------------------------ the rule's dispatch
def test_dispatch_between_plan_and_race():
    assert not uses_race(100, 2, True) and uses_race(200, 2, True) and uses_race(5, 3, True)
    assert not uses_race(10**5, 4, False) and not uses_race(10**5, 1, True)
    assert uses_race(4, 2, True, "race") and not uses_race(10**5, 4, True, "plan")
    with pytest.raises(ValueError, match="sampler"):
        Optimal(sampler="lp")
    rng = np.random.default_rng(0)
    p, q = _softmax_pair(rng, 2000, 2.0, 1.0)
    with pytest.raises(ValueError, match="race"):
        Optimal(sampler="plan").sample(p, q, [1, 2], rng)


def test_plan_and_race_samplers_have_the_same_acceptance_and_output_law():
    """Two optimal couplings (optimal plans are not unique): both lossless at the optimum."""
    for k in (2, 3):
        a, b = (check_rule(Optimal(sampler=s), P5, Q5, k) for s in ("plan", "race"))
        assert a.ok and b.ok and abs(a.trace_acceptance - b.trace_acceptance) < 1e-12


@pytest.mark.parametrize("k, gamma", [(2, 2), (3, 1)])
def test_stream_law_with_the_race_is_the_target_law(k, gamma):
    t, d = model_pair(3, 2, 4, 0.3)
    law = stream_law(RACE, t, d, gamma, 4, k=k, context=(2,))
    assert tv(law, target_law(t, 4, context=(2,))) < 1e-12


@settings(max_examples=20, deadline=None)
@given(pq=rule_pairs(max_v=5), seed=st.integers(0, 2**31))
def test_twin_bound_to_the_race_matches_its_numpy_core(pq, seed):
    """``Optimal(sampler="race").torch`` decides as its numpy core on explicit uniforms."""
    p, q = pq
    assume(np.count_nonzero(q) >= 1)
    rng = np.random.default_rng(seed)
    k, g = 3, 2
    X = np.stack([rng.choice(p.size, size=g, p=q) for _ in range(k)])
    X[1:, 0] = X[0, 0]
    P, Q = np.tile(p, (k, g + 1, 1)), np.tile(q, (k, g, 1))
    coins, u = rng.random((g, k)), rng.random(g + 1)
    want = RACE.verify_block(X, P, Q, coins, u)
    got = RACE.torch.verify(torch.tensor(X)[None], torch.tensor(P)[None],
                            torch.tensor(Q)[None], seeds=0, positions=0,
                            accept_u=torch.tensor(coins)[None], sample_u=torch.tensor(u)[None])
    assert (int(got.accepted[0]), int(got.branch[0]), int(got.next_token[0])) == want
    opt.clear_plan_cache()
