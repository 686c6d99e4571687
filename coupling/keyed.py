r"""Counter-based randomness keyed by (seed, position): batch-, device- and backend-invariant.

Why not one generator per request? A generator is stateful: the uniforms a request receives
would depend on how many draws earlier requests (or earlier calls) consumed, i.e. on batching.
Instead every uniform is a *pure function* of integers

.. math::

    U(s, t, c, j) = \big(\lfloor h(s, t, c, j) / 2^{11} \rfloor + \tfrac12\big)\, 2^{-53}
    \in (0, 1),

where ``s`` is the request's seed, ``t`` an absolute sequence position (the position of the
first drafted token of a verification call; for Gumbel noise, the position of the token the
noise decides), ``c`` a *stream* id (``STREAM_*``) and ``j`` a counter inside the stream
(offset in the block, draft index, vocabulary index). The hash chains the SplitMix64
finaliser ``m`` (Steele, Lea & Flood, "Fast splittable pseudorandom number generators",
OOPSLA 2014)::

    h = m(m(m(m(s + g) ^ (t + g)) ^ (c + g)) ^ (j + g)),   g = 0x9E3779B97F4A7C15

in wrapping uint64 arithmetic. Each stage is a bijection of its xor-ed input, so for a fixed
prefix of the key distinct ``t`` (or ``c``, ``j``) give distinct hashes. The uniforms lie
strictly inside (0, 1) on a grid of step ``2**-53`` (in float64 the top cell's centre
:math:`1 - 2^{-54}` rounds to 1, so :func:`to_unit` keeps it at :math:`1 - 2^{-53}`), so
``-log(u)`` and ``-log(-log(u))`` are always finite.

Gumbel noise: a race of exponential clocks, hashed by blocks
------------------------------------------------------------
The Gumbel-max couplings need, per (seed, position), one standard Gumbel value per token,
:math:`G_v = -\log E_v` with :math:`E_v` i.i.d. standard exponential. The clocks are built
by blocks of :data:`GUMBEL_BLOCK` = 64 consecutive tokens (the last block padded with tokens
no law reaches), by the memorylessness of the exponential law: of ``n`` i.i.d. clocks the
smallest is :math:`\mathrm{Exp}(n)`, it belongs to a uniformly random one ``J``, and the
others exceed it by i.i.d. :math:`\mathrm{Exp}(1)` amounts, all independent. So, with
``b = v // 64`` and the block's hash ``h_b = h(s, t, STREAM_GUMBEL_BLOCK, b)``,

.. math::

    E_{\min}(b) = -\log U(h_b) / 64, \qquad J_b = h_b \bmod 64, \qquad
    E_v = E_{\min}(b) + [\,v \bmod 64 \ne J_b\,]\,
          \bigl(-\log U(s, t, \mathrm{STREAM\_GUMBEL}, v)\bigr),

(``J_b`` from the hash's low six bits, which ``U`` drops). The law is exactly that of i.i.d.
clocks; what the blocks buy is a bound: no token of block ``b`` scores more than
:math:`\max_{v \in b} w_v / E_{\min}(b)` in ``argmax_v w_v / E_v`` (the Gumbel-max sample of
``w``), and token ``64 b + J_b`` attains its clock exactly. An exact argmax
(:func:`coupling.torch_backend.rng.gumbel_argmax`) hashes the tokens of the few blocks whose
bound beats the best such token, not the whole vocabulary.

The hash is written once (:func:`mix`, :func:`hash_prefix`, :func:`to_unit`) over a two-entry
array backend: numpy ``uint64`` (:data:`NUMPY`) and torch ``int64`` holding the same bit
patterns (:func:`torch_backend`, right shifts masked to be logical).

What is promised, on every CPU and device
-----------------------------------------
* **Hashes and uniforms: the same bits.** They are integer arithmetic in wrapping 64 bits and
  one exact integer-to-float conversion, so numpy and torch, any SIMD width, thread count or
  device give identical words and identical float64 uniforms (a pinned digest in
  ``tests/test_dispatch.py`` holds every machine to the same bits).
* **Gumbel noise: the same value to a few units in the last place**, not the same bits.
  ``-log(-log u)`` goes through each library's ``log``, and vectorised ``log``
  implementations (numpy's own SIMD loops, the C library's, torch's SLEEF) round differently
  in the last bit on some inputs: with numpy's SIMD loops switched off
  (``NPY_DISABLE_CPU_FEATURES``) one (seed, position) pair in five disagrees somewhere in its
  first 50 tokens, by one unit of ``max(1, |G|)``; the promise is :data:`NOISE_ULPS` units.
  A ``log`` built from exactly rounded operations alone would give the same bits everywhere,
  but as some thirty array operations where the library's is one, on the hot path of the
  Gumbel twins.
* **Decisions: the same tokens**, except where two candidates' scores lie within a few units
  in the last place of each other (a drafted or emitted token of ``gumbel``, ``gls``,
  ``minhash``; a coin within an ulp of an acceptance ratio; an inverse-CDF draw within an ulp
  of a cumulative sum, whose float order differs between numpy and torch). Under continuous
  laws such a tie has probability about ``V 2**-50`` per decision. Every rule keeps this
  promise; ``tests/test_dispatch.py`` checks it under the dispatch paths a machine can
  emulate (torch's ``ATEN_CPU_CAPABILITY``, numpy without SIMD dispatch, 1 and 2 threads).

A tie never costs losslessness: each side's decision is an exact sample of its own law; a
drafter and a verifier that break one tie differently lose one acceptance, not the law.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = [
    "STREAM_ACCEPT",
    "STREAM_SAMPLE",
    "STREAM_GUMBEL",
    "STREAM_DRAFT",
    "MAX_DRAFTS",
    "GOLDEN",
    "Backend",
    "NUMPY",
    "torch_backend",
    "mix",
    "stream_prefixes",
    "hash_prefix",
    "keyed_hash",
    "to_unit",
    "uniforms",
    "call_uniforms",
    "STREAM_GUMBEL_BLOCK",
    "GUMBEL_BLOCK",
    "gumbel_prefixes",
    "block_clocks",
    "clocks",
    "exponentials",
    "gumbel_noise",
    "NOISE_ULPS",
    "noise_gap",
]

#: acceptance tests (counter: offset * MAX_DRAFTS + branch)
STREAM_ACCEPT = 0
#: the token emitted at an offset, by inverse CDF (counter: the offset)
STREAM_SAMPLE = 1
#: Gumbel noise of the Gumbel-max coupling (counter: vocabulary index)
STREAM_GUMBEL = 2
#: free for drafters that want keyed randomness of their own
STREAM_DRAFT = 3
#: the smallest clock of each block of Gumbel keys (counter: the block, ``token // 64``)
STREAM_GUMBEL_BLOCK = 4
#: tokens per block of the Gumbel clocks (a power of two: the slot is the hash's low bits)
GUMBEL_BLOCK = 64
_BLOCK_BITS = GUMBEL_BLOCK.bit_length() - 1
#: the largest number of draft branches; coin counters are ``offset * MAX_DRAFTS + branch``
MAX_DRAFTS = 256

#: how far apart two backends' Gumbel noise may lie, in units of ``2**-52 max(1, |G|)``: each
#: ``log`` is within one unit of the exact value, and ``-log(-log u)`` carries the inner one
#: through to an absolute error (``tests/test_keyed.py`` holds both backends to it)
NOISE_ULPS = 4

#: the golden-ratio increment g of SplitMix64
GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


class Backend(NamedTuple):
    """The array operations the hash needs beyond ``^``, ``*``, ``+`` and ``&``.

    ``key(x, like=None)``: integer keys as hash words (on ``like``'s device); ``const(c)``: a
    uint64 constant as a hash word;
    ``shift(z, s, out)``: ``z >> s`` into ``out`` (arithmetic or logical: the caller masks);
    ``empty_like``; ``unit(h)``: the top 53 bits of ``h`` as float64 (exact);
    ``clip_below_one(u)``: ``u`` with 1.0 moved to the largest float64 below 1, in place;
    ``log`` and ``where``: the array library's.
    """

    key: Callable
    const: Callable
    shift: Callable
    empty_like: Callable
    unit: Callable
    clip_below_one: Callable
    log: Callable
    where: Callable


NUMPY = Backend(
    key=lambda x, like=None: np.array(x, dtype=np.uint64, ndmin=1),
    const=np.uint64,
    shift=lambda z, s, out: np.right_shift(z, np.uint64(s), out=out),
    empty_like=np.empty_like,
    unit=lambda h: (h >> np.uint64(11)).astype(np.float64),
    clip_below_one=lambda u: np.minimum(u, 1.0 - 2.0**-53, out=u),
    log=np.log,
    where=np.where,
)


def _signed(c: int) -> int:
    """The int64 bit pattern of the uint64 constant ``c``."""
    return c - (1 << 64) if c >= (1 << 63) else c


@functools.cache
def torch_backend() -> Backend:
    """The torch backend (int64 tensors holding uint64 bit patterns); imports torch."""
    import torch

    def unit(h):
        return (h >> 11).bitwise_and_((1 << 53) - 1).to(torch.float64)

    return Backend(
        key=lambda x, like=None: torch.as_tensor(
            x, dtype=torch.int64, device=None if like is None else like.device),
        const=_signed,
        shift=lambda z, s, out: torch.bitwise_right_shift(z, s, out=out),
        empty_like=torch.empty_like,
        unit=unit,
        clip_below_one=lambda u: u.clamp_(max=1.0 - 2.0**-53),
        log=torch.log,
        where=torch.where,
    )


def mix(z, xp: Backend):
    """The SplitMix64 finaliser (a bijection of uint64), **in place** on ``z`` (a fresh array):
    one scratch array instead of a temporary per operation."""
    t = xp.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        xp.shift(z, shift, t)
        t &= xp.const((1 << (64 - shift)) - 1)       # logical shift on signed words
        z ^= t
        if mult is not None:
            z *= xp.const(mult)
    return z


def _seed_position(seed, position, xp: Backend):
    """``m(m(s + g) ^ (t + g))``: the stages of a key every stream shares."""
    g = xp.const(GOLDEN)
    return mix(mix(xp.key(seed) + g, xp) ^ (xp.key(position) + g), xp)


def hash_prefix(seed, position, stream, xp: Backend):
    """``m(m(m(s + g) ^ (t + g)) ^ (c + g))``: the hash of a key without its counter
    (broadcast shape of ``seed``, ``position`` and ``stream``)."""
    return mix(_seed_position(seed, position, xp) ^ (xp.key(stream) + xp.const(GOLDEN)), xp)


def stream_prefixes(seed, position, streams, xp: Backend = NUMPY):
    """:func:`hash_prefix` for each stream of ``streams`` (a 1-D array of ids),
    ``[..., len(streams)]`` over the broadcast shape of ``seed`` and ``position``, whose stages
    are hashed once for all."""
    h = _seed_position(seed, position, xp)[..., None]
    return mix(h ^ (xp.key(streams, h) + xp.const(GOLDEN)), xp)


def keyed_hash(seed, position, stream: int, counter, xp: Backend = NUMPY):
    """``h(seed, position, stream, counter)``; the arguments broadcast."""
    return mix(hash_prefix(seed, position, stream, xp) ^ (xp.key(counter) + xp.const(GOLDEN)),
               xp)


def to_unit(h, xp: Backend = NUMPY):
    """Float64 uniforms strictly inside (0, 1): the top 53 bits, centred in their cell.

    The top cell's centre :math:`1 - 2^{-54}` is no float64 and rounds to 1 (one hash in
    :math:`2^{53}`): it is moved to the largest float below 1, where ``-log(-log(u))`` is
    finite."""
    u = xp.unit(h)                                   # a fresh float64 array: in place
    u += 0.5
    u *= 2.0**-53
    return xp.clip_below_one(u)


def uniforms(seed, position, stream: int, counter, xp: Backend = NUMPY):
    """``U(seed, position, stream, counter)`` as float64 (the arguments broadcast)."""
    return to_unit(keyed_hash(seed, position, stream, counter, xp), xp)


def call_uniforms(seed: int, position: int, gamma: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """One request's verification call in numpy: ``(coins [gamma, k], u [gamma + 1])``, the
    coin of branch ``j`` at offset ``i`` (``STREAM_ACCEPT``, counter ``i * MAX_DRAFTS + j``) and
    the draw of the token emitted at offset ``i`` (``STREAM_SAMPLE``, counter ``i``): the very
    numbers a torch twin draws for this request in any batch."""
    counters = (np.arange(gamma, dtype=np.uint64)[:, None] * np.uint64(MAX_DRAFTS)
                + np.arange(k, dtype=np.uint64)[None, :])
    coins = uniforms(seed, position, STREAM_ACCEPT, counters)
    u = uniforms(seed, position, STREAM_SAMPLE, np.arange(gamma + 1, dtype=np.uint64))
    return coins.reshape(gamma, k), u


def noise_gap(a, b) -> float:
    """The largest gap between two arrays of Gumbel noise in units of ``2**-52 max(1, |G|)``,
    the unit of :data:`NOISE_ULPS`.

    >>> noise_gap(np.array([1.0, -0.25]), np.array([1.0 + 2.0**-52, -0.25]))
    1.0
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.maximum(1.0, np.abs(a)) * 2.0**-52
    return float(np.max(np.abs(a - b) / scale, initial=0.0))


