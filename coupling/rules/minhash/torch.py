"""``minhash``'s batched torch twin: the weighted-MinHash coupling at every node of the tree.

Given the draft ``x`` the output is drawn from row ``x`` of the exact dart law
(:mod:`coupling.rules.minhash`), ``q_x (p - q)_+ + (q_x - p_x)_+ p`` plus ``min(p_x, q_x)`` at
``x``, by inverse CDF with the emitted-token draw of the offset: the numpy core's arithmetic
(:func:`coupling.rules.minhash.verify`) on ``[B]`` rows at once. With several survivors (the
rule takes one draft) the lowest survivor's draft is judged.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict, search_cdf
from ...torch_backend.laws import by_row_chunks
from ...torch_backend.tree import StepFn, first_true, verify_tree

__all__ = ["verify", "step", "make_step"]


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule on the unfinished rows (:data:`coupling.torch_backend.tree.StepFn`)."""
    xs = x.gather(1, first_true(alive).unsqueeze(1))            # [A, 1] the judged draft
    # the dart law's float64 temporaries, a chunk of rows at a time
    return by_row_chunks(_dart_draw, p_i.shape[-1], p_i, q_i, xs, u)



def make_step(replacement: bool = True) -> StepFn:
    """The walk's kernel (:data:`coupling.torch_backend.tree.StepFn`): :func:`step`, whatever
    the draft law."""
    return step

def _dart_draw(p_i, q_i, xs, u):
    # the numpy core's terms in its order, on two whole-row temporaries instead of six
    p, q = p_i.to(torch.float64), q_i.to(torch.float64)
    px, qx = p.gather(1, xs), q.gather(1, xs)
    row = torch.sub(p, q).clamp_(min=0.0).mul_(qx)
    row += (qx - px).clamp_(min=0.0) * p
    row.scatter_add_(1, xs, torch.minimum(px, qx))
    return search_cdf(row.cumsum_(-1), u)


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
