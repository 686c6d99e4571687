"""``optimal``'s batched torch twin: the exact optimal coupling at every node of the draft tree.

With one survivor it is the token rule (optimal for one draft), vectorised. With ``m >= 2``
survivors it samples an optimal coupling through the min cut in numpy, one row at a time
(:func:`coupling.rules.optimal.verify_tuple`): the drafted set's row of the plan (its closed
forms and LP fallbacks are numpy code by nature, POT), or, for i.i.d. drafts on supports too
wide for the plan, the race through the cut, fed the survivors' coins and the offset's draw.
Without replacement past the plan's size it raises ``ValueError`` rather than approximate
(:data:`coupling.rules.optimal.MAX_PLAN_ENTRIES`).
"""

from __future__ import annotations

import numpy as np
import torch

from ...torch_backend.common import Verdict
from ...torch_backend.tree import StepFn, verify_tree
from ..rrs.torch import step as rrs_step
from . import RULE, Optimal, verify_tuple

__all__ = ["verify", "step"]


def step(replacement: bool, rule: Optimal = RULE) -> StepFn:
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""
    token_step = rrs_step(True)  # with one draft, rrs is exactly the token rule

    def step(p_i, q_i, x, alive, coins, u, i, act):
        y = token_step(p_i, q_i, x, alive & (torch.cumsum(alive, -1) == 1), coins, u, i, act)
        multi = alive.sum(-1) >= 2
        if not bool(multi.any()):
            return y
        # m >= 2 survivors: an exact optimal coupling of their tuple (numpy, per row)
        y = y.clone()
        idx = torch.nonzero(multi).squeeze(1).tolist()
        P = p_i[idx].detach().to(torch.float64).cpu().numpy()
        Q = q_i[idx].detach().to(torch.float64).cpu().numpy()
        # each row divided by its float64 sum, as the numpy core's rows are
        # (coupling.sequence.models.check_tree): where several plans are optimal, laws one ulp
        # apart may sample different ones
        P, Q = P / P.sum(-1, keepdims=True), Q / Q.sum(-1, keepdims=True)
        X, A = x[idx].cpu().numpy(), alive[idx].cpu().numpy()
        C, U = coins[idx].cpu().numpy(), u[idx].cpu().numpy()
        for n, b in enumerate(idx):    # the survivors' coins, then the offset's draw
            uu = np.append(C[n][A[n]], U[n])
            y[b] = verify_tuple(P[n], Q[n], X[n][A[n]], uu,
                                replacement=replacement, sampler=rule.sampler)
        return y

    return step


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, rule: Optimal = RULE) -> Verdict:
    """LP-optimal verification over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``rule`` carries the sampler)."""
    return verify_tree(step(replacement, rule), drafts, p, q, seeds, positions,
                       replacement=replacement, validate=validate, atol=atol, accept_u=accept_u,
                       sample_u=sample_u, rule="optimal")
