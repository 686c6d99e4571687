"""``kseq``: SpecTr's k-sequential selection and its ratio rho*."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coupling import RULES, check_pair, solve_coupling
from coupling.rules import kseq
from coupling.rules.kseq import rho as rho_mod
from coupling.rules.kseq.rho import validity_margin
from tests.strategies import rule_pairs

KSEQ = RULES["kseq"]


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs(), k=st.sampled_from([1, 2, 3]))
def test_acceptance_is_at_least_1_minus_1_over_e_of_the_optimum(pq, k):
    """Sun et al.'s guarantee: K-SEQ accepts at least (1 - 1/e) of the LP optimum."""
    p, q = pq
    opt = solve_coupling(p, q, k).acceptance
    assert KSEQ.acceptance(p, q, k) >= (1 - 1 / math.e) * opt - 1e-12


def test_rho_is_smallest_valid():
    rng = np.random.default_rng(3)
    for _ in range(30):
        V = int(rng.integers(3, 9))
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        for k in (2, 3, 5):
            rho = kseq.optimal_rho(p, q, k)
            assert 1.0 <= rho <= k
            res = kseq.residual_law(p, q, k)
            assert res.min() >= 0 and abs(res.sum() - 1) < 1e-12
            if rho > 1.0 + 1e-9:
                # slightly smaller rho: the residual would need negative mass
                r2 = rho * (1 - 1e-7)
                beta = np.minimum(q, p / r2).sum()
                c = (1 - (1 - beta) ** k) / beta
                assert (p - c * np.minimum(q, p / r2)).min() < 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    V=st.sampled_from([2, 3, 5, 12]),
    alpha=st.sampled_from([0.02, 0.1, 0.5, 2.0]),
    k=st.sampled_from([2, 3, 4, 8, 16]),
    mix=st.booleans(),
    binned=st.booleans(),
)
def test_rho_against_high_precision_root(seed, V, alpha, k, mix, binned):
    """``optimal_rho`` against the smallest root of g(rho) = rho beta - 1 + (1 - beta)^k
    bisected at 300 digits on the very float inputs: the acceptance 1 - (1 - beta)^k it
    gives is within 1e-14 of the optimum's, and rho is valid (g >= -1e-15), including
    peaked laws and p close to q (mix), where g is flat. ``binned``: the histogram passes
    narrow the bracket even for these few ratios (``SORT_AT_MOST = 0``), as they do where
    thousands lie inside (1, k)."""
    import mpmath as mp

    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(V, alpha)), rng.dirichlet(np.full(V, alpha))
    if mix:
        q = 0.9 * p + 0.1 * q
    p, q = check_pair(p, q)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rho_mod, "SORT_AT_MOST", 0 if binned else rho_mod.SORT_AT_MOST)
        rho = kseq.optimal_rho(p, q, k)
    with mp.workdps(300):
        P, Q = [mp.mpf(float(x)) for x in p], [mp.mpf(float(x)) for x in q]

        def beta(r):
            return sum(min(b, a / r) for a, b in zip(P, Q, strict=True))

        def g(r):
            b = beta(r)
            return r * b - 1 + (1 - b) ** k

        lo, hi = mp.mpf(1), mp.mpf(k)
        if g(lo) >= 0:
            hi = lo
        for _ in range(110):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if g(mid) >= 0 else (mid, hi)
        acc_opt, acc = 1 - (1 - beta(hi)) ** k, 1 - (1 - beta(mp.mpf(rho))) ** k
        assert float(acc_opt - acc) <= 1e-14, (float(hi), rho)
        # valid: the residual p - c min(q, p / rho) is >= 0. Where a token of p-mass has
        # p/q < rho that is c <= rho, i.e. g >= 0; where none has, it is c <= min p/q (so
        # rho = 1 can be valid, and smallest, although g(1) < 0)
        r = mp.mpf(rho)
        ratios = [a / b for a, b in zip(P, Q, strict=True) if a > 0 and b > 0]
        if any(x < r for x in ratios) or not ratios:
            assert float(g(r)) >= -1e-15
        else:
            assert (1 - (1 - beta(r)) ** k) / beta(r) <= min(ratios), (rho, float(g(r)))


