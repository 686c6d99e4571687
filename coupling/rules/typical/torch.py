"""``typical``'s batched torch twin (LOSSY: Medusa's typical acceptance along draft trees), and
the batched step every accept-set rule shares (:func:`accept_set_step`).

At each offset of the walk (:mod:`coupling.torch_backend.tree`) the surviving drafts that are
acceptable under the offset's target law compete: the one of highest ``p`` is output (ties:
lowest id); if none is acceptable the fallback law is drawn by inverse CDF with the offset's
sample uniform. Thresholds and entropies are computed in float64, as the numpy core does
(:mod:`coupling.rules.acceptset`); with the same uniforms the twin and
``RULES["typical"].verify_block`` agree except where a float rounding moves a token across
the threshold.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...torch_backend.common import Verdict, sample_rows
from ...torch_backend.tree import StepFn, verify_tree
from . import RULE, Typical

__all__ = ["verify", "make_step", "accept_set_step", "parts"]

# (p rows [A, V] float64) -> (acceptable [A, V] bool, fallback weights [A, V])
Parts = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def accept_set_step(parts: Parts) -> StepFn:
    """The batched step of an accept-set rule given its ``parts``."""

    def step(p_i, q_i, x, alive, coins, u, i, act):
        p = p_i.to(torch.float64)
        accept, fallback = parts(p)
        px = p.gather(1, x)                                          # [A, k]
        ok = alive & accept.gather(1, x) & (px > 0)
        key = torch.where(ok, px, torch.full_like(px, -1.0))
        best = key.max(-1, keepdim=True).values
        tie = ok & (key == best)
        chosen = torch.where(tie, x, torch.full_like(x, p.shape[-1])).min(-1).values
        return torch.where(ok.any(-1), chosen, sample_rows(fallback, u))

    return step


def _entropy(p: torch.Tensor, offset: float) -> torch.Tensor:
    pos = p > 0
    return -torch.where(pos, p * torch.log(torch.where(pos, p, 1.0) + offset), 0.0).sum(-1)


def parts(rule: Typical) -> Parts:
    """``rule``'s acceptable set ``p > tau`` and fallback law, batched (module doc of
    :mod:`coupling.rules.typical`)."""

    def fn(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tau = torch.clamp(rule.delta * torch.exp(-_entropy(p, rule.entropy_offset)),
                          max=rule.eps).unsqueeze(-1)
        accept = p > tau
        if rule.fallback == "greedy":
            fallback = torch.zeros_like(p).scatter_(1, p.argmax(-1, keepdim=True), 1.0)
        else:
            keep = p >= torch.minimum(tau, p.max(-1, keepdim=True).values)
            fallback = torch.where(keep, p, 0.0)
        return accept, fallback

    return fn


def make_step(replacement: bool = True, rule: Typical = RULE) -> StepFn:
    """The single-step rule (:data:`coupling.torch_backend.tree.StepFn`) of ``rule``."""
    return accept_set_step(parts(rule))


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, rule: Typical = RULE) -> Verdict:
    """Typical acceptance over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``rule`` carries the parameters)."""
    return verify_tree(make_step(rule=rule), drafts, p, q, seeds, positions,
                       replacement=replacement,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="typical")
