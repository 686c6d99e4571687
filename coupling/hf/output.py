"""What :func:`coupling.hf.generate` returns with ``return_dict_in_generate=True``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

__all__ = ["SpeculativeDecoderOnlyOutput", "Stats"]


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus per-row speculative statistics (vLLM's names).

    ``sequences``, ``scores`` (processed scores of each emitted token: the target's, at the
    position it was emitted; a row that stopped earlier holds zeros) and ``logits`` (the
    target's raw logits there) as in plain ``generate``. ``cache`` is ``None``: the run's
    caches hold the masked columns of rejected drafts and are not meant for reuse.

    Attributes
    ----------
    num_steps : int64 ``[B]``
        Verification calls of the row (vLLM's ``num_drafts``; renamed because ``num_drafts``
        is the number of draft branches here).
    num_draft_tokens : int64 ``[B]``
        Tokens drafted: ``num_drafts * gamma`` per step (a tree's nodes with ``tree=``).
    num_accepted_tokens : int64 ``[B]``
        Drafted tokens accepted (the emitted path's).
    num_accepted_tokens_per_pos : int64 ``[B, gamma]`` (``[B, tree.depth]`` with ``tree=``)
        Steps that accepted at least ``i + 1`` drafted tokens, at column ``i``.
    mean_acceptance_length : float64 ``[B]``
        Tokens emitted per verification call, ``1 + num_accepted_tokens / num_steps``
        (the bonus or residual token included).

    The counts are the verifier's decisions, including tokens that a stopping criterion then
    cut off.
    """

    num_steps: torch.LongTensor | None = None
    num_draft_tokens: torch.LongTensor | None = None
    num_accepted_tokens: torch.LongTensor | None = None
    num_accepted_tokens_per_pos: torch.LongTensor | None = None
    mean_acceptance_length: torch.DoubleTensor | None = None


class Stats:
    """Per-row counters of one run (rows in the batch's original order)."""

    def __init__(self, batch_size: int, depth: int, drafted: int) -> None:
        """``depth``: the most drafted tokens one step can accept; ``drafted``: tokens drafted
        per step."""
        self.steps = torch.zeros(batch_size, dtype=torch.long)
        self.accepted = torch.zeros(batch_size, dtype=torch.long)
        self.per_pos = torch.zeros(batch_size, depth, dtype=torch.long)
        self.tokens_per_step = drafted

    def record(self, rows: torch.Tensor, accepted: torch.Tensor) -> None:
        """One verification call of each of ``rows`` (original indices), ``accepted`` each."""
        accepted = accepted.cpu()
        self.steps[rows] += 1
        self.accepted[rows] += accepted
        pos = torch.arange(self.per_pos.shape[1])
        self.per_pos[rows] += (pos.unsqueeze(0) < accepted.unsqueeze(1)).to(torch.long)

    def fields(self) -> dict[str, torch.Tensor]:
        steps = self.steps
        mean = 1.0 + self.accepted.double() / steps.clamp(min=1).double()
        return {
            "num_steps": steps,
            "num_draft_tokens": steps * self.tokens_per_step,
            "num_accepted_tokens": self.accepted,
            "num_accepted_tokens_per_pos": self.per_pos,
            "mean_acceptance_length": torch.where(steps > 0, mean, torch.nan),
        }
