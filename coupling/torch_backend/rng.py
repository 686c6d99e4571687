"""Keyed uniforms and Gumbel noise as torch tensors: :mod:`coupling.keyed` on the torch backend.

Every number is a pure function of ``(seed, position, stream, counter)``, so a request draws the
same uniforms whatever the batch it is verified in, the batch order, the device or the history
of other requests, and the same bits as the numpy cores fed by :func:`coupling.keyed.uniforms`
(Gumbel noise: the same value within ``keyed.NOISE_ULPS`` units in the last place, the promise
of :mod:`coupling.keyed`).
"""

from __future__ import annotations

import functools

import torch

from .. import keyed
from ..keyed import MAX_DRAFTS, STREAM_ACCEPT, STREAM_DRAFT, STREAM_GUMBEL, STREAM_SAMPLE

__all__ = [
    "STREAM_ACCEPT",
    "STREAM_SAMPLE",
    "STREAM_GUMBEL",
    "STREAM_DRAFT",
    "keyed_uniforms",
    "uniforms",
    "call_uniforms",
    "gumbel_noise",
    "gumbel_argmax",
]


def _as_key(x: torch.Tensor | int, name: str, device: torch.device | None) -> torch.Tensor:
    t = torch.as_tensor(x, device=device)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers (int64), got dtype {t.dtype}")
    return t.to(torch.int64)


