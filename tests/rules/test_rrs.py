"""``rrs``: recursive rejection sampling, with and without replacement."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coupling import RULES, check_rule, tuple_law, tv
from coupling.rules import rrs
from coupling.rules.rrs import RecursiveRejection
from tests.strategies import rule_pairs

RRS = RULES["rrs"]
MODES = [(1, True), (2, True), (3, True), (2, False), (3, False)]


@settings(max_examples=40, deadline=None)
@given(pq=rule_pairs(), mode=st.sampled_from(MODES))
def test_acceptance_is_at_least_one_minus_tv(pq, mode):
    """Its first step is speculative sampling: never below 1 - TV."""
    p, q = pq
    k, rep = mode
    assume(rep or np.count_nonzero(q) >= k)
    assert RRS.acceptance(p, q, k, replacement=rep) >= 1 - tv(p, q) - 1e-12


class _NoRenormalising(RecursiveRejection):
    """Without replacement, keeps testing every draft against ``q`` (not against ``q`` less
    the tokens already drafted)."""

    name = "rrs_no_renorm"
    lossless = False

    def _joint(self, p, q, k, replacement):
        tuples, probs = tuple_law(q, k, replacement=False)
        J = np.zeros((tuples.shape[0], p.size))
        for t, x in enumerate(tuples):
            r, surv = p, probs[t]
            for xi in x:
                a = min(1.0, r[xi] / q[xi])
                J[t, xi] += surv * a
                surv *= 1 - a
                d = np.maximum(r - q, 0)
                r = d / d.sum() if d.sum() > 0 else r
            J[t] += surv * r
        return J


def test_negative_control_without_renormalising():
    """RRS without replacement that keeps testing against q is not lossless; the exact check
    must see it."""
    broken = _NoRenormalising()
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    for k in (2, 3):
        r = check_rule(broken, p, q, k, replacement=False)
        assert not r.lossless and r.output_tv > 0.04, r
        assert check_rule(RRS, p, q, k, replacement=False).ok


def test_without_replacement_k2_fast_path_matches_enumeration():
    rng = np.random.default_rng(13)
    for _ in range(30):
        V = int(rng.integers(2, 8))
        p, q = rng.dirichlet(np.ones(V) * 0.7), rng.dirichlet(np.ones(V) * 0.7)
        fast = rrs.acceptance(p, q, 2, replacement=False)
        slow = 1 - rrs._reject_paths(p, q, q.copy(), 1.0, 2)
        assert abs(fast - slow) < 1e-13
