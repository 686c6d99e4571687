"""``minhash``: the weighted-MinHash dart coupling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from scipy import stats

from coupling import RULES, tv
from coupling.rules import minhash
from tests.strategies import rule_pairs

MINHASH = RULES["minhash"]
P4 = np.array([0.5, 0.2, 0.2, 0.1])
Q4 = np.array([0.1, 0.3, 0.2, 0.4])


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs())
def test_acceptance_within_daliri_bounds(pq):
    p, q = pq
    t = tv(p, q)
    assert (1 - t) / (1 + t) - 1e-12 <= MINHASH.acceptance(p, q) <= 1 - t + 1e-12


def test_exact_rational_value():
    # sum min (1 + |p - q|) / (1 + TV) = (2/3)(4/3) / (4/3) = 2/3
    p = np.array([1 / 3, 2 / 3])
    q = np.array([2 / 3, 1 / 3])
    assert MINHASH.acceptance(p, q) == pytest.approx(2 / 3, abs=1e-15)


def test_darts_match_exact_joint():
    """Literal dart throwing vs the closed-form law (chi-square, false-positive rate 1e-3,
    fixed seed); the collision exceeds sum min / sum max."""
    rng = np.random.default_rng(8)
    n = 20000
    J = minhash.joint(P4, Q4)
    counts = np.zeros_like(J)
    for _ in range(n):
        x, y = minhash.pair(P4, Q4, rng, block=16)
        counts[x, y] += 1
    m = J.ravel() > 0
    assert counts.ravel()[~m].sum() == 0
    stat = ((counts.ravel()[m] - n * J.ravel()[m]) ** 2 / (n * J.ravel()[m])).sum()
    assert stats.chi2.sf(stat, m.sum() - 1) > 1e-3
    smin = np.minimum(P4, Q4).sum() / np.maximum(P4, Q4).sum()
    assert minhash.acceptance(P4, Q4) > smin


@pytest.mark.parametrize("block", [0, -5, 2.5, True])
def test_pair_refuses_a_bad_block(block):
    with pytest.raises(ValueError, match="block must be a positive integer"):
        minhash.pair(np.array([0.5, 0.5]), np.array([0.5, 0.5]), np.random.default_rng(0),
                     block=block)
