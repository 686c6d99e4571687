"""Counter-based randomness keyed by (seed, position): batch- and device-invariant.

Why not one ``torch.Generator`` per request? A generator is stateful: the uniforms a
request receives would depend on how many draws earlier requests (or earlier calls)
consumed, i.e. on batching; and building ``B`` generators is a Python loop over the
batch. Instead every uniform is a *pure function* of integers

.. math::

    U(s, t, c, j) = \\big(\\lfloor h(s, t, c, j) / 2^{11} \\rfloor + \\tfrac12\\big)\\, 2^{-53}
    \\in (0, 1),

where ``s`` is the request's seed, ``t`` an absolute sequence position (the position of
the first drafted token of a verification call; for Gumbel noise, the position of the
token the noise decides), ``c`` a *stream* id (acceptance tests, residual samples, Gumbel
noise, ...; see the ``STREAM_*`` constants) and ``j`` a counter inside the stream (offset
in the block, draft index, vocabulary index). The hash chains the SplitMix64 finaliser
``m`` (Steele, Lea & Flood,
"Fast splittable pseudorandom number generators", OOPSLA 2014)::

    h = m(m(m(m(s + g) ^ (t + g)) ^ (c + g)) ^ (j + g)),   g = 0x9E3779B97F4A7C15

on wrapping uint64 arithmetic (emulated on int64 tensors; right shifts are masked to
be logical). Each stage is a bijection of its xor-ed input, so for a fixed prefix of
the key distinct ``t`` (or ``c``, ``j``) give distinct hashes. A request at position
``t`` therefore draws the same uniforms whatever the batch size, the batch order, the
device (the arithmetic is exact integer arithmetic) or the history of other requests.
Start positions strictly increase along a request, so successive verification calls of
one request never share a coin.
The uniforms lie strictly inside (0, 1) on a grid of step ``2**-53``, so ``-log(u)``
and ``-log(-log(u))`` are always finite.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

__all__ = [
    "STREAM_ACCEPT",
    "STREAM_SAMPLE",
    "STREAM_GUMBEL",
    "STREAM_DRAFT",
    "keyed_hash",
    "keyed_uniforms",
    "uniforms",
    "unit_floats",
    "gumbel_noise",
]

#: acceptance tests (one uniform per drafted position, counter = draft index)
STREAM_ACCEPT = 0
#: residual / bonus sampling by inverse CDF (counter = rule-specific sub-step)
STREAM_SAMPLE = 1
#: Gumbel noise for the Gumbel-max coupling (counter = vocabulary index)
STREAM_GUMBEL = 2
#: free for drafters that want keyed randomness of their own
STREAM_DRAFT = 3


def _signed(c: int) -> int:
    """The int64 bit pattern of the uint64 constant ``c``."""
    return c - (1 << 64) if c >= (1 << 63) else c


# the SplitMix64 constants as uint64 (Python-integer path) and as int64 bit patterns (tensors)
_GOLDEN_U, _M1_U, _M2_U = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN, _M1, _M2 = _signed(_GOLDEN_U), _signed(_M1_U), _signed(_M2_U)


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    # logical right shift on int64: torch's >> is arithmetic (sign-extending)
    return (z >> s).bitwise_and_((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser (a bijection of uint64), on int64 with wrapping products, **in
    place** on ``z`` (every caller passes a fresh tensor): one scratch tensor instead of
    eight temporaries of the size of ``z`` (a 49152-entry noise vector in 0.85x the time)."""
    t = torch.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=t)
        z.bitwise_xor_(t.bitwise_and_((1 << (64 - shift)) - 1))  # logical shift
        if mult is not None:
            z.mul_(mult)
    return z


_U64 = (1 << 64) - 1
#: keys (and key prefixes) with at most this many entries on a CPU are hashed in Python
#: integers
SMALL_PREFIX = 64


def _mix_int(z: int) -> int:
    """:func:`_mix` on a Python integer in uint64 arithmetic: the same bits."""
    z = ((z ^ (z >> 30)) * _M1_U) & _U64
    z = ((z ^ (z >> 27)) * _M2_U) & _U64
    return z ^ (z >> 31)