def gumbel_prefixes(seed, position, xp: Backend = NUMPY):
    """The prefixes (:func:`stream_prefixes`) of the tokens' and the blocks' Gumbel streams,
    ``(STREAM_GUMBEL, STREAM_GUMBEL_BLOCK)``, each with a trailing axis of 1."""
    both = stream_prefixes(seed, position, [STREAM_GUMBEL, STREAM_GUMBEL_BLOCK], xp)
    return both[..., :1], both[..., 1:]


def block_clocks(prefix, blocks, xp: Backend = NUMPY):
    """Each block's smallest Gumbel clock and the slot holding it, ``(E_min, J)``: float64 and
    hash words ``[..., len(blocks)]`` (``prefix``: the blocks' prefix of
    :func:`gumbel_prefixes`; module doc)."""
    h = mix(prefix ^ (xp.key(blocks) + xp.const(GOLDEN)), xp)
    e_min = xp.log(to_unit(h, xp))
    e_min *= -1.0 / GUMBEL_BLOCK                     # a power of two: exact
    return e_min, h & (GUMBEL_BLOCK - 1)


def clocks(prefix, tokens, e_min, slot, xp: Backend = NUMPY):
    """The clocks ``E_v`` of ``tokens`` given their blocks' ``(E_min, J)`` (entry for entry):
    ``E_min`` at the block's slot, ``E_min - log U(seed, position, STREAM_GUMBEL, v)``
    elsewhere (``prefix``: the tokens' prefix of :func:`gumbel_prefixes`)."""
    tokens = xp.key(tokens)
    e = xp.log(to_unit(mix(prefix ^ (tokens + xp.const(GOLDEN)), xp), xp))
    e *= -1.0
    e += e_min
    return xp.where(slot == (tokens & (GUMBEL_BLOCK - 1)), e_min, e)


