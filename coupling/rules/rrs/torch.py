"""``rrs``'s batched torch twin: recursive rejection sampling at every node of the draft tree.

With ``m`` survivors at an offset (:mod:`coupling.torch_backend.tree`): target ``r = p``; for
each surviving draft in branch order, accept iff ``u_j q_j(x_j) < r(x_j)``, else
``r <- norm((r - q_j)_+)``; without replacement also ``q_{j+1} = q_j`` with ``x_j`` removed,
renormalised. After all are rejected, draw from ``r``. The same strict tests and inverse-CDF
convention as :func:`coupling.rules.rrs.verify`, in float64.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import StepFn, verify_tree

__all__ = ["verify", "step"]


def step(replacement: bool) -> StepFn:
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""

    def step(p_i, q_i, x, alive, coins, u, i, act):
        B, k = x.shape
        # r (current target) and qc (current draft law) are p and q until the first rejection:
        # their float64 copies [B, V] are made then (a step that accepts at once reads p and
        # q at the draft only)
        r = qc = None
        decided = torch.zeros(B, dtype=torch.bool, device=x.device)
        y = torch.zeros(B, dtype=torch.int64, device=x.device)
        for j in range(k):  # sequential by definition: each rejection changes the target
            xj = x[:, j : j + 1]  # [B, 1]
            rx, qx = ((p_i, q_i) if r is None else (r, qc))
            rx, qx = (v.gather(1, xj).squeeze(1).to(torch.float64) for v in (rx, qx))
            test = alive[:, j] & ~decided
            acc = test & (coins[:, j] * qx < rx)
            y = torch.where(acc, xj.squeeze(1), y)
            decided = decided | acc
            rej = (test & ~acc).unsqueeze(1)
            if not bool(rej.any()):  # nothing rejected: r and q_j stay as they are
                continue
            if r is None:
                r, qc = p_i.to(torch.float64), q_i.to(torch.float64)
            d = (r - qc).clamp_(min=0.0)
            z = d.sum(-1, keepdim=True)
            # z == 0: this step accepts with probability 1, the residual is never used
            r = torch.where(rej & (z > 0), d / torch.where(z > 0, z, 1.0), r)
            if not replacement:
                qn = qc.scatter(1, xj, 0.0)
                zq = qn.sum(-1, keepdim=True)
                qc = torch.where(rej & (zq > 0), qn / torch.where(zq > 0, zq, 1.0), qc)
        if bool(decided.all()):
            return y
        return torch.where(decided, y, sample_rows(p_i if r is None else r, u))

    return step


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """Recursive rejection sampling over draft trees, batched.

    ``drafts [B, k, g]``, ``p [B, k, g+1, V]``, ``q [B, k, g, V]``, ``seeds``/``positions``
    ``[B]``; ``replacement=False``: the k first tokens are distinct (successive sampling) and
    each branch continues as a single chain. ``accept_u [B, g, k]`` / ``sample_u [B, g+1]``
    override the keyed uniforms. Returns a :class:`~coupling.torch_backend.Verdict`.
    """
    return verify_tree(step(replacement), drafts, p, q, seeds, positions,
                       replacement=replacement, validate=validate, atol=atol, accept_u=accept_u,
                       sample_u=sample_u, rule="rrs")
