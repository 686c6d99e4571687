"""The keyed randomness (:mod:`coupling.keyed`, :mod:`coupling.torch_backend.rng`).

* the hash is SplitMix64 chained over (seed, position, stream, counter): both array backends
  (numpy uint64, torch int64 bit patterns) against a plain Python transcription;
* the numpy and torch backends give identical bits for hashes, uniforms and a call's coins
  and draws, and Gumbel noise within ``keyed.NOISE_ULPS`` units in the last place (the
  promise of :mod:`coupling.keyed`), in every broadcast shape the rules use;
* the stream layout: coins ``U(s, t, STREAM_ACCEPT, i * MAX_DRAFTS + j)``, draws
  ``U(s, t, STREAM_SAMPLE, i)``, noise ``-log E_v`` with the clocks built by blocks of 64
  (``STREAM_GUMBEL_BLOCK`` for each block's minimum and slot, ``STREAM_GUMBEL`` for the
  others' excess);
* the uniforms lie strictly inside (0, 1) (so ``-log(-log u)`` is finite), look uniform and
  independent, and are fresh for every call of a request;
* the block clocks are i.i.d. Exp(1) (a control that adds the excess to the slot fails), and
  the argmax that hashes a few blocks is the full vector's.

Chi-square and Kolmogorov-Smirnov tests run at ``ALPHA = 1e-4`` with fixed keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling import keyed
from coupling.keyed import (
    MAX_DRAFTS,
    NUMPY,
    STREAM_ACCEPT,
    STREAM_GUMBEL,
    STREAM_GUMBEL_BLOCK,
    STREAM_SAMPLE,
    call_uniforms,
    keyed_hash,
    to_unit,
    torch_backend,
)
from coupling.torch_backend import gumbel_noise, keyed_uniforms, uniforms
from coupling.torch_backend.common import accept_uniforms, coin_uniforms, sample_uniforms
from coupling.torch_backend.rng import call_uniforms as torch_call_uniforms
from coupling.torch_backend.rng import gumbel_argmax

from .torch_helpers import ALPHA, chi2_pvalue

U64 = (1 << 64) - 1


def _py_splitmix_mix(z: int) -> int:
    z &= U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
    return z ^ (z >> 31)


def _py_hash(s: int, t: int, c: int, j: int) -> int:
    g = 0x9E3779B97F4A7C15
    h = _py_splitmix_mix(s + g)
    h = _py_splitmix_mix(h ^ ((t + g) & U64))
    h = _py_splitmix_mix(h ^ ((c + g) & U64))
    return _py_splitmix_mix(h ^ ((j + g) & U64))


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= (1 << 63) else x


def _torch_bits(t: torch.Tensor) -> np.ndarray:
    """The uint64 bit patterns held by an int64 tensor."""
    return t.numpy().view(np.uint64)


# ----------------------------------------------------------------------------- the hash
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_keyed_hash_matches_pure_python_uint64(backend):
    """Each backend against a plain uint64 transcription of the formula, over the whole key
    range (keys above 2**63 are negative int64 words on torch)."""
    rng = np.random.default_rng(0)
    keys = [tuple(int(v) for v in row)
            for row in rng.integers(0, 2**64, size=(200, 4), dtype=np.uint64)]
    keys += [(0, 0, 0, 0), (2**63 - 1, 1, 2, 3), (U64, 5, 0, 7), (2**63, U64, 3, U64)]
    want = [_py_hash(*k) for k in keys]
    cols = [[k[i] for k in keys] for i in range(4)]
    if backend == "numpy":
        got = keyed_hash(*(np.array(c, dtype=np.uint64) for c in cols), NUMPY)
        assert got.dtype == np.uint64
        assert [int(g) for g in got] == want
    else:
        s, t, c, j = (torch.tensor([_signed(v) for v in col], dtype=torch.int64) for col in cols)
        got = keyed_hash(s, t, c, j, torch_backend())
        assert got.dtype == torch.int64
        assert [int(g) % (1 << 64) for g in got.tolist()] == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3),
       st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3),
       st.integers(0, 3), st.integers(1, 5), st.integers(1, 4))
# a key whose noise differs in the last bit where numpy's log is the C library's (SIMD off)
@example(seeds=[17], positions=[14], stream=0, n=1, k=1)
def test_numpy_and_torch_backends_agree(seeds, positions, stream, n, k):
    """Hashes, uniforms, a call's coins and draws: bit for bit the same on both backends, in
    the broadcast shapes the rules use; Gumbel noise (full vectors and at a few tokens): within
    ``NOISE_ULPS`` units in the last place (each library's ``log`` rounds its own way), and
    the torch entries at a few tokens are the full vector's bit for bit."""
    s_np = np.array(seeds, dtype=np.uint64).reshape(-1, 1, 1)
    t_np = np.array(positions, dtype=np.uint64).reshape(1, -1, 1)
    j_np = np.arange(n, dtype=np.uint64).reshape(1, 1, -1)
    s_t, t_t, j_t = (torch.from_numpy(a.astype(np.int64)) for a in (s_np, t_np, j_np))
    xp = torch_backend()
    h_np = keyed_hash(s_np, t_np, stream, j_np)
    h_t = keyed_hash(s_t, t_t, stream, j_t, xp)
    assert h_np.shape == tuple(h_t.shape) and np.array_equal(h_np, _torch_bits(h_t))
    u_np = keyed.uniforms(s_np, t_np, stream, j_np)
    assert np.array_equal(u_np, keyed.uniforms(s_t, t_t, stream, j_t, xp).numpy())
    assert np.array_equal(u_np, keyed_uniforms(s_t, t_t, stream, j_t).numpy())
    # one call per (seed, position): the numpy call's numbers are the twins' keyed draws
    s1 = torch.tensor(seeds)
    t1 = torch.tensor(positions[:1]).expand(len(seeds))
    coins_t, u_t = coin_uniforms(s1, t1, n, k), sample_uniforms(s1, t1, n)
    both = torch_call_uniforms(s1, t1, n, k)  # the two streams hashed in one pass
    assert torch.equal(both[0], coins_t) and torch.equal(both[1], u_t)
    for b, seed in enumerate(seeds):
        coins, u = call_uniforms(seed, positions[0], n, k)
        assert np.array_equal(coins, coins_t[b].numpy()) and np.array_equal(u, u_t[b].numpy())
    # Gumbel noise keyed by (seed, position), counter = token
    tokens = np.array([0, 7, 49])
    g_t = gumbel_noise(s_t[:, :, 0], t_t[:, :, 0], 50, dtype=torch.float64)
    g_at = gumbel_noise(s_t[:, :, 0], t_t[:, :, 0], 50, tokens=torch.from_numpy(tokens),
                        dtype=torch.float64)
    assert torch.equal(g_t[..., tokens], g_at)
    for b, seed in enumerate(seeds):
        g_np = keyed.gumbel_noise(seed, positions, np.arange(50))
        assert keyed.noise_gap(g_np, g_t[b].numpy()) <= keyed.NOISE_ULPS


def test_noise_gap_measures_units_in_the_last_place():
    """The tolerance above is tight: one unit passes, a relative 1e-14 fails (the test of the
    backends' agreement can fail)."""
    g = np.array([-1.0, 0.25, 1.0])
    assert keyed.noise_gap(g, g + 2.0**-52) == 1.0
    assert keyed.noise_gap(g, g * (1 + 1e-14)) > keyed.NOISE_ULPS


# ----------------------------------------------------------------------------- the layout
def test_stream_layout_of_a_call():
    """A call's coins, draws and Gumbel noise are the keyed uniforms at the documented keys."""
    seed, pos, g, k = 12345, 678, 4, 3
    coins, u = call_uniforms(seed, pos, g, k)
    assert coins.shape == (g, k) and u.shape == (g + 1,)
    for i in range(g):
        for j in range(k):
            assert coins[i, j] == keyed.uniforms(seed, pos, STREAM_ACCEPT, i * MAX_DRAFTS + j)[0]
    assert np.array_equal(u, keyed.uniforms(seed, pos, STREAM_SAMPLE, np.arange(g + 1)))
    # the coin layout does not depend on k: branch j's coins are the same in every call width
    assert np.array_equal(call_uniforms(seed, pos, g, 1)[0], coins[:, :1])
    assert np.array_equal(call_uniforms(seed, pos, g, 1)[1], u)
    s, t = torch.tensor([seed]), torch.tensor([pos])
    assert np.array_equal(accept_uniforms(s, t, g)[0].numpy(), coins[:, 0])
    # Gumbel noise: per block of 64 tokens, the smallest clock and its slot from one hash,
    # the other clocks exceed it by -log U(seed, position, STREAM_GUMBEL, token)
    tokens = np.arange(150)
    noise = keyed.gumbel_noise(seed, [pos, pos + 1], tokens)
    for r, position in enumerate((pos, pos + 1)):
        clocks = []
        for block in range(3):
            h = keyed_hash(seed, position, STREAM_GUMBEL_BLOCK, block)
            e_min, slot = -np.log(to_unit(h)) / 64, int(h[0] % 64)
            v = tokens[64 * block:64 * block + 64]
            e = -np.log(keyed.uniforms(seed, position, STREAM_GUMBEL, v)) + e_min
            clocks.append(np.where(v % 64 == slot, e_min, e))
        assert np.array_equal(noise[r], -np.log(np.concatenate(clocks)))


def test_uniforms_are_keyed_by_seed_position_stream():
    seeds = torch.tensor([3, 3, 9, 3])
    pos = torch.tensor([10, 11, 10, 10])
    u = uniforms(seeds, pos, 5)
    assert u.dtype == torch.float64 and u.shape == (4, 5)
    assert ((u > 0) & (u < 1)).all()
    assert torch.equal(u[0], u[3])  # same key, same numbers
    # another start position or seed: fresh coins (no reuse across successive calls)
    assert not torch.isin(u[1], u[0]).any() and not torch.isin(u[2], u[0]).any()
    assert not torch.equal(u, uniforms(seeds, pos, 5, stream=1))
    # prefix-consistent in n, and the element API agrees
    assert torch.equal(uniforms(seeds, pos, 3), u[:, :3])
    assert torch.equal(keyed_uniforms(seeds[:, None], pos[:, None], 0, torch.arange(5)), u)


def test_successive_calls_draw_fresh_coins():
    """Block verification reads the coins of every drafted position, past the accepted prefix
    too, and the next call starts inside that range: keyed by the call's start position, the
    next call's coins share none with this call's."""
    u0 = uniforms(torch.tensor([1]), torch.tensor([0]), 4)
    u1 = uniforms(torch.tensor([1]), torch.tensor([1]), 4)
    assert not torch.isin(u1, u0).any()


def test_key_validation():
    with pytest.raises(ValueError, match="seeds must hold integers"):
        keyed_uniforms(torch.tensor([0.5]), 0, STREAM_ACCEPT)
    with pytest.raises(ValueError, match="positions must hold integers"):
        uniforms(torch.tensor([1]), torch.tensor([True]), 3)
    with pytest.raises(ValueError, match="n must be a non-negative int"):
        uniforms(torch.tensor([1]), torch.tensor([0]), -1)
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        gumbel_noise(torch.tensor([1]), torch.tensor([0]), 0)


# ----------------------------------------------------------------------------- the values
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_uniforms_lie_strictly_inside_the_unit_interval(backend):
    """The extreme hashes 0 and 2**64 - 1 map to 2**-54 and 1 - 2**-53: never 0 or 1, so the
    Gumbel transform ``-log(-log u)`` is finite at both ends."""
    if backend == "numpy":
        u = to_unit(np.array([0, U64], dtype=np.uint64), NUMPY)
    else:
        u = to_unit(torch.tensor([0, -1], dtype=torch.int64), torch_backend()).numpy()
    assert u.tolist() == [2.0**-54, 1.0 - 2.0**-53]
    assert np.isfinite(-np.log(-np.log(u))).all()


def test_uniforms_are_uniform_and_independent():
    seeds = torch.arange(100_000)
    u = uniforms(seeds, torch.zeros_like(seeds), 2).numpy()
    assert stats.kstest(u[:, 0], "uniform").pvalue > ALPHA
    assert stats.kstest(u[:, 1], "uniform").pvalue > ALPHA
    # pairs (u0, u1) on a 10x10 grid: independence of consecutive positions
    cells = np.floor(u * 10).astype(int)
    counts = np.bincount(cells[:, 0] * 10 + cells[:, 1], minlength=100)
    assert chi2_pvalue(counts, np.full(100, 0.01)) > ALPHA
    # a consecutive-seed structure would show up here; the hash must destroy it
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < 0.02


def test_gumbel_noise_is_standard_gumbel_and_reproducible():
    g = gumbel_noise(torch.tensor([1, 2]), torch.tensor([5, 5]), 50_000, dtype=torch.float64)
    assert g.shape == (2, 50_000)
    assert torch.equal(
        g, gumbel_noise(torch.tensor([1, 2]), torch.tensor([5, 5]), 50_000, dtype=torch.float64)
    )
    assert stats.kstest(g[0].numpy(), "gumbel_r").pvalue > ALPHA
    assert not torch.equal(g[0], g[1])


def test_gumbel_noise_at_tokens_is_the_full_vectors_entries():
    seeds, pos = torch.tensor([3, 4])[:, None], torch.tensor([7, 9, 11])[None]      # -> [2, 3]
    full = gumbel_noise(seeds, pos, 1000, dtype=torch.float64)
    tokens = torch.tensor([0, 5, 17, 999])
    at = gumbel_noise(seeds, pos, 1000, tokens=tokens, dtype=torch.float64)
    assert at.shape == (2, 3, 4) and torch.equal(at, full[..., tokens])
    assert gumbel_noise(seeds, pos, 1000, tokens=tokens[:0]).shape == (2, 3, 0)
    for bad in (torch.tensor([1000]), torch.tensor([-1]), torch.tensor([[1]]),
                torch.tensor([0.5])):
        with pytest.raises(ValueError, match="tokens"):
            gumbel_noise(seeds, pos, 1000, tokens=bad)


# ------------------------------------------------------------- Gumbel clocks built by blocks
def _block_statistics(E: np.ndarray) -> list[float]:
    """p-values that the clocks ``E [n, 64]`` of one block under ``n`` keys are i.i.d.
    standard exponential: the pooled marginal, the block minimum times 64 (Exp(1)), the
    winning slot (uniform), and two slots jointly (independent, a 10 x 10 grid)."""
    u = np.exp(-E)                                    # uniform if E is Exp(1)
    cells = np.floor(u[:, [3, 40]] * 10).astype(int)
    pair = np.bincount(cells[:, 0] * 10 + cells[:, 1], minlength=100)
    return [stats.kstest(E.ravel(), "expon").pvalue,
            stats.kstest(E.min(1) * 64, "expon").pvalue,
            chi2_pvalue(np.bincount(E.argmin(1), minlength=64), np.full(64, 1 / 64)),
            chi2_pvalue(pair, np.full(100, 0.01))]


def test_block_clocks_are_iid_exponential():
    """Memorylessness makes the blocks' clocks i.i.d. Exp(1): each of four tests at level
    ``ALPHA`` (fixed keys), on a block of the vocabulary's interior and on the padded last
    block. The control, which adds the excess to the slot's clock too, fails."""
    seeds = np.arange(40_000, dtype=np.uint64)
    for tokens in (np.arange(128, 192), np.arange(1000, 1064)):
        E = keyed.exponentials(seeds, np.uint64(11), tokens)
        assert min(_block_statistics(E)) > ALPHA
    _, at_blocks = keyed.gumbel_prefixes(seeds, np.uint64(11))
    e_min, _ = keyed.block_clocks(at_blocks, np.array([2], dtype=np.uint64))
    excess = -np.log(keyed.uniforms(seeds[:, None], np.uint64(11), STREAM_GUMBEL,
                                    np.arange(128, 192)))
    assert min(_block_statistics(e_min + excess)) < 1e-12


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(0, 2**32), st.sampled_from(["dense", "sparse", "flat"]))
def test_gumbel_argmax_is_the_full_vectors_argmax(V, seed, kind):
    """The pruned argmax hashes a few blocks and returns the full vector's ``argmax(log w + G)``
    on dense, sparse (most entries 0, padded last blocks) and flat weights."""
    gen = torch.Generator().manual_seed(seed)
    R = 5
    w = torch.softmax(3 * torch.randn(R, V, generator=gen), -1)
    if kind == "sparse":
        w = w * (torch.rand(R, V, generator=gen) < 0.05)
        w[:, V - 1] += 1e-3                           # every row keeps some mass
    elif kind == "flat":
        w = torch.ones(R, V)
    s = torch.randint(0, 2**40, (R,), generator=gen)
    t = torch.randint(0, 2**20, (R,), generator=gen)
    full = (w.double().log() + gumbel_noise(s, t, V, dtype=torch.float64)).argmax(-1)
    assert torch.equal(gumbel_argmax(w, s, t), full)
    assert torch.equal(gumbel_argmax(w.to(torch.bfloat16), s, t),
                       (w.to(torch.bfloat16).double().log()
                        + gumbel_noise(s, t, V, dtype=torch.float64)).argmax(-1))


