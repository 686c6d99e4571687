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

The residual masses are one reduction over ``[B, g - 1, V]``, the memory traffic of reading the
laws once; weights and masses are float64. Fed the same uniforms, the numpy core
(:func:`coupling.rules.block.verify`) emits the same tokens up to float summation order: both
are held to the same law by the conformance tests.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import (
    Verdict,
    accept_uniforms,
    assemble,
    check_inputs,
    draft_ratios,
    emit_residual,
    sample_uniforms,
)

__all__ = ["verify", "weights", "accepted"]


def weights(ratios: torch.Tensor) -> torch.Tensor:
    """``w[b, i]`` for ``i = 0..g``: ``w_0 = 1``, ``w_i = min(w_{i-1} r_{i-1}, 1)``.
    ``[B, g] -> [B, g+1]``."""
    B, g = ratios.shape
    w = torch.ones(B, g + 1, dtype=torch.float64, device=ratios.device)
    for i in range(g):  # sequential by definition (a clipped running product); g is small
        w[:, i + 1] = torch.clamp(w[:, i] * ratios[:, i], max=1.0)
    return w


def accepted(w: torch.Tensor, p: torch.Tensor, q: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
    """Accepted length: ``w [B, g+1]``, ``p [B, g+1, V]``, ``q [B, g, V]``, ``eta [B, g]`` ->
    int64 ``[B]``."""
    B, g1 = w.shape
    g = g1 - 1
    if g == 0:
        return torch.zeros(B, dtype=torch.int64, device=w.device)
    h = torch.empty(B, g, dtype=torch.float64, device=w.device)
    if g > 1:
        wi = w[:, 1:g]  # [B, g-1]
        s = (wi.unsqueeze(-1) * p[:, 1:g] - q[:, 1:g]).clamp_(min=0.0).sum(-1)
        den = s + (1.0 - wi)
        # 0/0 (w_i = 1 and p_i = q_i) reads as h_i = 1: then w_{i+1} = 1 and h_{i+1} = 1, so
        # the stop never lands on i and its (empty) residual is never used
        h[:, : g - 1] = torch.where(den > 0, s / torch.where(den > 0, den, 1.0), 1.0)
    h[:, g - 1] = w[:, g]
    passed = eta < h  # [B, g]
    idx = torch.arange(1, g + 1, device=w.device, dtype=torch.int64)
    return (passed.to(torch.int64) * idx).amax(-1)


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
    eta = accept_uniforms(seeds, positions, g) if accept_u is None \
        else accept_u.to(torch.float64).reshape(B, g)
    v = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    p1, q1 = p[:, 0], q[:, 0]
    w = weights(draft_ratios(drafts, p, q)[:, 0])  # [B, g+1]
    n = accepted(w, p1, q1, eta)  # [B]
    rows = torch.arange(B, device=drafts.device)
    w_n = torch.where(n == g, 1.0, w[rows, n])
    y = emit_residual(p1, q1, n, w_n, v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)
