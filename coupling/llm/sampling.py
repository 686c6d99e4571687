"""Sampling transforms applied *identically* to target and draft logits.

A speculative rule is lossless for the law it is given, so the draft law ``q`` handed to the
verifier must be the law the drafts were really sampled from, and the target law ``p`` must be
the law plain sampling would use. Both come from :func:`probs`, with the same settings:

    p = normalise( top_p( top_k( softmax(logits / T) ) ) )

computed in float32 from the (bf16) logits. ``temperature == 0`` is rejected: greedy decoding is
not sampling (use a small temperature instead).

With top-k on, where :mod:`coupling.llm.accel` serves its ``top_k_law``, the law is computed
in one compiled call per row batch (:func:`native_law`): the same kept set and the same law to
float32 rounding, for target and draft alike.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from . import accel


@dataclass(frozen=True)
class SamplingConfig:
    """temperature > 0; top_k = 0 disables top-k; top_p = 1.0 disables nucleus truncation."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (0 < self.temperature < math.inf):
            raise ValueError(f"temperature={self.temperature} must be finite and > 0 (greedy is "
                             "not sampling)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) \
                or self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r} must be an integer >= 0 (0 disables top-k)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p} must lie in (0, 1] (1 disables top-p)")

    def as_dict(self) -> dict:
        return asdict(self)


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Float32 probabilities over the last axis after temperature, top-k and top-p.

    Top-p keeps the smallest set of most likely tokens whose mass reaches ``top_p`` (the token
    that crosses the threshold is kept), ties broken by ``torch.topk`` / ``torch.sort`` order.
    Ties make the kept set depend on that order only when they straddle the cut, identically
    for every caller.

    With top-k on, the law lives on the k largest logits (and any tied with the k-th), so it
    is computed on a window of the largest entries (:func:`_probs_top_k`) and scattered back,
    with the same kept set, the same softmax terms (up to summation order) and the same nucleus
    as the full path, at a third of its cost per row at V = 49152.
    """
    native = native_law(logits, cfg)
    if native is not None:
        return native
    x = logits.float() / cfg.temperature
    V = x.shape[-1]
    if cfg.top_k and cfg.top_k < V:
        fast = _probs_top_k(x, cfg)
        if fast is not None:
            return fast
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    pr = torch.softmax(x, dim=-1)
    if cfg.top_p < 1.0:
        pr = _top_p(pr, cfg.top_p)
    return pr


def native_function(name: str):
    """The compiled path ``name`` of :mod:`coupling.llm.accel` where there is one and it
    serves, else None (the caller runs torch)."""
    return accel.function(name) if name in accel.NAMES else None


def sample_rows(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of non-negative ``weights`` [rows, V] for the uniforms ``u`` [rows]:
    :func:`coupling.torch_backend.sample_rows`, bit for bit (the first token whose float64
    running sum exceeds ``u * total``), by the compiled ``inverse_cdf`` where it serves
    (float32 CPU rows)."""
    from coupling.torch_backend import sample_rows as torch_sample_rows

    if weights.device.type == "cpu" and weights.dtype == torch.float32 and weights.dim() == 2:
        fn = native_function("inverse_cdf")
        if fn is not None:
            idx = fn(weights.contiguous(), u.to(torch.float64).reshape(-1))
            if bool((idx >= 0).all()):         # else a row of total 0 (or NaN): torch decides
                return idx
    return torch_sample_rows(weights, u)


