"""A draft's LM head: restricted to a token subset, scaled by a calibrated factor, int8.

Both drafts (:mod:`coupling.llm.drafts`, :mod:`coupling.llm.feature_draft`) share the target's
LM head. Their heads are wrapped, never modified: the target keeps its own.
"""

from __future__ import annotations

import torch

from .calibrate import check_logit_scale
from .int8 import Int8Linear


class SubsetHead(torch.nn.Module):
    """LM head restricted to a token subset: logits of the other tokens are ``-inf``.

    The draft's cost is dominated by its 49152 x 576 head; restricted to the ``n`` tokens that
    carry most of the target's mass on the training corpus, a draft step is several times
    cheaper. The draft law q is then supported on the subset: speculative rules stay lossless
    (any q is allowed), and only acceptance pays for the target mass outside the subset. Full
    ``[.., V]`` logits are returned so Hugging Face assisted generation uses it unchanged.
    """

    def __init__(self, full_weight: torch.Tensor, tokens: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = full_weight.shape[0]
        tokens = tokens.to(torch.long)
        in_range = tokens.numel() > 0 and 0 <= int(tokens.min()) <= int(tokens.max()) < \
            self.vocab_size
        if tokens.ndim != 1 or not in_range or tokens.unique().numel() != tokens.numel():
            raise ValueError(f"tokens must be distinct ids in [0, {self.vocab_size}); a ranking "
                             "saved for another vocabulary does not fit this head")
        self.register_buffer("tokens", tokens, persistent=False)
        # a gathered copy (rows of the shared head), so the matmul reads contiguous memory
        self.register_buffer("weight", full_weight.detach()[self.tokens].clone(), persistent=False)
        self.int8: Int8Linear | None = None

    def subset_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of the subset's tokens only, [.., n], in ``tokens`` order."""
        return self.int8(h) if self.int8 is not None else \
            torch.nn.functional.linear(h, self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.to_vocab(self.subset_logits(h), float("-inf"))

    def to_vocab(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Values over the subset, [.., n], placed in a [.., V] tensor filled with ``fill`` (a
        law over the subset becomes a law over the vocabulary with the default 0)."""
        out = x.new_full((*x.shape[:-1], self.vocab_size), fill)
        out[..., self.tokens] = x
        return out


class ScaledHead(torch.nn.Module):
    """A draft's LM head with its logits multiplied by a calibrated ``scale`` > 0.

    The scale is part of the draft model, fitted to the sampling settings it is verified under
    (:mod:`coupling.llm.calibrate`): a draft distilled at temperature 1 is flatter than the
    target, and sharpening its logits raises the overlap every rule accepts. ``-inf`` logits
    (outside a :class:`SubsetHead`) stay ``-inf``. Hugging Face assisted generation runs the
    wrapped draft unchanged, so both engines still share one draft.
    """

    def __init__(self, inner: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.inner = inner
        self.scale = check_logit_scale(scale)

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner(h) * self.scale


def restrict_head(draft, tokens: torch.Tensor):
    """Replace the draft's LM head by a :class:`SubsetHead` over ``tokens`` (in place)."""
    draft.lm_head = SubsetHead(draft.lm_head.weight, tokens.to(draft.lm_head.weight.device))
    return draft


def quantized_head_int8(head: torch.nn.Module) -> torch.nn.Module:
    """An int8 head for a draft: a :class:`SubsetHead` quantizes its own gathered copy; the
    target's full head (shared) is copied into a new :class:`Int8Linear`, never modified."""
    if isinstance(head, ScaledHead):
        head.inner = quantized_head_int8(head.inner)
        return head
    if isinstance(head, SubsetHead):
        head.int8 = Int8Linear(head.weight)
        return head
    if isinstance(head, torch.nn.Linear):
        return Int8Linear.from_linear(head)
    raise TypeError(f"cannot quantize a head of type {type(head).__name__}")
