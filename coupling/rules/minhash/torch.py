"""``minhash``'s batched torch twin: the weighted-MinHash coupling at every node of the tree.

Given the draft ``x`` the output is drawn from row ``x`` of the exact dart law
(:mod:`coupling.rules.minhash`), ``q_x (p - q)_+ + (q_x - p_x)_+ p`` plus ``min(p_x, q_x)`` at
``x``, by inverse CDF with the emitted-token draw of the offset: the numpy core's arithmetic
(:func:`coupling.rules.minhash.verify`) on ``[B]`` rows at once. With several survivors (the
rule takes one draft) the lowest survivor's draft is judged.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.laws import chunk_rows
from ...torch_backend.tree import first_true, verify_tree

__all__ = ["verify", "step"]


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""
    xs = x.gather(1, first_true(alive).unsqueeze(1))            # [A, 1] the judged draft
    out = torch.empty(xs.shape[0], dtype=torch.int64, device=x.device)
    step = chunk_rows(p_i.shape[-1], p_i.device)   # the dart law's temporaries, a chunk at a time
    for a in range(0, xs.shape[0], step):
        p, q = p_i[a:a + step].to(torch.float64), q_i[a:a + step].to(torch.float64)
        xa = xs[a:a + step]
        px, qx = p.gather(1, xa), q.gather(1, xa)
        row = qx * (p - q).clamp(min=0.0) + (qx - px).clamp(min=0.0) * p
        row = row.scatter_add(1, xa, torch.minimum(px, qx))
        out[a:a + step] = sample_rows(row, u[a:a + step])
    return out


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """The weighted-MinHash coupling along draft branches, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; the coins are not read)."""
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=replacement,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="minhash")
