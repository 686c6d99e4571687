"""``spechub``'s batched torch twin (:mod:`coupling.rules.spechub.torch`) against its numpy core
and its exact law.

* parity where the rest off the hub is subnormal (the numpy core's order of operations);
* exact single-step law: over 100k keyed draws the (hub pair, output) frequencies match
  ``RULES["spechub"].joint`` and the acceptance rate its closed form; a twin that skips the hub
  stage must fail (chi-square at ALPHA = 1e-4, fixed seeds);
* the validation of hub pairs; a lone survivor rejected with no residual draws from p.

Parity with the numpy core (on trees of hub pairs), batch invariance, one branch and CUDA:
``tests/rules/test_twins.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules.spechub.torch import step, verify

from .multidraft_helpers import (
    ALPHA,
    broken_twin,
    check_draft_roots,
    check_single_step_law,
    chi2_pvalue,
    core_verdict,
    random_pq,
    single_step_counts,
    twin_verdict,
)

HUB = RULES["spechub"]


def test_twin_decides_like_the_core_when_the_rest_off_the_hub_is_subnormal():
    """``q_a = 1`` and the rest of ``q`` subnormal: ``c = q_a (q / rest)`` stays finite where
    ``q (q_a / rest)`` overflows to ``inf`` and turns the zeros of ``q`` into NaN."""
    tiny = 2.22507386e-309
    P = np.array([[0.2] * 5, [1.0, 0.0, 0.0, 0.0, 0.0]])
    Q = np.array([[0.0, 1.0, 0.0, tiny, tiny]])
    Pt, Qt = (torch.tensor(P)[None, None].expand(1, 2, 2, 5),
              torch.tensor(Q)[None, None].expand(1, 2, 1, 5))
    for first, coins in itertools.product(([1, 3], [3, 1]), ([0.0, 0.0], [0.5, 0.9])):
        Xt = torch.tensor(first).reshape(1, 2, 1)
        c, u = np.array(coins).reshape(1, 2), np.array([0.3, 0.7])
        assert twin_verdict(HUB, Xt, Pt, Qt, False, seeds=0, positions=0,
                            accept_u=torch.tensor(c)[None], sample_u=torch.tensor(u)[None]) \
            == core_verdict(HUB, Xt, Pt, Qt, c, u, False)


@pytest.mark.parametrize("V", [3, 5])
def test_single_step_joint_law(V):
    p, q = random_pq(np.random.default_rng(12), V, 0.8)
    check_single_step_law(HUB, p, q, 2, False)


@pytest.mark.parametrize("q", [np.array([0.1, 0.4, 0.4, 0.1]), np.array([0.0, 0.3, 0.7]),
                               np.array([0.6, 0.2, 0.15, 0.05])], ids=str)
def test_draft_roots_draw_the_hub_law(q):
    """The hub is the first maximum, as in the draft law."""
    check_draft_roots(HUB, q, 2)


def _no_hub_stage(p_i, q_i, x, alive, coins, u, i, act):
    """Broken on purpose: the non-hub draft alone, by the token rule (no hub stage, no plan)."""
    a = q_i.argmax(-1, keepdim=True)
    keep = alive & (x != a)
    return step(p_i, q_i, x, keep, coins, u, i, act)


def test_single_step_joint_negative_control():
    p, q = random_pq(np.random.default_rng(12), 4, 0.8)
    counts, J, _ = single_step_counts(broken_twin(_no_hub_stage), HUB, p, q, 2, False,
                                      100_000, seed=3)
    assert chi2_pvalue(counts, J) < ALPHA


def test_refuses_what_is_not_a_hub_tree():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    P = torch.full((1, 2, 2, 4), 0.25, dtype=torch.float64)
    Q = q.expand(1, 2, 1, 4)
    with pytest.raises(ValueError, match="no hub pair"):
        verify(torch.tensor([[[2], [1]]]), P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="replacement=False"):
        verify(torch.tensor([[[3], [2]]]), P, Q, seeds=0, positions=0)
    with pytest.raises(ValueError, match="k <= 2"):
        verify(torch.tensor([[[3], [2], [1]]]), P[:, :1].expand(1, 3, 2, 4),
               q.expand(1, 3, 1, 4), seeds=0, positions=0, replacement=False)


def test_a_lone_survivor_rejected_with_no_residual_draws_from_the_target():
    """A lone survivor's test can fail where ``(p - q)_+`` has no mass: ``p`` one ulp below
    ``q`` at the draft and equal elsewhere, both summing to 1 in float64. The twin then draws
    from ``p``, as the numpy core's token rule does, instead of keeping the draft."""
    p = np.array([0.5 - 2.0**-54, 0.25, 0.25])
    q = np.array([0.5, 0.25, 0.25])
    assert p.sum() == 1.0 and np.all(p <= q)
    P = torch.tensor(np.stack([p, p]))[None, None]             # [1, 1, 2, 3]
    Q = torch.tensor(q)[None, None, None]                        # [1, 1, 1, 3]
    X = torch.tensor([[[0]]])
    coins, u = np.array([[1.0 - 2.0**-53]]), np.array([0.9, 0.5])   # coin q(0) == p(0)
    want = core_verdict(HUB, X, P, Q, coins, u, False)
    assert want == (0, 0, 2)                                     # rejected, then p's draw
    assert twin_verdict(HUB, X, P, Q, False, seeds=0, positions=0,
                        accept_u=torch.tensor(coins)[None], sample_u=torch.tensor(u)[None]) \
        == want
