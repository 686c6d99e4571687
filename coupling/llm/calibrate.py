"""Calibrating a draft's logit scale for the sampling settings it will be verified under.

Why
---
A draft distilled with the forward KL at temperature 1 learns to cover the target's mass, so
its laws come out *flatter* than the target's. After the sampling transforms (temperature,
top-k, top-p, applied identically to both models) that flatness costs overlap, and overlap
``alpha = sum_x min(p, q)`` is what every rule accepts. Multiplying the draft's logits by one
scalar ``s > 0`` before the transforms, i.e. drafting at temperature ``T / s``, undoes most of
it. Zhou et al. ("DistillSpec", ICLR 2024) make the general point: a draft should be aligned to
the decoding strategy the target is sampled with.

The scale belongs to the draft model (it is stored with its weights; see
:func:`coupling.llm.drafts.load_draft`, :func:`coupling.llm.feature_draft.load_feature_draft`):
the engine still applies the *same* :class:`~coupling.llm.sampling.SamplingConfig` to the
draft's (scaled) logits and to the target's, and ``q`` handed to a rule is still exactly the law
the drafts were sampled from. No rule's losslessness depends on ``s``; only acceptance does.

Exact overlap from stored top-K laws
------------------------------------
Training corpora store the target's top-``K`` log-probabilities at temperature 1 per position.
When the settings truncate to ``top_k <= K`` tokens, the target's law under them is a function of
those ``K`` values alone (log-probabilities differ from logits by a per-row constant, which
softmax ignores), and it is zero elsewhere; so ``sum_x min(p, q)`` only needs ``q`` on the same
``K`` tokens and is exact (:func:`topk_overlap`). Without such truncation it would only be a
bound, and :func:`target_law_on_topk` refuses.
"""

from __future__ import annotations

import torch

from .sampling import SamplingConfig, probs

DEFAULT_GRID = tuple(round(0.8 + 0.05 * i, 2) for i in range(25))   # 0.80 .. 2.00


def check_logit_scale(scale: float, name: str = "logit_scale") -> float:
    """A finite positive float, else ``ValueError`` naming the argument."""
    s = float(scale)
    if not (s > 0 and s < float("inf")):
        raise ValueError(f"{name}={scale!r} must be a finite number > 0 (1.0 leaves the draft's "
                         "logits unchanged)")
    return s


def target_law_on_topk(logp: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The target's law under ``cfg`` on its stored top-K tokens: logp [.., K] -> p [.., K].

    Exact, and only defined, when ``0 < cfg.top_k <= K``: the law then lives on those tokens.
    """
    K = logp.shape[-1]
    if not 0 < cfg.top_k <= K:
        raise ValueError(f"cfg.top_k={cfg.top_k} does not truncate to the K={K} stored tokens, so "
                         "the target's law is not determined by them; calibrate under settings "
                         f"with 0 < top_k <= {K}, or store more tokens")
    return probs(logp, cfg)


def subset_positions(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] int64: the index of each vocabulary token in a draft head's ``tokens``, -1 for tokens
    the head cannot propose (the ``pos`` lookup of :func:`topk_overlap`)."""
    pos = torch.full((vocab_size,), -1, dtype=torch.long, device=tokens.device)
    pos[tokens.long()] = torch.arange(tokens.numel(), device=tokens.device)
    return pos


def topk_overlap(p_topk: torch.Tensor, q: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``sum_x min(p, q)`` per row, with p known on K tokens (zero elsewhere).

    p_topk [.., K]; q [.., S], the draft's law over its own S tokens; pos [.., K] the index in
    ``q``'s last axis of each of p's tokens, or -1 where the draft cannot propose it.
    """
    inside = pos >= 0
    qk = q.gather(-1, pos.clamp_min(0)) * inside
    return torch.minimum(p_topk, qk).sum(-1)


def overlap_by_scale(draft_logits: torch.Tensor, p_topk: torch.Tensor, pos: torch.Tensor,
                     cfg: SamplingConfig, grid=DEFAULT_GRID, chunk: int = 2048
                     ) -> dict[float, float]:
    """Mean overlap of ``probs(s * draft_logits, cfg)`` with ``p_topk`` for each ``s`` in grid.

    draft_logits [N, S] (float32 or bf16), p_topk [N, K] from :func:`target_law_on_topk`,
    pos [N, K] as in :func:`topk_overlap`. Rows are processed ``chunk`` at a time.
    """
    N = draft_logits.shape[0]
    if p_topk.shape[0] != N or pos.shape != p_topk.shape:
        raise ValueError(f"shapes disagree: draft_logits {tuple(draft_logits.shape)}, p_topk "
                         f"{tuple(p_topk.shape)}, pos {tuple(pos.shape)}")
    if N == 0:
        raise ValueError("no positions to calibrate on")
    out = {}
    for s in grid:
        s = check_logit_scale(s, "grid value")
        tot = 0.0
        for i in range(0, N, chunk):
            q = probs(s * draft_logits[i:i + chunk].float(), cfg)
            tot += float(topk_overlap(p_topk[i:i + chunk], q, pos[i:i + chunk]).double().sum())
        out[s] = tot / N
    return out


def best_scale(table: dict[float, float]) -> float:
    """The grid value of highest mean overlap (the smaller one on exact ties)."""
    return max(sorted(table), key=lambda s: (table[s], -s))
