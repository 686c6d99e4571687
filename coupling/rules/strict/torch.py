"""``strict``'s batched torch twin: exact-match verification along draft trees.

At offset ``i`` the target draws its own token ``y_i = sample_rows(p_i, u_i)`` (inverse CDF in
float64) and the survivors are the branches that drafted it; the first offset where none did
emits ``y_i``, and survivors of the whole block get the bonus draw. The draws are keyed by the
absolute position of the token they decide, ``u_i = U(seed, t + i, STREAM_SAMPLE, 0)``
(:func:`coupling.rules.strict.target_uniforms`): the uniform the target reads when it samples
alone, so under one seed the stream is the target's own, whatever the drafter (and whatever
``k``). ``sample_u [B, gamma + 1]`` overrides them (parity tests feed the numpy core the same
numbers); the coins are never read.
"""

from __future__ import annotations

import torch

from ...keyed import STREAM_SAMPLE
from ...torch_backend.common import Verdict, check_inputs, sample_rows
from ...torch_backend.rng import keyed_uniforms
from ...torch_backend.tree import StepFn, verify_tree

__all__ = ["verify", "step", "target_uniforms", "make_step"]


def target_uniforms(seeds: torch.Tensor, positions: torch.Tensor, gamma: int) -> torch.Tensor:
    """``[B, gamma + 1]`` float64: ``U(seed, t + i, STREAM_SAMPLE, 0)`` for ``i = 0..gamma``."""
    at = positions.view(-1, 1) + torch.arange(gamma + 1, device=positions.device)
    return keyed_uniforms(seeds.view(-1, 1), at, STREAM_SAMPLE, 0)


def step(p_i, q_i, x, alive, coins, u, i, act):
    """The single-step rule (:data:`coupling.torch_backend.tree.StepFn`): the target's token."""
    return sample_rows(p_i, u)



def make_step(replacement: bool = True) -> StepFn:
    """The walk's kernel (:data:`coupling.torch_backend.tree.StepFn`): :func:`step`, whatever
    the draft law."""
    return step

def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """Exact-match verification over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``accept_u`` is accepted and never read)."""
    if sample_u is None:
        _, _, _, s, t = check_inputs(drafts, p, q, seeds, positions, validate=False)
        sample_u = target_uniforms(s, t, drafts.shape[-1])
    return verify_tree(step, drafts, p, q, seeds, positions, replacement=replacement,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="strict")
