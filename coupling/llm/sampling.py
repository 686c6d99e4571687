"""Sampling transforms applied *identically* to target and draft logits.

A speculative rule is lossless for the law it is given, so the draft law ``q`` handed to the
verifier must be the law the drafts were really sampled from, and the target law ``p`` must be
the law plain sampling would use. Both come from :func:`probs`, with the same settings:

    p = normalise( top_p( top_k( softmax(logits / T) ) ) )

computed in float32 from the (bf16) logits. ``temperature == 0`` is rejected: greedy decoding is
not sampling (use a small temperature instead).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """temperature > 0; top_k = 0 disables top-k; top_p = 1.0 disables nucleus truncation."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (self.temperature > 0):
            raise ValueError(f"temperature={self.temperature} must be > 0 (greedy is not sampling)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables top-k)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1] (1 disables top-p)")

    def as_dict(self) -> dict:
        return asdict(self)


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Float32 probabilities over the last axis after temperature, top-k and top-p.

    Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (the token
    that crosses the threshold is kept), ties broken by ``torch.sort`` order. Ties make the kept
    set depend on sort order only when they straddle the cut, identically for every caller.
    """
    x = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    pr = torch.softmax(x, dim=-1)
    if cfg.top_p < 1.0:
        sp, si = torch.sort(pr, dim=-1, descending=True)
        before = torch.cumsum(sp, dim=-1) - sp       # mass strictly above each sorted entry
        drop = before >= cfg.top_p
        sp = sp.masked_fill(drop, 0.0)
        pr = torch.zeros_like(pr).scatter_(-1, si, sp)
        pr = pr / pr.sum(-1, keepdim=True)
    return pr


def hf_kwargs(cfg: SamplingConfig) -> dict:
    """The same settings as keyword arguments of ``model.generate``."""
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k or None,
            "top_p": cfg.top_p}
