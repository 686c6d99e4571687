"""``gls``'s batched torch twin: Gumbel-max list sampling along draft trees, with keyed noise.

Drafting (:func:`draft`): branch ``c`` of a request drafts the token at absolute position ``t``
by Gumbel-max with column ``c`` of :func:`list_noise` ``(seed, t)``, along its own prefix.
Verifying (:func:`verify`): the token at ``t`` is the target's Gumbel-max token under the
columns' maximum, which the keyed construction makes ``argmax log p + G*(seed, t)`` with
``G* = coupling.torch_backend.rng.gumbel_noise(seed, t, V)``, the noise the ``gumbel`` twin
reads: the verifier is :func:`coupling.rules.gumbel.torch.verify`, and the emitted stream is the
target's own keyed Gumbel-max stream for every drafter and every ``k``. Drafts are accepted
while a survivor agrees with it. :func:`list_noise` holds the numbers of the numpy
:func:`coupling.rules.gls.list_noise` (the keys are in its docstring): the columns' maxima bit
for bit, the truncated entries to 1e-15 (numpy's and torch's ``logaddexp`` may round apart).
"""

from __future__ import annotations

import math

import torch

from ...keyed import STREAM_GUMBEL
from ...torch_backend.common import Verdict, check_probs
from ...torch_backend.rng import gumbel_noise, keyed_uniforms
from ..gumbel.torch import verify as gumbel_verify

__all__ = ["list_noise", "draft", "draft_branches", "verify"]


def list_noise(seeds: torch.Tensor | int, positions: torch.Tensor | int, vocab_size: int,
               k: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``k`` keyed noise columns of ``(seed, position)``: float64 ``[..., k, V]`` (``seeds``
    and ``positions`` broadcast), :func:`coupling.rules.gls.list_noise`'s numbers (module doc)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (the number of columns), got {k!r}")
    V = vocab_size
    s, t = torch.broadcast_tensors(torch.as_tensor(seeds, device=device),
                                   torch.as_tensor(positions, device=device))
    top = gumbel_noise(s, t, V, dtype=torch.float64) + math.log(k)               # [..., V]
    v = torch.arange(V, device=s.device, dtype=torch.int64)
    who = torch.floor(keyed_uniforms(s.unsqueeze(-1), t.unsqueeze(-1), STREAM_GUMBEL, V + v)
                      * k).clamp_(max=k - 1).to(torch.int64)                     # [..., V]
    cols = (torch.arange(2, k + 2, device=s.device).view(k, 1) * V + v).reshape(-1)
    fresh = gumbel_noise(s, t, (k + 2) * V, tokens=cols, dtype=torch.float64)
    fresh = fresh.view(*s.shape, k, V)
    top = top.unsqueeze(-2)
    G = -torch.logaddexp(-top, -fresh)          # standard Gumbels truncated below the maximum
    column = torch.arange(k, device=s.device).view(k, 1)
    return torch.where(column == who.unsqueeze(-2), top, G)


def draft(q: torch.Tensor, seeds: torch.Tensor | int,
          positions: torch.Tensor | int) -> torch.Tensor:
    """Drafter side: ``q [..., k, V]`` holds each branch's law at one position; branch ``c``
    drafts ``argmax_v log q[..., c, v] + G_c(seed, position, v)``. ``seeds`` and ``positions``
    broadcast to ``q.shape[:-2]``; returns int64 ``[..., k]``."""
    if not isinstance(q, torch.Tensor) or not q.dtype.is_floating_point or q.ndim < 2:
        raise ValueError("q must be a floating tensor [..., k, V] of draft probabilities")
    check_probs(q, "q")
    k, V = q.shape[-2:]
    s, t = torch.broadcast_tensors(torch.as_tensor(seeds, device=q.device),
                                   torch.as_tensor(positions, device=q.device))
    G = list_noise(s.expand(q.shape[:-2]), t.expand(q.shape[:-2]), V, k)
    return torch.argmax(q.to(torch.float64).log() + G, -1)


def draft_branches(q: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The drafter side as every shared-noise twin offers it: ``q [B, k, V]``, ``seeds``,
    ``positions`` ``[B]`` -> ``[B, k]``, branch ``c`` drafting with column ``c`` (:func:`draft`)."""
    return draft(q, seeds, positions)


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None = None, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           noise: torch.Tensor | None = None, replacement: bool = True,
           validate: bool = True, atol: float | None = None) -> Verdict:
    """Gumbel-max list sampling along draft trees, batched: the verifier of
    :func:`coupling.rules.gumbel.torch.verify` (module doc; its arguments, ``noise`` the
    target's keyed noise ``G*``)."""
    return gumbel_verify(drafts, p, q, seeds=seeds, positions=positions, noise=noise,
                         replacement=replacement, validate=validate, atol=atol)