def native_law(logits: torch.Tensor, cfg: SamplingConfig, columns: torch.Tensor | None = None,
                vocab: int | None = None) -> torch.Tensor | None:
    """The top-k (then top-p) law of ``logits`` [.., n] by the compiled ``top_k_law``, placed at
    ``columns`` (vocabulary ids of the n columns) in a [.., vocab] law when given; None where
    the fast path does not apply (no top-k, a GPU tensor, logits that need a gradient
    (training), a non-finite logit, no compiled path).

    The same kept set as :func:`_probs_top_k` (every entry tied with the k-th value, from the
    same float32 ``logits / temperature``); the softmax and the nucleus's running mass are
    summed in float64, so the law agrees with the torch path to float32 rounding, and ties
    straddling the nucleus's cut are broken by column order (the torch path: ``torch.topk``'s
    order), the same for target and draft.
    """
    n = logits.shape[-1]
    if not (cfg.top_k and cfg.top_k < n) or logits.device.type != "cpu" or \
            logits.dtype not in (torch.float32, torch.bfloat16) or logits.requires_grad:
        return None
    fn = native_function("top_k_law")
    if fn is None:
        return None
    width = n if columns is None else int(vocab)
    cols = torch.empty(0, dtype=torch.long) if columns is None else columns
    out = fn(logits.reshape(-1, n).contiguous(), float(cfg.temperature), int(cfg.top_k),
             float(cfg.top_p), cols, width)
    if out.numel() == 0 and logits.numel() > 0:
        return None
    return out.reshape(*logits.shape[:-1], width)


def _probs_top_k(x: torch.Tensor, cfg: SamplingConfig, window: int = 32
                 ) -> torch.Tensor | None:
    """The top-k (then top-p) law of the scaled logits x [.., V] from their ``k + window``
    largest entries, or ``None`` when that window cannot settle it: a run of entries tied with
    the k-th value reaching past the window (the full path keeps every tied entry; bf16 logits
    tie often), or a non-finite k-th value."""
    k, V = cfg.top_k, x.shape[-1]
    flat = x.reshape(-1, V)
    w = min(V, k + window)
    vals, idx = torch.topk(flat, w, dim=-1)                       # descending
    kth = vals[:, k - 1:k]
    if not bool(torch.isfinite(kth).all()) or (w < V and not bool((vals[:, -1:] < kth).all())):
        return None
    sp = torch.softmax(vals.masked_fill(vals < kth, float("-inf")), dim=-1)
    if cfg.top_p < 1.0:
        return _cut(sp, idx, cfg.top_p, V).reshape(x.shape)
    return torch.zeros_like(flat).scatter_(-1, idx, sp).reshape(x.shape)


def _top_p(pr: torch.Tensor, top_p: float, head: int = 64) -> torch.Tensor:
    """Nucleus truncation; exact, without sorting the whole vocabulary when possible.

    A full sort of V = 49152 floats costs more per row than a draft call on a CPU, but
    the nucleus is the prefix of the descending order, so when the ``head`` largest entries
    already reach ``top_p`` the cut lies among them (``topk`` returns that prefix in order).
    Rows whose head does not reach ``top_p`` fall back to a full sort.
    """
    flat = pr.reshape(-1, pr.shape[-1])
    h = min(head, flat.shape[-1])
    sp, si = torch.topk(flat, h, dim=-1)              # descending
    covered = sp.sum(-1) >= top_p
    if not bool(covered.all()):
        rows = (~covered).nonzero().flatten()
        full_v, full_i = torch.sort(flat[rows], dim=-1, descending=True)
        out = torch.zeros_like(flat)
        out[rows] = _cut(full_v, full_i, top_p, flat.shape[-1])
        if bool(covered.any()):
            ok = covered.nonzero().flatten()
            out[ok] = _cut(sp[ok], si[ok], top_p, flat.shape[-1])
        return out.reshape(pr.shape)
    return _cut(sp, si, top_p, flat.shape[-1]).reshape(pr.shape)


def _cut(sp: torch.Tensor, si: torch.Tensor, top_p: float, V: int) -> torch.Tensor:
    before = torch.cumsum(sp, dim=-1) - sp            # mass strictly above each sorted entry
    sp = sp.masked_fill(before >= top_p, 0.0)
    out = torch.zeros(sp.shape[0], V, dtype=sp.dtype, device=sp.device).scatter_(-1, si, sp)
    return out / out.sum(-1, keepdim=True)


def hf_kwargs(cfg: SamplingConfig) -> dict:
    """The same settings as keyword arguments of ``model.generate``."""
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k or None,
            "top_p": cfg.top_p}
