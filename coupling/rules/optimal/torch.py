"""``optimal``'s batched torch twin: the exact optimal coupling at every node of the draft tree.

With one survivor it is the token rule (optimal for one draft), vectorised. With ``m >= 2``
survivors it samples an optimal coupling through the min cut in numpy, one row at a time
(:func:`coupling.rules.optimal.verify`): the drafted set's row of the plan (its closed
forms and LP fallbacks are numpy code by nature, POT), or, for i.i.d. drafts on supports too
wide for the plan, the race through the cut, fed the survivors' coins and the offset's draw.
Without replacement past the plan's size it raises ``ValueError`` rather than approximate
(:data:`coupling.rules.optimal.MAX_PLAN_ENTRIES`).
"""

from __future__ import annotations

import numpy as np
import torch

from ...torch_backend.common import Verdict, check_inputs
from ...torch_backend.rejection import judge
from ...torch_backend.tree import StepFn, first_true, verify_tree
from . import RULE, Optimal
from . import verify as core_verify

__all__ = ["verify", "make_step"]


def make_step(replacement: bool, rule: Optimal = RULE,
         laws: tuple[torch.Tensor, torch.Tensor] | None = None) -> StepFn:
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`).

    ``laws``: the call's ``(p [B, k, g+1, V], q [B, k, g, V])``. Where several plans are
    optimal, laws one ulp apart may sample different ones: given ``laws``, the plan rows are
    read from them and divided by their float64 sums in numpy, the numpy core's arithmetic
    bit for bit (:func:`coupling.lm.check_tree`); without, from the walk's
    normalised rows.
    """
    def step(p_i, q_i, x, alive, coins, u, i, act):
        first = alive & (torch.cumsum(alive, -1) == 1)
        idx = torch.nonzero(alive.sum(-1) >= 2).squeeze(1)
        if idx.numel() == 0:
            return judge(p_i, q_i, x, first, coins, u)     # one draft: the token rule
        # m >= 2 survivors: the draft tuple's row of an exact LP plan (numpy, per row), read
        # before the token step rewrites its rows in place
        P, Q = _plan_laws(p_i, q_i, laws, act, alive, i, idx)
        y = judge(p_i, q_i, x, first, coins, u).clone()
        X, A = x[idx].cpu().numpy(), alive[idx].cpu().numpy()
        C, U = coins[idx].cpu().numpy(), u[idx].cpu().numpy()
        for n, b in enumerate(idx.tolist()):    # the survivors' coins, then the offset's draw
            uu = np.append(C[n][A[n]], U[n])
            y[b] = core_verify(P[n], Q[n], X[n][A[n]], uu,
                                replacement=replacement, sampler=rule.sampler)
        return y

    return step


def _plan_laws(p_i, q_i, laws, act, alive, i: int, idx):
    """The float64 laws ``[M, V]`` of the rows ``idx`` that sample a plan (:func:`step`)."""
    if laws is None:
        return p_i[idx].cpu().numpy(), q_i[idx].cpu().numpy()
    at = (act[idx], first_true(alive[idx]), torch.full_like(idx, i))
    P, Q = (law[at].detach().to(torch.float64).cpu().numpy() for law in laws)
    return P / P.sum(-1, keepdims=True), Q / Q.sum(-1, keepdims=True)


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, rule: Optimal = RULE) -> Verdict:
    """LP-optimal verification over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``rule`` carries the sampler)."""
    # the shapes as the walk reads them (the value checks run once, in verify_tree)
    d, P, Q, _, _ = check_inputs(drafts, p, q, seeds, positions, validate=False, rule="optimal")
    return verify_tree(make_step(replacement, rule, laws=(P, Q)), d, P, Q, seeds, positions,
                       replacement=replacement, validate=validate, atol=atol, accept_u=accept_u,
                       sample_u=sample_u, rule="optimal")
