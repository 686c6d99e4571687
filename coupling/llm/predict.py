"""The engine's predictions of tokens per call, from the laws a step saw: tensors in, floats
out, through :mod:`coupling.sequence.predict` (where the formulas and their reasons live)."""

from __future__ import annotations

import numpy as np
import torch

from coupling.rules import RULES
from coupling.sequence import predict as core

from .rules_adapter import PLAIN, check_rule


def _arrays(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor):
    if not isinstance(drafts, torch.Tensor) or drafts.dim() != 2:
        raise ValueError(f"drafts must be an integer tensor [k, g], got "
                         f"{tuple(getattr(drafts, 'shape', ()))}")
    if drafts.dtype.is_floating_point or drafts.dtype == torch.bool:
        raise ValueError(f"drafts must hold integer token ids, got dtype {drafts.dtype}")
    return (drafts.detach().cpu().numpy(), p.detach().cpu().numpy(),
            q.detach().cpu().numpy())


def _check(rule: str, k: int = 1, replacement: bool = True) -> None:
    """:func:`check_rule` for a verified step: a rule of the registry, never plain sampling."""
    if rule == PLAIN:
        raise ValueError(f"rule={PLAIN!r} verifies nothing: predictions need a rule of "
                         "coupling.rules.RULES")
    check_rule(rule, k, replacement, lossy=True)


def compose(beta: list[float] | np.ndarray) -> float:
    """sum_{j=0}^{g} prod_{i<=j} beta_i (j = 0 term is 1)."""
    out, prod = 1.0, 1.0
    for b in beta:
        prod *= float(b)
        out += prod
    return out


def check_step(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
               branch: int) -> None:
    """Validate one step's record (:func:`coupling.sequence.predict.check_record`)."""
    _check(rule)
    core.check_record(*_arrays(drafts, q, p), branch)


def step_beta(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, branch: int,
              k: int, replacement: bool = True) -> list[float]:
    """Per-position acceptances along the chosen branch (block: its weights w_1..w_g)."""
    _check(rule)
    arrays = _arrays(drafts, q, p)
    if k != drafts.shape[0]:
        raise ValueError(f"k={k!r} must equal the number of branches drafts holds, "
                         f"{drafts.shape[0]}")
    _check(rule, k, replacement)
    return core.predicted_tokens(rule, *arrays, branch, replacement=replacement)[1]


def predicted_block_efficiency(rule: str, beta: list[float]) -> float:
    """The step's predicted tokens per target call from :func:`step_beta`'s output."""
    _check(rule)
    return RULES[rule].expected_tokens(beta)


def optimal_block_efficiency(rule: str, rec, drafts: torch.Tensor, q: torch.Tensor,
                             p: torch.Tensor, branch: int, replacement: bool = True) -> float:
    """Tokens per call the LP-optimal verifier of the rule's draft law predicts on the step."""
    _check(rule)
    if RULES[rule].attains_optimum:      # the rule is the LP-optimal verifier of its law
        check_step(rule, drafts, q, p, branch)
        return rec.predicted
    return core.optimal_tokens(*_arrays(drafts, q, p), branch, replacement=replacement)


def conditional(rule: str, drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                branch: int) -> float:
    """E[accepted + 1 | drafts] for a rule with a path law (``rules_adapter.has_path_law``) on
    these drafts, exact (:func:`coupling.sequence.predict.conditional_tokens`)."""
    return core.conditional_tokens(rule, *_arrays(drafts, q, p), branch)