def exponentials(seed, position, tokens, xp: Backend = NUMPY, *, whole: bool = False):
    """The Gumbel clocks ``E_v`` of ``tokens`` (a 1-D array of ids) at every (seed, position)
    (broadcast), float64 ``[..., len(tokens)]``.

    ``whole``: ``tokens`` is ``arange(V)``; each block is then hashed once, not once per token
    (the same bits).

    >>> e = exponentials(1, 2, np.arange(130), whole=True)
    >>> e.shape, bool(np.array_equal(e[:, 5:9], exponentials(1, 2, np.arange(5, 9))))
    ((1, 130), True)
    >>> int(np.sum(e[0, :64] == e[0, :64].min())), bool(np.all(e > 0))
    (1, True)
    """
    tokens = xp.key(tokens)
    blocks = tokens >> _BLOCK_BITS
    at_tokens, at_blocks = gumbel_prefixes(seed, position, xp)
    if whole:                   # the block of every 64th token is arange(number of blocks)
        e_min, slot = block_clocks(at_blocks, blocks[::GUMBEL_BLOCK], xp)
        e_min, slot = e_min[..., blocks], slot[..., blocks]
    else:
        e_min, slot = block_clocks(at_blocks, blocks, xp)
    return clocks(at_tokens, tokens, e_min, slot, xp)


def gumbel_noise(seed: int, positions, tokens) -> np.ndarray:
    """Standard Gumbel noise ``G = -log E`` (:func:`exponentials`) in numpy,
    ``[len(positions), len(tokens)]``: the entries of the torch twins' keyed noise vectors."""
    pos = np.asarray(positions, dtype=np.uint64).reshape(-1)
    return -np.log(exponentials(np.uint64(seed), pos, np.asarray(tokens, dtype=np.uint64)))
