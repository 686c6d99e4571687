"""``rrs``'s batched torch twin: recursive rejection sampling at every node of the draft tree.

With ``m`` survivors at an offset (:mod:`coupling.torch_backend.tree`): target ``r = p``; for
each surviving draft in branch order, accept iff ``u_j q_j(x_j) < r(x_j)``, else
``r <- norm((r - q_j)_+)``; without replacement also ``q_{j+1} = q_j`` with ``x_j`` removed,
renormalised. After all are rejected, draw from ``r``. The step is
:func:`coupling.torch_backend.rejection.judge`, which the other multi-draft twins also run for
a lone survivor (the token rule).
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict
from ...torch_backend.rejection import judge
from ...torch_backend.tree import StepFn, verify_tree

__all__ = ["verify", "make_step"]


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
