"""``token``'s batched torch twin: speculative sampling along one drafted branch, ``B`` requests
at once.

Notation (0-indexed, one request): drafts ``x_0 .. x_{g-1}``, draft laws ``q_i``, target laws
``p_i`` for ``i <= g`` (``p_g`` is the bonus law). Accept ``x_i`` iff ``u_i < p_i(x_i)/q_i(x_i)``
and all earlier were accepted; at the first rejection ``n`` emit ``y ~ norm(max(p_n - q_n, 0))``;
if all ``g`` are accepted emit ``y ~ p_g``. Ratios and residual CDFs are computed in float64 from
the given (typically float32) laws; the coins and draws are the keyed uniforms of
:mod:`coupling.torch_backend.rng`, so a request's verdict does not depend on its batch.
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

__all__ = ["verify", "accepted"]


def accepted(ratios: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accepted length: the leading run of ``u_i < r_i``. ``[B, g] -> [B]``."""
    return (u < ratios).to(torch.int64).cumprod(-1).sum(-1)


def verify(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor, *,
           seeds: torch.Tensor | int, positions: torch.Tensor | int,
           replacement: bool = True, accept_u: torch.Tensor | None = None,
           sample_u: torch.Tensor | None = None, validate: bool = True,
           atol: float | None = None) -> Verdict:
    """Token-by-token speculative verification, batched.

    Parameters
    ----------
    drafts : int64 ``[B, 1, g]`` (or ``[B, g]``)
    p : float ``[B, 1, g+1, V]`` (or ``[B, g+1, V]``): target laws along the drafted path.
    q : float ``[B, 1, g, V]`` (or ``[B, g, V]``): draft laws along the drafted path.
    seeds, positions : int64 ``[B]`` (or scalars): the request's seed and the absolute position
        of its first drafted token; they key all randomness (batch invariance).
    replacement : accepted for a uniform signature (one branch: no draft law to choose).
    accept_u, sample_u : optional float64 ``[B, g]`` (or ``[B, g, 1]``) / ``[B, g+1]``
        overriding the keyed uniforms (conformance tests feed a numpy core the same numbers).
    validate : run the value checks (:func:`coupling.torch_backend.check_inputs`).
    """
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, max_k=1, rule="token")
    B, _, g = drafts.shape
    u = accept_uniforms(seeds, positions, g) if accept_u is None \
        else accept_u.to(torch.float64).reshape(B, g)
    v = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    n = accepted(draft_ratios(drafts, p, q)[:, 0], u)  # [B]
    rows = torch.arange(B, device=drafts.device)
    ones = torch.ones(B, dtype=torch.float64, device=drafts.device)
    y = emit_residual(p[:, 0], q[:, 0], n, ones, v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)