def _prefix_int(seed: int, position: int, stream: int) -> int:
    """``m(m(m(s + g) ^ (t + g)) ^ (c + g))`` in Python integers (uint64)."""
    g = _GOLDEN_U
    return _mix_int(_mix_int(_mix_int((seed + g) & _U64) ^ ((position + g) & _U64))
                    ^ ((stream + g) & _U64))


def _hash_int(prefix: int, counter: int) -> int:
    """The whole key's hash from its prefix's, ``m(prefix ^ (j + g))`` (uint64)."""
    return _mix_int(prefix ^ ((counter + _GOLDEN_U) & _U64))


def _unit_int(h: int) -> float:
    """:func:`_to_unit` on one uint64 hash: the top 53 bits, centred in their cell (the same
    float: ``h >> 11 < 2**53`` is exact, the ``+ 0.5`` rounds as IEEE float64 does on tensors,
    the scaling is by a power of two)."""
    return ((h >> 11) + 0.5) * 2.0**-53


def _key_prefix(seed: torch.Tensor, position: torch.Tensor,
                stream: torch.Tensor | int) -> torch.Tensor:
    """``m(m(m(s + g) ^ (t + g)) ^ (c + g))``, the hash of the key without its counter (int64,
    broadcast shape).

    Why two paths: on tensors the prefix is ~35 tiny ops (~3-5 us each on a CPU), paid for every
    hash, while a single request has one key and a few keys cost ~1 us each in Python
    integers (``benchmarks/bench_decide.py``: 7-10% of a single-draft verification call). The
    bits are the same (wrapping uint64 arithmetic either way).
    """
    stream = torch.as_tensor(stream, dtype=torch.int64, device=seed.device)
    # numpy's broadcast of shapes: torch.broadcast_shapes is Python-level and costs ~60 us
    shape = np.broadcast_shapes(seed.shape, position.shape, stream.shape)
    if seed.device.type == "cpu" and math.prod(shape) <= SMALL_PREFIX:
        s, t, c = (x.expand(shape).reshape(-1).tolist() for x in (seed, position, stream))
        out = [_prefix_int(a, b, d) for a, b, d in zip(s, t, c, strict=True)]
        return torch.tensor([_signed(h) for h in out], dtype=torch.int64).view(shape)
    h = _mix(seed + _GOLDEN)
    h = _mix(h ^ (position + _GOLDEN))
    return _mix(h ^ (stream + _GOLDEN))


def _small_keys(seed, position, stream, counter) -> tuple[tuple[int, ...], list[int]] | None:
    """The broadcast shape and the uint64 hashes in Python integers, for at most
    ``SMALL_PREFIX`` keys on a CPU (the tensor path costs ~50 tiny ops); else None."""
    keys = [torch.as_tensor(x, dtype=torch.int64, device=seed.device)
            for x in (seed, position, stream, counter)]
    shape = np.broadcast_shapes(*(x.shape for x in keys))
    if seed.device.type != "cpu" or math.prod(shape) > SMALL_PREFIX:
        return None
    cols = (x.expand(shape).reshape(-1).tolist() for x in keys)
    return tuple(shape), [_hash_int(_prefix_int(a, b, c), d)
                          for a, b, c, d in zip(*cols, strict=True)]


def keyed_hash(
    seed: torch.Tensor,
    position: torch.Tensor,
    stream: torch.Tensor | int,
    counter: torch.Tensor | int,
) -> torch.Tensor:
    """``h(seed, position, stream, counter)`` as int64 (uint64 bit pattern); broadcasts."""
    small = _small_keys(seed, position, stream, counter)
    if small is not None:
        shape, hs = small
        return torch.tensor([_signed(h) for h in hs], dtype=torch.int64).view(shape)
    return _mix(_key_prefix(seed, position, stream) ^ (counter + _GOLDEN))


def unit_floats(seed: int, position: int, stream: int, counters) -> list[float]:
    """``[U(seed, position, stream, j) for j in counters]`` for one key prefix, in Python floats.

    The bits of :func:`keyed_uniforms` with no tensor at all: a verification call of one request
    on a CPU needs a handful of coins, and the tensor path's argument handling costs ~30 small
    ops per stream there, each paying for the caches a target call has just cleared
    (:func:`uniforms` and :func:`coupling.torch_backend._common.coin_uniforms` take this path
    for a few keys).
    """
    prefix = _prefix_int(int(seed), int(position), int(stream))
    return [_unit_int(_hash_int(prefix, int(j))) for j in counters]


