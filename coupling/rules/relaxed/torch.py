"""``relaxed``'s batched torch twin (LOSSY: top-k candidates within a margin of the best, along
draft trees), through the accept-set step of :mod:`coupling.rules.typical.torch`.

The candidates are the first ``topk`` tokens of a stable sort of ``p`` decreasing (ties: lowest
id, as the numpy core), tokens of zero probability excluded; the fallback is the top-1
(``"greedy"``) or a draw from ``p`` (``"sample"``).
"""

from __future__ import annotations

import torch

from ...torch_backend.common import Verdict
from ...torch_backend.tree import StepFn, verify_tree
from ..typical.torch import Parts, accept_set_step
from . import RULE, Relaxed

__all__ = ["verify", "make_step", "parts"]


def parts(rule: Relaxed) -> Parts:
    """``rule``'s acceptable set and fallback law, batched."""

    def fn(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.sort(-p, dim=-1, stable=True).indices[:, : rule.topk]    # [A, topk]
        top = p.gather(1, order)
        ok = top >= top[:, :1] - rule.delta
        ok[:, 0] = True
        accept = torch.zeros_like(p, dtype=torch.bool).scatter_(1, order, ok)
        if rule.fallback == "sample":
            return accept, p
        return accept, torch.zeros_like(p).scatter_(1, order[:, :1], 1.0)

    return fn


def make_step(replacement: bool = True, rule: Relaxed = RULE) -> StepFn:
    """The single-step rule (:data:`coupling.torch_backend.tree.StepFn`) of ``rule``."""
    return accept_set_step(parts(rule))


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None, rule: Relaxed = RULE) -> Verdict:
    """Relaxed acceptance over draft trees, batched (arguments as
    :func:`coupling.rules.rrs.torch.verify`; ``rule`` carries the parameters)."""
    return verify_tree(make_step(rule=rule), drafts, p, q, seeds, positions,
                       replacement=replacement,
                       validate=validate, atol=atol, accept_u=accept_u, sample_u=sample_u,
                       rule="relaxed")
