"""``token``'s batched torch twin: speculative sampling along one drafted branch, ``B`` requests
at once.

Notation (0-indexed, one request): drafts ``x_0 .. x_{g-1}``, draft laws ``q_i``, target laws
``p_i`` for ``i <= g`` (``p_g`` is the bonus law). Accept ``x_i`` iff ``u_i < p_i(x_i)/q_i(x_i)``
and all earlier were accepted; at the first rejection ``n`` emit ``y ~ norm(max(p_n - q_n, 0))``;
if all ``g`` are accepted emit ``y ~ p_g``. Ratios and residuals are computed in float64 on the
normalised laws ``p / sum p``, ``q / sum q`` (:mod:`coupling.torch_backend.laws`), whatever
the input precision; a row's sum is taken only where the call reads it (the offsets up to the
stop). The coins and draws are the keyed uniforms of :mod:`coupling.torch_backend.rng`, so a
request's verdict does not depend on its batch.
"""

from __future__ import annotations

import torch

from ...torch_backend.common import (
    Verdict,
    assemble,
    call_draws,
    check_inputs,
    emit_residual,
)
from ...torch_backend.laws import row_sums

__all__ = ["verify", "accepted", "normalised_run"]


def accepted(ratios: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accepted length: the leading run of ``u_i < r_i``. ``[B, g] -> [B]``."""
    return (u < ratios).to(torch.int64).cumprod(-1).sum(-1)


def normalised_run(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                   u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The accepted length on the normalised laws, summing only the rows it reads.

    ``drafts [B, g]``, ``p [B, g+1, V]``, ``q [B, g, V]``, ``u [B, g]`` -> ``(n [B],
    sum p [B, g], sum q [B, g])``, the sums exact (float64) at the offsets ``<= n`` (those the
    tests up to the stop and the residual at the stop read) and 1 elsewhere. The run on the
    raw ratios names the rows to sum; where the exact ratios lengthen it (a test within the
    rows' rounding of its coin), the next offsets are summed in turn.
    """
    B, g = drafts.shape
    x = drafts.unsqueeze(-1)
    px = p[:, :g].gather(-1, x).squeeze(-1).to(torch.float64)
    qx = q.gather(-1, x).squeeze(-1).to(torch.float64)
    sp = torch.ones(B, g, dtype=torch.float64, device=p.device)
    sq = torch.ones_like(sp)
    col = torch.arange(g, device=p.device)
    n, done = accepted(px / qx, u), -1
    while True:  # one pass unless a sum lengthens a run
        b, i = torch.nonzero((col <= n.unsqueeze(1)) & (col > done), as_tuple=True)
        sp[b, i], sq[b, i] = row_sums(p, (b, i)), row_sums(q, (b, i))
        longer = accepted((px / sp) / (qx / sq), u)
        if not bool((longer > n).any()):
            return longer, sp, sq
        n, done = longer, n.unsqueeze(1)


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
    coins, v = call_draws(seeds, positions, g, 1, accept_u, sample_u)
    u = coins[:, :, 0]
    n, sp, sq = normalised_run(drafts[:, 0], p[:, 0], q[:, 0], u)
    rows = torch.arange(B, device=drafts.device)
    ones = torch.ones(B, dtype=torch.float64, device=drafts.device)
    at = n.clamp(max=max(g - 1, 0))
    sums = (sp[rows, at], sq[rows, at]) if g else None
    y = emit_residual(p[:, 0], q[:, 0], n, ones, v[rows, n], sums=sums)
    return assemble(drafts, n, torch.zeros_like(n), y)
