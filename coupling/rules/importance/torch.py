"""``is``'s batched torch twin: importance-sampling selection, then speculative sampling, at every
node of the draft tree.

With ``m`` survivors at an offset (i.i.d. drafts from ``q_i``) the twin forms the selected
draft's law :math:`\\tilde q` exactly, by enumerating the ``V**m`` tuples of the survivors' law
(``[rows, V**m, m]`` tensors, in chunks of rows), selects a survivor with the first survivor's
coin, tests it with the last survivor's coin against :math:`\\tilde q` and draws a rejection
from :math:`(p - \\tilde q)_+`: the numpy core's uniforms and arithmetic
(:func:`coupling.rules.importance.verify`). One survivor is the token rule. The ``"weighted"``
selection is pure torch; the ``"optimal"`` one reads an LP plan, numpy by nature, so those
rows call the numpy core (:func:`coupling.rules.importance.decide`).
"""

from __future__ import annotations

import torch

from ...dist import MAX_TUPLES
from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import StepFn, first_true, verify_tree
from . import SELECTIONS, decide

__all__ = ["verify", "make_step", "weights", "induced"]

#: most tuple entries (rows x V**m) one chunk of the enumeration holds
CHUNK = 1 << 22


def weights(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Selection probabilities ``[R, T, m]`` proportional to ``p/q`` at the drafts ``x [R, T, m]``
    (``p, q [R, V]`` float64), uniform where every weight is 0; in logs, as the numpy core."""
    R = x.shape[0]
    flat = x.reshape(R, -1)
    px, qx = p.gather(1, flat).view(x.shape), q.gather(1, flat).view(x.shape)
    pos = (px > 0) & (qx > 0)
    lw = torch.where(pos, px.log() - qx.log(), float("-inf"))
    top = lw.amax(-1, keepdim=True)
    w = (lw - torch.where(top.isfinite(), top, 0.0)).exp()
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, 1.0), 1.0 / x.shape[-1])


def induced(p: torch.Tensor, q: torch.Tensor, m: int) -> torch.Tensor:
    r""":math:`\tilde q` ``[R, V]`` of the weighted selection among ``m`` i.i.d. drafts from each
    row of ``q`` (``p, q [R, V]`` float64): every ``V**m`` tuple enumerated."""
    R, V = p.shape
    if V**m > MAX_TUPLES:
        raise ValueError(f"is: the selected draft's law enumerates V**k = {V}**{m} tuples, above "
                         f"{MAX_TUPLES}; use fewer drafts or a truncated (top-k) vocabulary")
    grids = torch.meshgrid(*[torch.arange(V, device=p.device)] * m, indexing="ij")
    tuples = torch.stack([g.reshape(-1) for g in grids], -1)       # [T, m], tuple_law order
    out = torch.zeros_like(p)
    step_rows = max(1, CHUNK // tuples.numel())
    for lo in range(0, R, step_rows):
        pc, qc = p[lo: lo + step_rows], q[lo: lo + step_rows]
        X = tuples.expand(pc.shape[0], -1, -1)                     # [r, T, m]
        Qx = qc.gather(1, X.reshape(pc.shape[0], -1)).view(X.shape).prod(-1)
        mass = Qx.unsqueeze(-1) * weights(pc, qc, X)               # P(x, J = j)
        out[lo: lo + step_rows] = torch.zeros_like(pc).scatter_add_(
            1, X.reshape(pc.shape[0], -1), mass.reshape(pc.shape[0], -1))
    return out


def _weighted_rows(p, q, x, alive, coins, u, m: int) -> torch.Tensor:
    """Rows with ``m >= 2`` survivors, weighted selection (module doc)."""
    R = x.shape[0]
    rows = torch.arange(R, device=x.device)
    order = torch.argsort((~alive).to(torch.int8), dim=-1, stable=True)[:, :m]
    xs, cs = x.gather(1, order), coins.gather(1, order)            # survivors, branch order
    qt = induced(p, q, m)
    pick = sample_rows(weights(p, q, xs.unsqueeze(1)).squeeze(1), cs[:, 0])
    y = xs[rows, pick]
    accept = cs[:, m - 1] * qt[rows, y] < p[rows, y]
    res = (p - qt).clamp(min=0.0)
    return torch.where(accept | (res.sum(-1) <= 0), y, sample_rows(res, u, fallback=p))


def _numpy_rows(p, q, x, alive, coins, u, selection: str) -> torch.Tensor:
    """Rows verified by the numpy core, one at a time (the optimal selection's LP plan)."""
    P, Q = p.cpu().numpy(), q.cpu().numpy()
    X, A, C, U = x.cpu().numpy(), alive.cpu().numpy(), coins.cpu().numpy(), u.cpu().numpy()
    out = [decide(P[n], Q[n], X[n][A[n]], list(C[n][A[n]]) + [float(U[n])], selection)
           for n in range(X.shape[0])]
    return torch.tensor(out, dtype=torch.int64, device=x.device)


def make_step(replacement: bool = True, selection: str = "weighted") -> StepFn:
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""

    def step(p_i, q_i, x, alive, coins, u, i, act):
        B = x.shape[0]
        rows = torch.arange(B, device=x.device)
        p, q = p_i.to(torch.float64), q_i.to(torch.float64)
        j = first_true(alive)                                      # a lone survivor: token
        xs = x[rows, j]
        res = (p - q).clamp(min=0.0)
        accept = coins[rows, j] * q[rows, xs] < p[rows, xs]
        y = torch.where(accept | (res.sum(-1) <= 0), xs, sample_rows(res, u, fallback=p))
        m = alive.sum(-1)
        for size in torch.unique(m[m >= 2]).tolist():
            r = torch.nonzero(m == size).squeeze(1)
            args = (p[r], q[r], x[r], alive[r], coins[r], u[r])
            y[r] = _weighted_rows(*args, size) if selection == "weighted" \
                else _numpy_rows(*args, selection)
        return y

    return step


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, selection: str = "weighted") -> Verdict:
    """Importance-sampling selection over draft trees of i.i.d. branches, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``replacement=False`` is refused). ``selection``:
    ``"weighted"`` (weights ``p/q``, the registry's ``is``) or ``"optimal"``."""
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
    if not replacement:
        raise ValueError("is selects among i.i.d. drafts; use replacement=True")
    return verify_tree(make_step(True, selection), drafts, p, q, seeds, positions, replacement=True,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="is")
