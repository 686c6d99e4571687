r"""``block``'s batched torch twin: block verification (Sun et al., Algorithm 2), ``B`` requests
at once.

Notation (0-indexed, one request): drafts ``x_0 .. x_{g-1}``, ratios ``r_i = p_i(x_i)/q_i(x_i)``;
running weights ``w_0 = 1``, ``w_i = min(w_{i-1} r_{i-1}, 1)``; residual masses
``s_i = sum_y max(w_i p_i(y) - q_i(y), 0)`` and stopping probabilities

.. math::  h_i = \frac{s_i}{s_i + 1 - w_i}\ (1 \le i < g), \qquad h_g = w_g;

with ``eta_i`` uniform the accepted length is the LARGEST ``i`` with ``eta_i < h_i`` (0 if
none; every position is tested), then emit ``y ~ norm(max(w_n p_n - q_n, 0))`` if ``n < g``
(for ``n = 0`` the token residual, since ``w_0 = 1``) or ``y ~ p_g`` if ``n = g``. ``0/0`` in
``h_i`` reads as ``h_i = 1`` (:mod:`coupling.rules.block`).

Everything is computed in float64 on the normalised laws ``p / sum p``, ``q / sum q``
(:mod:`coupling.torch_backend.laws`). A residual mass is taken only where its test can pass:
``h_i <= w_i`` (``s_i <= w_i``), so a coin ``eta_i >= w_i`` fails without it, and
``eta_g < w_g`` settles ``n = g`` without any. The masses that are needed are one reduction
over their rows, a chunk of rows at a time. Fed the same uniforms, the numpy core
(:func:`coupling.rules.block.verify`) emits the same tokens up to float summation order: both
are held to the same law by the conformance tests.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import (
    Verdict,
    assemble,
    call_draws,
    check_inputs,
    draft_ratios,
    emit_residual,
    law_sums,
)
from ...torch_backend.laws import residual_masses, row_sums

__all__ = ["verify", "weights", "accepted", "can_pass", "stop_probability"]

#: a coin within this relative margin above ``w_i`` still gets its residual mass: ``h_i``
#: is ``<= w_i`` in exact arithmetic, and above it by rounding only
MARGIN = 2.0**-20


def weights(ratios: torch.Tensor) -> torch.Tensor:
    """``w[b, i]`` for ``i = 0..g``: ``w_0 = 1``, ``w_i = min(w_{i-1} r_{i-1}, 1)``.
    ``[B, g] -> [B, g+1]``."""
    B, g = ratios.shape
    w = torch.ones(B, g + 1, dtype=torch.float64, device=ratios.device)
    for i in range(g):  # sequential by definition (a clipped running product); g is small
        w[:, i + 1] = torch.clamp(w[:, i] * ratios[:, i], max=1.0)
    return w


def can_pass(eta: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Whether the test of coin ``eta`` at weight ``w`` can pass: ``h_i <= w_i``, so a coin
    ``eta_i >= w_i`` fails without its residual mass (elementwise)."""
    return eta < w * (1.0 + MARGIN)


def stop_probability(s: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h_i = s_i / (s_i + 1 - w_i)`` from the residual mass ``s`` and weight ``w``
    (elementwise, float64)."""
    den = s + (1.0 - w)
    # 0/0 (w_i = 1 and p_i = q_i) reads as h_i = 1: then w_{i+1} = 1 and h_{i+1} = 1, so
    # the stop never lands on i and its (empty) residual is never used
    return torch.where(den > 0, s / torch.where(den > 0, den, 1.0), 1.0)


def accepted(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor, eta: torch.Tensor, *,
             sums: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Accepted length: ``w [B, g+1]``, ``p [B, g+1, V]``, ``q [B, g, V]``, ``eta [B, g]`` ->
    int64 ``[B]``; ``sums``: the float64 row sums ``(sum p [B, >= g], sum q [B, g])`` if the
    caller has them (else those of the rows read)."""
    B, g1 = w.shape
    g = g1 - 1
    if g == 0:
        return torch.zeros(B, dtype=torch.int64, device=w.device)
    n = torch.where(eta[:, g - 1] < w[:, g], g, 0)  # h_g = w_g; the largest passing i wins
    # the tests that can pass and can still matter (n < g)
    open_ = can_pass(eta[:, : g - 1], w[:, 1:g]) & (n < g).unsqueeze(1)
    b, i = torch.nonzero(open_, as_tuple=True)
    if b.numel() == 0:
        return n
    i = i + 1
    sp, sq = (row_sums(p, (b, i)), row_sums(q, (b, i))) if sums is None else (
        sums[0][b, i], sums[1][b, i])
    wi = w[b, i]
    s = residual_masses(p, q, (b, i), (b, i), wi / sp, 1.0 / sq)
    passed = torch.zeros(B, g, dtype=torch.int64, device=w.device)
    passed[b, i - 1] = torch.where(eta[b, i - 1] < stop_probability(s, wi), i, 0)
    return torch.maximum(n, passed.amax(-1))


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """Block verification, batched; arguments as :func:`coupling.rules.token.torch.verify`.
    ``accept_u[b, i]`` plays ``eta_{i+1}`` (the test for an accepted length of ``i+1``)."""
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, max_k=1, rule="block")
    B, _, g = drafts.shape
    coins, v = call_draws(seeds, positions, g, 1, accept_u, sample_u)
    eta = coins[:, :, 0]
    p1, q1 = p[:, 0], q[:, 0]
    sums = law_sums(drafts, p, q)  # every ratio enters w_g
    w = weights(draft_ratios(drafts, p, q, sums=sums)[:, 0])  # [B, g+1]
    sp, sq = sums[0][:, 0], sums[1][:, 0]  # [B, g]
    n = accepted(w, p1, q1, eta, sums=(sp, sq))  # [B]
    rows = torch.arange(B, device=drafts.device)
    w_n = torch.where(n == g, 1.0, w[rows, n])
    at = n.clamp(max=max(g - 1, 0))
    y = emit_residual(p1, q1, n, w_n, v[rows, n], sums=(sp[rows, at], sq[rows, at]) if g
                      else None)
    return assemble(drafts, n, torch.zeros_like(n), y)