def _keyed_unit(seed, position, stream, counter) -> torch.Tensor:
    """``U(seed, position, stream, counter)`` float64: :func:`_to_unit` of :func:`keyed_hash`,
    in Python floats for a few keys (:func:`_unit_int`, the same bits)."""
    small = _small_keys(seed, position, stream, counter)
    if small is None:
        return _to_unit(_mix(_key_prefix(seed, position, stream) ^ (counter + _GOLDEN)))
    shape, hs = small
    return torch.tensor([_unit_int(h) for h in hs], dtype=torch.float64).view(shape)


def _to_unit(h: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    # top 53 bits, centred in their cell: strictly inside (0, 1)
    return _srl(h, 11).to(torch.float64).add_(0.5).mul_(2.0**-53).to(dtype)


def _as_key(x: torch.Tensor | int, name: str, device: torch.device | None) -> torch.Tensor:
    t = torch.as_tensor(x, device=device)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers (int64), got dtype {t.dtype}")
    return t.to(torch.int64)


def keyed_uniforms(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    stream: int,
    counter: torch.Tensor | int = 0,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Float64 uniforms ``U(seeds, positions, stream, counter)`` (broadcast shapes)."""
    dev = torch.device(device) if device is not None else None
    s = _as_key(seeds, "seeds", dev)
    t = _as_key(positions, "positions", s.device)
    c = _as_key(counter, "counter", s.device)
    return _keyed_unit(s, t, int(stream), c)


def uniforms(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    n: int,
    *,
    stream: int = STREAM_ACCEPT,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``n`` uniforms per request for one verification call.

    Returns float64 ``[B, n]`` with ``out[b, j] = U(seeds[b], positions[b], stream, j)``:
    request ``b`` verifying a block that starts at absolute position ``t`` always receives
    the same numbers, whatever the batch it is in.

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
    if s.device.type == "cpu" and max(s.numel(), t.numel()) * n <= SMALL_PREFIX:
        # a few draws (one request's call): hashed in Python floats, the same bits
        s, t = torch.broadcast_tensors(s, t)
        keys = zip(s.reshape(-1).tolist(), t.reshape(-1).tolist(), strict=True)
        return torch.tensor([unit_floats(a, b, stream, range(n)) for a, b in keys],
                            dtype=torch.float64).view(s.shape[0], n)
    j = torch.arange(n, device=s.device, dtype=torch.int64)
    return _keyed_unit(s, t, int(stream), j)


@functools.lru_cache(maxsize=8)
def _vocab_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """``arange(V) + g``, the counter part of every Gumbel key (read only; kept per V)."""
    return torch.arange(vocab_size, device=device, dtype=torch.int64) + _GOLDEN


def gumbel_noise(
    seeds: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    *,
    tokens: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Standard Gumbel noise ``G[..., v] = -log(-log U(seed, position, STREAM_GUMBEL, v))``.

    ``seeds`` and ``positions`` broadcast against each other (e.g. ``[B, 1]`` and
    ``[B, n]``); the result has their broadcast shape plus a trailing ``[V]`` axis.
    The drafter and the verifier call this with the same (seed, position) and get the
    same ``G`` bit for bit (integer hashing, then the same float ops on the same device).

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
        v = None
    else:
        v = _as_key(tokens, "tokens", s.device)
        if v.ndim != 1 or (v.numel() and (int(v.min()) < 0 or int(v.max()) >= vocab_size)):
            raise ValueError(f"tokens must be a 1-D tensor of ids in [0, {vocab_size}), got "
                             f"shape {tuple(v.shape)}")
    # hash the (seed, position, stream) prefix once per row, the vocabulary index per entry
    key = _vocab_keys(vocab_size, s.device) if tokens is None else v + _GOLDEN
    h = _mix(_key_prefix(s, t, STREAM_GUMBEL).unsqueeze(-1) ^ key)
    u = _to_unit(h, torch.float64)
    # -log(-log u) in float64 then cast: the noise is identical on every call
    return u.log_().neg_().log_().neg_().to(dtype)
