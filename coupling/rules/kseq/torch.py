r"""``kseq``'s batched torch twin: SpecTr k-sequential selection at every node of the draft tree.

With ``m`` survivors at an offset (:mod:`coupling.torch_backend.tree`) and
``rho = rho*(p, q, m)`` (:func:`kseq_rho`), accept the first survivor with
``u_j rho q(x_j) < p(x_j)``; else draw from :math:`(p - c \min(q, p/\rho))_+` with
:math:`c = \sum_{i<m} (1-\beta)^i`. A step needs ``rho`` only when some test could go either
way for ``rho`` in ``[1, m]``, or for the residual; otherwise it is not computed.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import StepFn, first_true, verify_tree
from . import RESIDUAL_ULPS
from . import rho as rho_np

__all__ = ["verify", "step", "kseq_rho", "make_step"]


def kseq_rho(p: torch.Tensor, q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    r"""Smallest :math:`\rho \in [1, m]` whose K-SEQ residual is a distribution, per row:
    ``p, q`` float64 ``[B, V]``, ``m`` int ``[B]`` -> float64 ``[B]``. The root finder of
    :mod:`coupling.rules.kseq.rho`, on torch (:func:`coupling.rules.kseq.rho.torch_ops`)."""
    return rho_np.optimal_rho_rows(p, q, m, rho_np.torch_ops())


def _rows64(p: torch.Tensor, q: torch.Tensor, rows: torch.Tensor):
    """``p[rows], q[rows]`` in float64 (one copy each; no gather when ``rows`` is all)."""
    if rows.numel() != p.shape[0]:
        p, q = p[rows], q[rows]
    return p.to(torch.float64), q.to(torch.float64)


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""
    B, k = x.shape
    m = alive.sum(-1)  # [B] survivors
    px = p_i.gather(1, x).to(torch.float64)  # [B, k] p(x_j), q(x_j)
    qx = q_i.gather(1, x).to(torch.float64)
    # rho is only needed through the tests u rho q(x) < p(x) and the residual. A draft with
    # u m q(x) < p(x) passes, and one with u q(x) >= p(x) fails, for every rho in [1, m]
    # (rounding is monotone): where the first draft not surely failing surely passes, the
    # outcome is known without rho (any rho in [1, m] reproduces it bit for bit)
    open_ = alive & (coins * qx < px)  # [B, k] not surely failing
    sure = alive & (coins * m.unsqueeze(1).to(torch.float64) * qx < px)
    known = sure.gather(1, first_true(open_).unsqueeze(1)).squeeze(1) & open_.any(-1)
    rho = torch.ones(B, dtype=torch.float64, device=x.device)
    rows = torch.nonzero(~known & (m > 1)).squeeze(1)
    if rows.numel():
        rho[rows] = kseq_rho(*_rows64(p_i, q_i, rows), m[rows])
    # the first surviving draft that passes its test (the tests are independent given rho,
    # so all k at once; the same coins and arithmetic as the reference's loop)
    passed = alive & (coins * rho.unsqueeze(1) * qx < px)  # [B, k]
    decided = passed.any(-1)
    y = x.gather(1, first_true(passed).unsqueeze(1)).squeeze(1)
    if bool(decided.all()):
        return y
    rows = torch.nonzero(~decided).squeeze(1)  # every survivor failed: the residual
    p64, q64 = _rows64(p_i, q_i, rows)  # [R, V]
    mr = m[rows]
    low = torch.minimum(q64, p64 / rho[rows].unsqueeze(1))  # [R, V] min(q, p / rho)
    beta = low.sum(-1, keepdim=True)
    c = rho_np.geometric_c_rows(beta, mr.clamp(min=1).to(torch.float64).unsqueeze(1),
                                max(int(mr.max()), 1), rho_np.torch_ops())
    # exact zeros of the residual come out as +-1e-17: within 64 ulps of p(x) they count as 0,
    # as in coupling.rules.kseq.residual_at (the two backends then agree on the support); the
    # selection is a product with the mask (exact on finite rows; on the CPU a torch.where
    # over the rows costs about 10x more)
    r = low.mul_(-c).add_(p64)  # p - c min(q, p / rho)
    r.mul_(r > (RESIDUAL_ULPS * torch.finfo(torch.float64).eps) * p64)
    if bool((beta <= 0).any()):  # nothing to accept: the residual is p itself
        r = torch.where(beta > 0, r, p64)
    return y.index_put((rows,), sample_rows(r, u[rows], fallback=p64))



def make_step(replacement: bool = True) -> StepFn:
    """The walk's kernel (:data:`coupling.torch_backend.tree.StepFn`): :func:`step`, whatever
    the draft law."""
    return step

def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """SpecTr k-sequential selection over draft trees of i.i.d. branches, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``replacement=False`` is refused)."""
    if not replacement:
        raise ValueError("kseq is defined for i.i.d. drafts only; use replacement=True (or "
                         "rrs/optimal)")
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=True,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="kseq")
