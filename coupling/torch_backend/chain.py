"""Single-branch verification along a block: ``token`` and ``block`` (k = 1).

Notation (0-indexed, one request): drafts ``x_0 .. x_{g-1}`` with ``g = gamma``; draft laws
``q_i = q(. | c, x_{<i})`` for ``i < g``; target laws ``p_i = p(. | c, x_{<i})`` for
``i <= g`` (``p_g`` is the bonus law after the whole block). Ratios ``r_i = p_i(x_i)/q_i(x_i)``.

token (Leviathan et al. 2023; Chen et al. 2023)
    accept ``x_i`` iff ``u_i < r_i`` and all earlier were accepted; at the first rejection
    ``n`` emit ``y ~ norm(max(p_n - q_n, 0))``; if all ``g`` are accepted emit ``y ~ p_g``.

block (Sun et al., "Block Verification Accelerates Speculative Decoding", arXiv 2403.10444,
Algorithm 2)
    running weights ``w_0 = 1``, ``w_i = min(w_{i-1} r_{i-1}, 1)`` for ``i = 1..g``;
    residual masses ``s_i = sum_y max(w_i p_i(y) - q_i(y), 0)`` and stopping probabilities

    .. math::  h_i = \\frac{s_i}{s_i + 1 - w_i}\\ (1 \\le i < g), \\qquad h_g = w_g;

    with ``eta_i`` uniform, the accepted length is the LARGEST ``i`` with ``eta_i < h_i``
    (0 if none; every position is tested, the scan does not stop at the first failure);
    then emit ``y ~ norm(max(w_n p_n - q_n, 0))`` if ``n < g`` (for ``n = 0`` this is the
    token residual since ``w_0 = 1``) or ``y ~ p_g`` if ``n = g``. ``0/0`` in ``h_i``
    (``s_i = 0`` and ``w_i = 1``) is read as ``h_i = 1``, as in :mod:`coupling.block`:
    then ``w_{i+1} = 1`` and ``h_{i+1} = 1``, so the stop never lands on ``i``.

This module is the batched twin of :func:`coupling.block.verify_block`: same strict
comparisons (``u < a`` with ``u`` in [0, 1)), same inverse-CDF convention for the emitted
token (first index whose float64 cumulative weight exceeds ``u * total``), same fallback
to ``p_n`` for an empty residual; fed the same uniforms it emits the same tokens.

Batching: every quantity is a ``[B]`` or ``[B, g]`` tensor; the only Python loop is the
``g``-step running minimum of the block weights. One request on a CPU (the engine's calls, on
compressed laws of a few hundred entries) is decided in numpy instead, by
``_one_request_numpy``: the same arithmetic in the same order, so the same verdict bit for bit
(token and block at any gamma), for ~0.1 ms instead of ~0.8-1.3 ms of torch dispatch;
:mod:`.multi` does the same for the multi-draft rules. Ratios, weights, residual masses
and residual CDFs are computed in float64 from the given (typically float32) probabilities.

Randomness (see :mod:`coupling.torch_backend.rng`), with ``t = positions[b]`` the absolute
position of the first drafted token: the coin of drafted offset ``i`` is
``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS)`` (``u_i`` for token, ``eta_{i+1}`` for block;
the multi-draft rules give branch ``j`` the counter ``i * MAX_DRAFTS + j``), and the token
emitted at offset ``n`` is drawn by inverse CDF from ``U(seed, t, STREAM_SAMPLE, n)``.
"""

from __future__ import annotations

import numpy as np
import torch

from ._common import (
    MAX_DRAFTS,
    Verdict,
    accept_uniforms,
    as_numpy,
    assemble,
    check_inputs,
    sample_rows,
    sample_uniforms,
)
from .rng import STREAM_ACCEPT, STREAM_SAMPLE, unit_floats

__all__ = [
    "token",
    "block",
    "draft_ratios",
    "token_accepted",
    "block_weights",
    "block_accepted",
    "emit_residual",
]