def test_gumbel_argmax_at_a_real_vocabulary():
    """Softmax laws over Gemma 3's vocabulary and one point mass: the full vector's argmax."""
    V, R = 262_144, 4
    w = torch.softmax(3 * torch.randn(R, V, generator=torch.Generator().manual_seed(3)), -1)
    w[3] = 0.0
    w[3, V - 5] = 1.0
    s, t = torch.arange(R), torch.arange(R) + 100
    full = (w.double().log() + gumbel_noise(s, t, V, dtype=torch.float64)).argmax(-1)
    assert torch.equal(gumbel_argmax(w, s, t), full) and int(full[3]) == V - 5


def test_gumbel_argmax_refuses_bad_input():
    s = torch.tensor([1, 2])
    with pytest.raises(ValueError, match="weights must be a floating tensor"):
        gumbel_argmax(torch.ones(2, 3, dtype=torch.int64), s, s)
    with pytest.raises(ValueError, match="weights must be a floating tensor"):
        gumbel_argmax(torch.ones(2, 0), s, s)
    with pytest.raises(ValueError, match="seeds and positions must be int64 tensors"):
        gumbel_argmax(torch.ones(3, 5), s, s)
    for bad in (torch.zeros(2, 70), torch.full((2, 70), float("nan"))):
        with pytest.raises(ValueError, match="no positive finite entry"):
            gumbel_argmax(bad, s, s)
