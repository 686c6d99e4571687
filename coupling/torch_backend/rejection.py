"""The rejection step every multi-draft twin shares: recursive rejection sampling at one offset.

With several survivors it is ``rrs``'s step (:mod:`coupling.rules.rrs.torch` walks it); with
one survivor per row it is the token rule, which is how the twins of ``optimal`` and
``spechub`` judge a lone survivor. Target ``r = p``; for each surviving draft in branch order,
accept iff ``u_j q_j(x_j) < r(x_j)``, else ``r <- norm((r - q_j)_+)``; without replacement
also ``q_{j+1} = q_j`` with ``x_j`` removed, renormalised; after all are rejected, draw from
``r``: the strict tests and inverse-CDF convention of :func:`coupling.rules.rrs.verify`, in
float64 on the normalised laws, each rejection rewriting only the rows that rejected.
"""

from __future__ import annotations

import torch

from .common import sample_rows

__all__ = ["judge"]


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