def draft_ratios(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``r[b, j, i] = p[b, j, i, x] / q[b, j, i, x]`` at the drafted ``x``,
    float64 ``[B, k, g]``."""
    x = drafts.unsqueeze(-1)  # [B, k, g, 1]
    g = drafts.shape[-1]
    px = p[:, :, :g].gather(-1, x).squeeze(-1).to(torch.float64)
    qx = q.gather(-1, x).squeeze(-1).to(torch.float64)
    return px / qx


def token_accepted(ratios: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Accepted length of token verification: leading run of ``u_i < r_i``. ``[B, g] -> [B]``."""
    return (u < ratios).to(torch.int64).cumprod(-1).sum(-1)


def block_weights(ratios: torch.Tensor) -> torch.Tensor:
    """``w[b, i]`` for ``i = 0..g``: ``w_0 = 1``, ``w_i = min(w_{i-1} r_{i-1}, 1)``.
    ``[B, g] -> [B, g+1]``."""
    B, g = ratios.shape
    w = torch.ones(B, g + 1, dtype=torch.float64, device=ratios.device)
    for i in range(g):  # sequential by definition (a clipped running product); g is small
        w[:, i + 1] = torch.clamp(w[:, i] * ratios[:, i], max=1.0)
    return w


def block_accepted(
    w: torch.Tensor, p: torch.Tensor, q: torch.Tensor, eta: torch.Tensor
) -> torch.Tensor:
    """Accepted length of block verification.

    ``w [B, g+1]``, ``p [B, g+1, V]``, ``q [B, g, V]``, ``eta [B, g]`` -> int64 ``[B]``."""
    B, g1 = w.shape
    g = g1 - 1
    if g == 0:
        return torch.zeros(B, dtype=torch.int64, device=w.device)
    h = torch.empty(B, g, dtype=torch.float64, device=w.device)
    if g > 1:
        wi = w[:, 1:g]  # [B, g-1]
        # s_i = sum_y max(w_i p_i(y) - q_i(y), 0): float64 products, float64 accumulation in
        # sequential order (a cumulative sum's last entry), the order numpy's cumsum keeps too,
        # so that one request decided in numpy gets the very same s_i
        s = (wi.unsqueeze(-1) * p[:, 1:g] - q[:, 1:g]).clamp_(min=0.0).cumsum(-1)[..., -1]
        den = s + (1.0 - wi)
        # 0/0 (w_i = 1 and p_i = q_i) reads as h_i = 1, as in coupling.block: then w_{i+1} = 1
        # and h_{i+1} = 1, so the stop never lands on i and its (empty) residual is never used
        h[:, : g - 1] = torch.where(den > 0, s / torch.where(den > 0, den, 1.0), 1.0)
    h[:, g - 1] = w[:, g]
    passed = eta < h  # [B, g]
    idx = torch.arange(1, g + 1, device=w.device, dtype=torch.int64)
    return (passed.to(torch.int64) * idx).amax(-1)


def emit_residual(
    p: torch.Tensor, q: torch.Tensor, n: torch.Tensor, w_n: torch.Tensor, u: torch.Tensor
) -> torch.Tensor:
    """Token emitted at stop position ``n``: ``norm(max(w_n p_n - q_n, 0))`` with ``q_g := 0``.

    ``p [B, g+1, V]``, ``q [B, g, V]``, ``n [B]`` in ``0..g``, ``w_n [B]`` (1 for the token rule
    and for the bonus), ``u [B]``. At ``n = g`` the weight row is ``w_g p_g``; callers pass
    ``w_n = 1`` there so the bonus is an exact sample of ``p_g``.
    """
    B, g1, V = p.shape
    g = g1 - 1
    rows = torch.arange(B, device=p.device)
    p_n = p[rows, n]  # [B, V]
    q_n = q[rows, n.clamp(max=max(g - 1, 0))] if g > 0 else torch.zeros_like(p_n)
    at_end = (n == g).unsqueeze(-1)
    wts = (w_n.to(torch.float64).unsqueeze(-1) * p_n - torch.where(at_end, 0.0, q_n)).clamp_(
        min=0.0
    )
    return sample_rows(wts, u, fallback=p_n)


def token(
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    *,
    seeds: torch.Tensor | int,
    positions: torch.Tensor | int,
    accept_u: torch.Tensor | None = None,
    sample_u: torch.Tensor | None = None,
    validate: bool = True,
    atol: float | None = None,
) -> Verdict:
    """Token-by-token speculative verification (standard speculative sampling), batched.

    Parameters
    ----------
    drafts : int64 ``[B, 1, g]`` (or ``[B, g]``)
    p : float ``[B, 1, g+1, V]`` (or ``[B, g+1, V]``): target laws along the drafted path.
    q : float ``[B, 1, g, V]`` (or ``[B, g, V]``): draft laws along the drafted path.
    seeds, positions : int64 ``[B]`` (or scalars): request seed and absolute position of
        the first drafted token; they key all randomness (batch invariance).
    accept_u, sample_u : optional float64 ``[B, g]`` / ``[B, g+1]`` overriding the keyed
        uniforms (conformance tests feed the numpy reference the same numbers).
    validate : run the value checks (see :func:`check_inputs`).

    Returns
    -------
    Verdict
    """
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, max_k=1, rule="token"
    )
    if accept_u is None and sample_u is None:
        fast = _one_request_numpy(drafts, p, q, seeds, positions)
        if fast is not None:
            return fast
    B, _, g = drafts.shape
    u = accept_uniforms(seeds, positions, g) if accept_u is None else accept_u.to(torch.float64)
    v = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    ratios = draft_ratios(drafts, p, q)[:, 0]  # [B, g]
    n = token_accepted(ratios, u)  # [B]
    rows = torch.arange(B, device=drafts.device)
    ones = torch.ones(B, dtype=torch.float64, device=drafts.device)
    y = emit_residual(p[:, 0], q[:, 0], n, ones, v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


def block(
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    *,
    seeds: torch.Tensor | int,
    positions: torch.Tensor | int,
    accept_u: torch.Tensor | None = None,
    sample_u: torch.Tensor | None = None,
    validate: bool = True,
    atol: float | None = None,
) -> Verdict:
    """Block verification (Sun et al. 2024, Algorithm 2), batched. Arguments as :func:`token`.

    ``accept_u[b, i]`` plays ``eta_{i+1}`` (the test for an accepted length of ``i+1``).
    """
    drafts, p, q, seeds, positions = check_inputs(
        drafts, p, q, seeds, positions, validate=validate, atol=atol, max_k=1, rule="block"
    )
    if accept_u is None and sample_u is None:
        fast = _one_request_numpy(drafts, p, q, seeds, positions, rule="block")
        if fast is not None:
            return fast
    B, _, g = drafts.shape
    eta = accept_uniforms(seeds, positions, g) if accept_u is None else accept_u.to(torch.float64)
    v = sample_uniforms(seeds, positions, g) if sample_u is None else sample_u.to(torch.float64)
    p1, q1 = p[:, 0], q[:, 0]
    w = block_weights(draft_ratios(drafts, p, q)[:, 0])  # [B, g+1]
    n = block_accepted(w, p1, q1, eta)  # [B]
    rows = torch.arange(B, device=drafts.device)
    w_n = torch.where(n == g, 1.0, w[rows, n])
    y = emit_residual(p1, q1, n, w_n, v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


def _one_request_numpy(
    drafts: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    rule: str = "token",
) -> Verdict | None:
    """:func:`token` or :func:`block` for one request on a CPU, in numpy: the same verdict,
    bit for bit.

    Returns ``None`` (the caller takes the batched path) unless ``B == 1`` and ``p``, ``q``
    are small float32/float64 CPU tensors. The engine verifies one request at a time on
    compressed laws (a few hundred entries), where the batched path's ~60 torch ops cost
    about 0.8 ms of dispatch against ~0.1 ms here. Every number is computed as there: the
    coins from the same keyed hashes (:func:`~coupling.torch_backend.rng.unit_floats`, which
    the batched path also takes for a few keys), the ratios ``p(x) / q(x)`` in float64, the
    same strict comparisons, for block the same clipped running product ``w_i`` and residual
    masses ``s_i`` summed in the same sequential order, the residual ``max(w_n p_n - q_n, 0)``
    in float64 with ``q_g := 0``, its cumulative sum in the same sequential order, and the
    same inverse-CDF search with the same fallback to ``p_n`` for an empty residual
    (``tests/test_torch_backend.py::test_one_request_numpy_path_is_the_batched_path``).
    """
    if rule not in ("token", "block"):
        raise ValueError(f"rule={rule!r}: the numpy path decides 'token' or 'block'")
    if drafts.shape[0] != 1 or drafts.device.type != "cpu":
        return None
    pn, qn = as_numpy(p), as_numpy(q)
    if pn is None or qn is None:
        return None
    x = drafts.numpy()[0, 0]  # [g]
    g = x.size
    seed, t = int(seeds[0]), int(positions[0])
    u = unit_floats(seed, t, STREAM_ACCEPT, range(0, g * MAX_DRAFTS, MAX_DRAFTS))
    v = unit_floats(seed, t, STREAM_SAMPLE, range(g + 1))
    at = np.arange(g)
    ratios = pn[0, 0, at, x].astype(np.float64) / qn[0, 0, at, x].astype(np.float64)
    w_n = 1.0
    if rule == "token":
        n = 0
        while n < g and u[n] < ratios[n]:
            n += 1
    else:  # block: the largest i with eta_i < h_i, as block_accepted
        w = np.ones(g + 1)
        for i in range(g):
            w[i + 1] = min(w[i] * ratios[i], 1.0)
        h = np.empty(g)
        if g > 1:
            wi = w[1:g]
            s = np.cumsum(np.maximum(wi[:, None] * pn[0, 0, 1:g] - qn[0, 0, 1:g], 0.0),
                          axis=-1)[:, -1]
            den = s + (1.0 - wi)
            h[: g - 1] = np.where(den > 0, s / np.where(den > 0, den, 1.0), 1.0)
        if g:
            h[g - 1] = w[g]
        passed = np.nonzero(np.asarray(u[:g]) < h)[0]
        n = int(passed[-1]) + 1 if passed.size else 0
        if n < g:
            w_n = float(w[n])
    p_n = pn[0, 0, n].astype(np.float64)
    wts = np.maximum(w_n * p_n - qn[0, 0, n], 0.0) if n < g else p_n
    cdf = np.cumsum(wts)
    if cdf[-1] <= 0:
        cdf = np.cumsum(p_n)
    total = cdf[-1]
    target = min(v[n] * total, np.nextafter(total, 0.0))
    y = min(int(np.searchsorted(cdf, target, side="right")), cdf.size - 1)
    tokens = x[:n].tolist() + [y] + [-1] * (g - n)
    return Verdict(
        torch.tensor([n]), torch.tensor([0]), torch.tensor([y]), torch.tensor([tokens])
    )
