"""The three published bugs: exact laws against their mechanisms, flagged; the fixes pass."""

from __future__ import annotations

import numpy as np
import pytest

from coupling.conformance import check_verifier
from coupling.conformance.bugs import (
    REPRODUCTIONS,
    VLLM_EXAMPLE,
    product_test_law,
    shared_noise_residual,
    vllm_example_law,
)
from coupling.testing import assert_sampler_matches_law

ALL = [v for pair in REPRODUCTIONS.values() for v in pair]


def test_vllm_three_token_example_is_63_27_10():
    p, q = VLLM_EXAMPLE
    assert np.abs(vllm_example_law() - [0.63, 0.27, 0.10]).max() < 1e-15
    # the residual draw after rejecting token 2: (0.35, 0.05) / 0.4 = (0.875, 0.125) intended,
    # (0.95, 0.05) on the draft's noise
    assert np.abs(shared_noise_residual(p, q, 2) - [0.95, 0.05, 0.0]).max() < 1e-15


def test_shared_noise_is_harmless_when_the_residual_is_proportional_to_q():
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.1, 0.7])  # (p - q)_+ = 2 q on {0, 1}
    assert np.abs(vllm_example_law(p, q) - p).max() < 1e-15


@pytest.mark.parametrize("seed", range(4))
def test_shared_noise_residual_matches_the_race(seed):
    rng = np.random.default_rng(seed)
    V, n = 5, 400_000
    p = rng.dirichlet(np.ones(V))
    q = rng.dirichlet(np.ones(V))
    q[rng.integers(V)] = 0.0
    q /= q.sum()
    d = np.maximum(p - q, 0.0)
    E = rng.exponential(size=(n, V))
    with np.errstate(divide="ignore"):
        x = np.argmin(np.where(q > 0, E / q, np.inf), axis=1)
        y = np.argmin(np.where(d > 0, E / d, np.inf), axis=1)
    for t in np.flatnonzero(q > p):
        sel = y[x == t]
        freq = np.bincount(sel, minlength=V) / sel.size
        law = shared_noise_residual(p, q, int(t))
        se = np.sqrt(law * (1 - law) / sel.size) + 1e-12
        assert (np.abs(freq - law) <= 5 * se + 1e-4).all(), (t, freq, law)


@pytest.mark.parametrize("g", [1, 2, 3, 5])
def test_product_test_law_matches_products_of_uniforms(g):
    rng = np.random.default_rng(g)
    a = rng.uniform(0.2, 1.0, size=g)
    a[rng.integers(g)] = 1.0
    law = product_test_law(a)
    assert abs(law.sum() - 1) < 1e-12
    if g == 2:
        t = a.prod()
        assert abs(law[2] - t * (1 - np.log(t))) < 1e-14
    n = 400_000
    hits = np.cumprod(rng.random((n, g)), axis=1) < np.cumprod(a)
    last = np.where(hits.any(axis=1), g - np.argmax(hits[:, ::-1], axis=1), 0)
    freq = np.bincount(last, minlength=g + 1) / n
    assert np.abs(freq - law).max() < 5 * np.sqrt(0.25 / n)


def test_product_test_stops_before_a_zero_ratio():
    law = product_test_law(np.array([0.5, 0.0, 1.0]))
    assert law[2] == law[3] == 0.0 and abs(law[:2].sum() - 1) < 1e-12


@pytest.mark.parametrize("verify", ALL, ids=lambda v: v.name)
def test_reproductions_sample_their_exact_law(verify):
    rng = np.random.default_rng(5)
    V, g = 3, 3
    p = rng.dirichlet(np.full(V, 0.7), size=(1, g + 1))
    q = rng.dirichlet(np.full(V, 0.7), size=(1, g))
    q[0, 1] = [0.5, 0.5, 0.0]  # a top-k row, so the transformers bug shows
    drafts = np.array([[int(np.argmax(q[0, 0])), 0, int(np.argmax(q[0, 2]))]])
    assert abs(sum(verify.law(drafts, p, q).values()) - 1) < 1e-12
    assert_sampler_matches_law(verify, drafts, p, q, n=40_000, seed=6)


@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_bugs_are_flagged_exactly_and_fixes_pass(name):
    bug, fix = REPRODUCTIONS[name]
    bad = check_verifier(bug, exact=True, gamma=2)
    good = check_verifier(fix, exact=True, gamma=2)
    assert not bad.ok and bad.tv > 0.03, bad.table()
    assert good.ok and good.tv < 1e-12, good.table()


def test_transformers_bug_needs_zeros_in_q():
    """With full-support drafts the raw and processed laws agree: only q-zeros shows it. (In
    a larger id space every id outside the pair's tokens is a zero of q, so every pair does.)"""
    report = check_verifier(REPRODUCTIONS["hf_raw_q"][0], exact=True, gamma=2, id_space=None)
    assert [r.name for r in report.pairs if r.tv > 1e-12] == ["q-zeros"]
    report = check_verifier(REPRODUCTIONS["hf_raw_q"][0], exact=True, gamma=2)
    lossy = {r.name for r in report.pairs if r.tv > 1e-12}
    assert "q-zeros" in lossy and len(lossy) > 1, report.table()


def test_reproductions_verify_one_branch():
    """A reproduction refuses two branches; the check reports the refusal as the verifier's
    own failure, with its message and the input it refused."""
    from coupling.conformance import VerifierRaised

    with pytest.raises(VerifierRaised, match="k=1") as err:
        check_verifier(REPRODUCTIONS["vllm_shared_noise"][0], k=2, exact=True, gamma=2)
    assert isinstance(err.value.__cause__, ValueError) and err.value.drafts.shape == (2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_bugs_fail_and_fixes_pass_the_statistical_check(name):
    bug, fix = REPRODUCTIONS[name]
    assert not check_verifier(bug, draws=10_000, gamma=2, id_space=None).ok
    report = check_verifier(fix, draws=10_000, gamma=2, id_space=None)
    assert report.ok, report.table()
