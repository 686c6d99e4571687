"""coupling.testing: the public hypothesis strategies and assert_lossless."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupling import RULES, as_distribution, tuple_law
from coupling.conformance import from_rule
from coupling.conformance.bugs import HF_RAW_Q
from coupling.testing import (
    assert_lossless,
    assert_sampler_matches_law,
    distributions,
    draft_tuples,
    model_pairs,
    pairs,
)


@given(st.integers(1, 8).flatmap(lambda V: distributions(V)))
def test_distributions_are_distributions(p):
    as_distribution(p, atol=1e-12)  # valid to the tightest tolerance
    assert (p >= 0).all() and p.dtype == np.float64


@given(st.integers(2, 6).flatmap(lambda V: distributions(V, kinds=("point",))))
def test_point_masses(p):
    assert (p == 1).sum() == 1 and (p == 0).sum() == p.size - 1


@given(pairs())
def test_every_rule_is_lossless_on_generated_pairs(pq):
    """What the strategies are for: the package's own rules, exactly, on hard pairs."""
    p, q = pq
    for rule in ("token", "rrs"):
        J = RULES[rule].joint(p, q, 1)
        assert np.abs(J.sum(axis=0) - p).max() < 1e-12


@given(pairs(min_size=3, max_size=5), st.integers(1, 3), st.booleans(), st.data())
def test_draft_tuples_have_positive_probability(pq, k, replacement, data):
    _, q = pq
    if not replacement and np.count_nonzero(q) < k:
        with pytest.raises(ValueError, match="distinct"):
            data.draw(draft_tuples(q, k, replacement=False))
        return
    x = data.draw(draft_tuples(q, k, replacement=replacement))
    tuples, probs = tuple_law(q, k, replacement=replacement)
    row = np.flatnonzero((tuples == x).all(axis=1))
    assert row.size == 1 and probs[row[0]] > 0


@given(model_pairs())
def test_model_pairs_are_language_models(pair):
    target, draft = pair
    for ctx in [(), (0,), (1, 0)]:
        assert abs(target(ctx).sum() - 1) < 1e-12 and abs(draft(ctx).sum() - 1) < 1e-12
    assert target(()).size == draft(()).size


def test_assert_lossless_passes_and_fails():
    report = assert_lossless(from_rule("token"), exact=True, gamma=2)
    assert report.ok
    with pytest.raises(AssertionError, match="q-zeros") as info:
        assert_lossless(HF_RAW_Q, exact=True, gamma=2, id_space=None)
    assert "smallest failing case: V=2, gamma=1" in str(info.value)
    assert "reproduce:" in str(info.value)


def test_assert_generation_lossless_passes_and_fails():
    from coupling.conformance.generation import speculative_generate
    from coupling.testing import assert_generation_lossless
    from tests.test_conformance_generation import bonus_from_draft

    assert assert_generation_lossless(speculative_generate, draws=2000).ok
    with pytest.raises(AssertionError, match="generation loop is not lossless"):
        assert_generation_lossless(bonus_from_draft, draws=2000)


def test_assert_sampler_matches_law_catches_a_false_law():
    class Liar:
        """Samples the vLLM bug but states the fix's law."""

        def __init__(self):
            from coupling.conformance.bugs import VLLM_EXAMPLE, VllmSharedNoise

            self.bug, self.fix = VllmSharedNoise(), VllmSharedNoise(fixed=True)
            p, q = VLLM_EXAMPLE
            self.args = (np.array([[2]]), np.stack([[p, p]]), np.stack([[q]]))

        def law(self, drafts, p, q):
            return self.fix.law(drafts, p, q)

        def __call__(self, drafts, p, q, rng):
            return self.bug(drafts, p, q, rng)

    liar = Liar()
    assert_sampler_matches_law(liar.fix, *liar.args, n=5000)
    with pytest.raises(AssertionError, match="disagree"):
        assert_sampler_matches_law(liar, *liar.args, n=20_000)
