"""``rrs``'s batched torch twin: recursive rejection sampling at every node of the draft tree.

With ``m`` survivors at an offset (:mod:`coupling.torch_backend.tree`): target ``r = p``; for
each surviving draft in branch order, accept iff ``u_j q_j(x_j) < r(x_j)``, else
``r <- norm((r - q_j)_+)``; without replacement also ``q_{j+1} = q_j`` with ``x_j`` removed,
renormalised. After all are rejected, draw from ``r``. The same strict tests and inverse-CDF
convention as :func:`coupling.rules.rrs.verify`, in float64 on the normalised laws; each
rejection rewrites only the rows of the requests that rejected, in place.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import StepFn, verify_tree

__all__ = ["verify", "make_step", "judge"]


def _reject(r: torch.Tensor, qc: torch.Tensor, rows: torch.Tensor, xj: torch.Tensor,
            replacement: bool) -> None:
    """The requests ``rows`` rejected their draft ``xj [A]``: in place, their target becomes
    ``norm((r - q)_+)`` and (without replacement) their draft law ``q`` without ``xj``,
    renormalised."""
    d = r.index_select(0, rows)
    qq = qc.index_select(0, rows)
    _renormalise_rows(r, rows, d.sub_(qq).clamp_(min=0.0))
    if not replacement:
        _renormalise_rows(qc, rows, qq.scatter_(1, xj.index_select(0, rows).unsqueeze(1), 0.0))


def _renormalise_rows(law: torch.Tensor, rows: torch.Tensor, d: torch.Tensor) -> None:
    """``law[rows] = d / sum d`` per row, in place. A row of no mass keeps its law: for the
    target, this test accepts with probability 1 and the residual is never used (as in the
    numpy core)."""
    z = d.sum(-1, keepdim=True)
    empty = z <= 0
    d.div_(torch.where(empty, 1.0, z))
    if bool(empty.any()):
        keep = torch.nonzero(~empty.squeeze(1)).squeeze(1)
        rows, d = rows[keep], d[keep]
    law.index_copy_(0, rows, d)


def judge(r: torch.Tensor, qc: torch.Tensor, x: torch.Tensor, alive: torch.Tensor,
          coins: torch.Tensor, u: torch.Tensor, replacement: bool = True) -> torch.Tensor:
    """RRS at one offset: the output token ``[B]``. With one survivor per row it is the token
    rule (the other rules' twins call it so).

    ``r``, ``qc``: float64 ``[B, V]``, each request's normalised target and draft law, rewritten
    in place at each rejection; ``x``, ``alive``, ``coins``: ``[B, k]``, the drafts in branch
    order, which of them survive, their coins; ``u [B]``: the draw after every rejection.
    """
    B, k = x.shape
    decided = torch.zeros(B, dtype=torch.bool, device=x.device)
    y = torch.zeros(B, dtype=torch.int64, device=x.device)
    for j in range(k):  # sequential by definition: each rejection changes the target
        xj = x[:, j]
        rx = r.gather(1, xj.unsqueeze(1)).squeeze(1)
        qx = qc.gather(1, xj.unsqueeze(1)).squeeze(1)
        test = alive[:, j] & ~decided
        acc = test & (coins[:, j] * qx < rx)
        y = torch.where(acc, xj, y)
        decided = decided | acc
        rej = torch.nonzero(test & ~acc).squeeze(1)
        if rej.numel():
            _reject(r, qc, rej, xj, replacement)
    rest = torch.nonzero(~decided).squeeze(1)
    if rest.numel() == 0:
        return y
    return y.index_put((rest,), sample_rows(r.index_select(0, rest), u[rest]))


def make_step(replacement: bool = True) -> StepFn:
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`),
    on the walk's own float64 rows of the normalised laws, which it rewrites in place."""

    def step(p_i, q_i, x, alive, coins, u, i, act):
        return judge(p_i, q_i, x, alive, coins, u, replacement)

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
    return verify_tree(make_step(replacement), drafts, p, q, seeds, positions,
                       replacement=replacement, validate=validate, atol=atol, accept_u=accept_u,
                       sample_u=sample_u, rule="rrs")