def keyed_uniforms(seeds: torch.Tensor, positions: torch.Tensor, stream: int,
                   counter: torch.Tensor | int = 0, *,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """Float64 uniforms ``U(seeds, positions, stream, counter)`` (broadcast shapes)."""
    dev = torch.device(device) if device is not None else None
    s = _as_key(seeds, "seeds", dev)
    t = _as_key(positions, "positions", s.device)
    c = _as_key(counter, "counter", s.device)
    return keyed.uniforms(s, t, int(stream), c, keyed.torch_backend())


def uniforms(seeds: torch.Tensor, positions: torch.Tensor, n: int, *,
             stream: int = STREAM_ACCEPT,
             device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` uniforms per request for one verification call: float64 ``[B, n]`` with
    ``out[b, j] = U(seeds[b], positions[b], stream, j)``.

    Why the call's start position and not each token's own position: block verification
    looks at the coins of *every* drafted position, including those past the accepted
    prefix, and the next call starts inside that range. Keying by (start, offset) gives
    every call fresh coins (start positions strictly increase along a request), so no
    coin that influenced one decision is reused by a later one.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    dev = torch.device(device) if device is not None else None
    s = _as_key(seeds, "seeds", dev).reshape(-1, 1)
    t = _as_key(positions, "positions", s.device).reshape(-1, 1)
    j = torch.arange(n, device=s.device, dtype=torch.int64)
    return keyed.uniforms(s, t, int(stream), j, keyed.torch_backend())


def call_uniforms(seeds: torch.Tensor, positions: torch.Tensor, g: int,
                  k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A verification call's numbers for each request, hashed in one pass: ``coins [B, g, k]``,
    ``U(seed, t, STREAM_ACCEPT, i * MAX_DRAFTS + j)``, and ``u [B, g + 1]``,
    ``U(seed, t, STREAM_SAMPLE, i)``, float64 (``seeds``, ``positions`` int64 ``[B]``).

    The bits of :func:`uniforms` and :func:`keyed_uniforms` at those keys, and of the numpy
    :func:`coupling.keyed.call_uniforms`: the two streams share the hash's (seed, position)
    stages, so each is hashed once per request (a call of a few requests costs a few dozen
    small tensor operations, not twice that).
    """
    xp = keyed.torch_backend()
    s = _as_key(seeds, "seeds", None).reshape(-1)
    t = _as_key(positions, "positions", s.device).reshape(-1)
    streams, counters = _call_keys(g, k, s.device)
    h = keyed.stream_prefixes(s, t, streams, xp)  # [B, 2]: the two streams' prefixes
    B, n = h.shape[0], g * k
    prefix = torch.cat([h[:, :1].expand(B, n), h[:, 1:].expand(B, g + 1)], 1)
    u = keyed.to_unit(keyed.mix(prefix ^ counters, xp), xp)
    return u[:, :n].reshape(B, g, k), u[:, n:]


@functools.lru_cache(maxsize=64)
def _call_keys(g: int, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The streams of :func:`call_uniforms` and its counter words (``key + GOLDEN``), read
    only: ``[2]`` (accept, sample) and ``[g k + g + 1]`` (the coins' counters, then the
    draws')."""
    gold = keyed.torch_backend().const(keyed.GOLDEN)
    streams = torch.tensor([STREAM_ACCEPT, STREAM_SAMPLE], dtype=torch.int64, device=device)
    i = torch.arange(g, device=device, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(k, device=device, dtype=torch.int64)
    counters = torch.cat([(i * MAX_DRAFTS + j).flatten(),
                          torch.arange(g + 1, device=device, dtype=torch.int64)])
    return streams, counters + gold


@functools.lru_cache(maxsize=8)
def _vocab(vocab_size: int, device: torch.device) -> torch.Tensor:
    """``arange(V)``, the counter of every Gumbel key (read only; kept per V)."""
    return torch.arange(vocab_size, device=device, dtype=torch.int64)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, *,
                 tokens: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """Standard Gumbel noise ``G[..., v] = -log E_v``, the keyed clocks of
    :func:`coupling.keyed.exponentials` at (seed, position).

    ``seeds`` and ``positions`` broadcast against each other (e.g. ``[B, 1]`` and ``[B, n]``);
    the result has their broadcast shape plus a trailing ``[V]`` axis. A drafter and a verifier
    that call this with the same (seed, position) on one device get the same ``G`` bit for bit
    (numpy's :func:`coupling.keyed.gumbel_noise`: within ``keyed.NOISE_ULPS`` units).

    ``tokens``: optional int64 ``[n]`` token ids in ``[0, V)``; the trailing axis is then
    ``[n]`` with ``G[..., j] = G(seed, position, tokens[j])``, the very entries of the full
    vector. A law supported on a few tokens needs the noise only there (``argmax log p + G``
    never picks a token with ``p = 0``), at a fraction of the cost of all ``V``.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    dev = torch.device(device) if device is not None else None
    s = _as_key(seeds, "seeds", dev)
    t = _as_key(positions, "positions", s.device)
    s, t = torch.broadcast_tensors(s, t)
    if tokens is None:
        v = _vocab(vocab_size, s.device)
    else:
        v = _as_key(tokens, "tokens", s.device)
        if v.ndim != 1 or (v.numel() and (int(v.min()) < 0 or int(v.max()) >= vocab_size)):
            raise ValueError(f"tokens must be a 1-D tensor of ids in [0, {vocab_size}), got "
                             f"shape {tuple(v.shape)}")
    E = keyed.exponentials(s, t, v, keyed.torch_backend(), whole=tokens is None)
    # -log E in float64 then cast: the noise is identical on every call
    return E.log_().neg_().to(dtype)


def gumbel_argmax(weights: torch.Tensor, seeds: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
    """The keyed Gumbel-max sample of each row: ``argmax_v log w[r, v] + G(seeds[r],
    positions[r], v)``, i.e. ``argmax_v w[r, v] / E_v`` (:func:`coupling.keyed.exponentials`),
    without hashing the whole vocabulary.

    ``weights``: ``[R, V]``, non-negative, each row with some positive entry (any positive
    multiple of a law gives the same token); ``seeds``, ``positions``: int64 ``[R]``. Returns
    int64 ``[R]``.

    Each block of 64 tokens is bounded by ``max_v w_v / E_min(b)``, and its slot ``J_b``'s
    score ``w / E_min(b)`` is exact; the blocks whose bound reaches the best slot score are the
    only ones that can hold the winner, and only their tokens are hashed. The float64
    quotients are monotone in ``w`` and ``E`` as rounded, so the bound holds as computed: the
    token is the full vector's argmax of ``w / E`` (first index on exact ties), and that of
    ``log w + G`` unless two scores lie within a few units in the last place.
    """
    if not isinstance(weights, torch.Tensor) or weights.ndim != 2 \
            or not weights.dtype.is_floating_point or weights.shape[1] == 0:
        raise ValueError("weights must be a floating tensor [R, V] with V >= 1, got "
                         f"{getattr(weights, 'shape', type(weights))}")
    R, V = weights.shape
    if tuple(seeds.shape) != (R,) or tuple(positions.shape) != (R,):
        raise ValueError(f"seeds and positions must be int64 tensors [R] = [{R}], got "
                         f"{tuple(seeds.shape)} and {tuple(positions.shape)}")
    n = keyed.GUMBEL_BLOCK
    xp = keyed.torch_backend()
    at_tokens, at_blocks = keyed.gumbel_prefixes(seeds.to(torch.int64),
                                                 positions.to(torch.int64), xp)  # [R, 1]
    full = V // n
    top = weights[:, :full * n].reshape(R, full, n).amax(-1)                 # [R, nb]
    if V > full * n:
        top = torch.cat([top, weights[:, full * n:].amax(-1, keepdim=True)], 1)
    nb = top.shape[1]
    e_min, slot = keyed.block_clocks(at_blocks, _vocab(nb, weights.device), xp)  # [R, nb]
    bound = top.to(torch.float64) / e_min
    at_slot = _vocab(nb, weights.device) * n + slot                          # [R, nb]
    w_slot = weights.gather(1, at_slot.clamp(max=V - 1)).to(torch.float64)
    w_slot.masked_fill_(at_slot >= V, 0.0)                                   # padding tokens
    best = (w_slot / e_min).amax(1, keepdim=True)                            # [R, 1]
    row, blk = ((bound >= best) & (top > 0)).nonzero(as_tuple=True)          # [P]
    tok = blk.unsqueeze(1) * n + _vocab(n, weights.device)                   # [P, 64]
    E = keyed.clocks(at_tokens[row], tok, e_min[row, blk].unsqueeze(1),
                     slot[row, blk].unsqueeze(1), xp)
    inside = tok < V
    w = weights[row.unsqueeze(1), tok.clamp(max=V - 1)].to(torch.float64)
    score = (w / E).masked_fill_(~inside, -1.0)
    val, idx = score.max(1)                                                  # [P]
    row_best = torch.full((R,), -1.0, dtype=torch.float64, device=weights.device)
    row_best.scatter_reduce_(0, row, val, "amax")
    winner = torch.where(val == row_best[row], blk * n + idx, V)
    out = torch.full((R,), V, dtype=torch.int64, device=weights.device)
    out.scatter_reduce_(0, row, winner, "amin")
    if bool((out == V).any()):          # the nonzero above synced already: no extra wait
        raise ValueError("weights: some row has no positive finite entry; pass non-negative "
                         "weights with some mass in every row")
    return out