def _dense_laws(V: int, seed: int, clustered: bool = False):
    """Full-support laws as a plain softmax makes them (every token has mass, thousands of
    ratios p/q inside (1, k)); ``clustered``: p = q times one of two constants, so that
    half the ratios are equal and no bin can split them."""
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=3.0, size=V)
    p = np.exp(z - z.max())
    q = p * np.exp(rng.normal(size=V))
    if clustered:
        q = p * np.where(np.arange(V) % 2 == 0, 1.0, 1.5)
    return check_pair(p / p.sum(), q / q.sum())


@pytest.mark.parametrize("clustered", [False, True], ids=["dense", "clustered"])
def test_rho_binned_equals_sorted(monkeypatch, clustered):
    """Where more than ``SORT_AT_MOST`` ratios lie inside (1, k), histogram passes narrow the
    bracket before the sort; the root equals the one from sorting every ratio (to 1e-12,
    summation order), is valid, and 1e-9 less is not. Clustered ratios (half of them equal)
    stay inside whatever the bins: the sort then takes them all."""
    for V, seed in [(3000, 0), (49152, 1)]:
        p, q = _dense_laws(V, seed, clustered)
        for k in (2, 4, 8):
            ratio = p / q
            assert np.count_nonzero((ratio > 1) & (ratio < k)) > rho_mod.SORT_AT_MOST
            binned = kseq.optimal_rho(p, q, k)
            monkeypatch.setattr(rho_mod, "SORT_AT_MOST", V)
            sorted_ = kseq.optimal_rho(p, q, k)
            monkeypatch.undo()
            assert abs(binned - sorted_) <= 1e-12 * sorted_, (V, k, binned, sorted_)
            assert validity_margin(p, q, k, binned) >= 0.0
            if binned > 1.0:
                assert validity_margin(p, q, k, binned * (1 - 1e-9)) < 0.0


def test_rho_large_vocabulary_path():
    """The vectorised breakpoint search (V >= 64) finds the smallest valid rho too."""
    rng = np.random.default_rng(15)
    V = 3000
    z = rng.normal(scale=2.0, size=V)
    p = np.exp(z) / np.exp(z).sum()
    q = np.exp(z + rng.normal(size=V))
    p, q = check_pair(p, q / q.sum())  # the arrays the rule itself sees (renormalised)
    for k in (2, 4, 8):
        rho = kseq.optimal_rho(p, q, k)
        assert 1.0 < rho <= k
        assert validity_margin(p, q, k, rho) >= 0.0
        assert validity_margin(p, q, k, rho * (1 - 1e-9)) < 0.0
        res = kseq.residual_law(p, q, k)
        assert res.min() >= 0.0 and abs(res.sum() - 1.0) < 1e-12
        # output law from the closed-form pieces: c * min(q, p / rho) + (1 - beta)^k * res == p
        beta = np.minimum(q, p / rho).sum()
        c = (1 - (1 - beta) ** k) / beta
        out = c * np.minimum(q, p / rho) + (1 - beta) ** k * res
        assert 0.5 * np.abs(out - p).sum() < 1e-12


@pytest.mark.parametrize("k", [0, -3, 2.9, True])
def test_rho_and_residual_refuse_a_bad_k(k):
    """A k that is not a positive integer is an error, not a rho of 1 (0, -3, True) or a
    truncation (2.9 read as 2)."""
    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    with pytest.raises(ValueError, match="positive integer number of drafts"):
        kseq.optimal_rho(p, q, k)
    with pytest.raises(ValueError, match="positive integer number of drafts"):
        kseq.residual_law(p, q, k)
