"""Conformance of the batched torch verifiers (coupling.torch_backend) with the numpy references.

What is checked, and how strongly
---------------------------------
* coin for coin: fed the same uniforms, ``token``/``block`` make exactly the decisions of
  :func:`coupling.block.verify_block` (accepted length AND emitted token);
* exact per-path law: over 200k keyed draws of one drafted path, the joint frequency of
  (accepted length, emitted token) matches :func:`coupling.block.path_law` (chi-square);
* whole-stream losslessness: batched speculative decoding of 200k requests with tabular
  models (V=4, gamma=2) emits first-3-token strings with the target's exact law
  (:func:`coupling.block.target_law`), by chi-square; a deliberately broken twin must fail;
* batch invariance (sub-batches, permutations, duplicates), float32 == float64 decisions,
  input validation, the keyed RNG against a pure-Python SplitMix64.

Every chi-square test runs at a stated false-positive rate ``ALPHA = 1e-4`` (fixed seeds make
each run deterministic; ALPHA is the a-priori chance that a correct sampler fails it).
Outcomes of probability 0 must have count 0 (checked separately from the chi-square).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling import block as nb
from coupling.torch_backend import (
    Verdict,
    block,
    gumbel_noise,
    keyed_uniforms,
    token,
    uniforms,
    verify,
)
from coupling.torch_backend import rng as rng_mod
from coupling.torch_backend._common import (
    accept_uniforms,
    assemble,
    coin_uniforms,
    sample_rows,
    sample_uniforms,
)
from coupling.torch_backend.chain import (
    block_accepted,
    block_weights,
    draft_ratios,
    emit_residual,
    token_accepted,
)
from coupling.torch_backend.rng import keyed_hash

ALPHA = 1e-4
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ----------------------------------------------------------------------------- helpers
def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square goodness-of-fit p-value; 0.0 if an outcome of probability 0 was observed.

    Cells with expected count below ``min_expected`` are pooled into one cell so the
    chi-square approximation holds.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    impossible = probs <= 1e-15
    if counts[impossible].sum() > 0:  # no sampling noise explains an impossible outcome
        return 0.0
    exp = probs * n
    small = (exp < min_expected) & ~impossible
    big = ~small & ~impossible
    obs = list(counts[big])
    ex = list(exp[big])
    if small.any():
        obs.append(counts[small].sum())
        ex.append(exp[small].sum())
    obs, ex = np.array(obs), np.array(ex)
    ex *= obs.sum() / ex.sum()  # remove float dust in the normalisation
    if obs.size < 2:
        return 1.0
    return float(stats.chisquare(obs, ex).pvalue)


def random_path(
    rng: np.random.Generator, V: int, gamma: int, alpha: float = 0.5, zeros: bool = False
):
    """A random drafted path with Dirichlet target/draft laws (optionally with exact zeros)."""
    P = rng.dirichlet(np.full(V, alpha), size=gamma + 1)
    Q = rng.dirichlet(np.full(V, alpha), size=gamma)
    if zeros:
        P = np.where(rng.random(P.shape) < 0.3, 0.0, P)
        Q = np.where(rng.random(Q.shape) < 0.3, 0.0, Q)
        P[:, 0] += 1e-3
        Q[:, 0] += 1e-3
        P /= P.sum(1, keepdims=True)
        Q /= Q.sum(1, keepdims=True)
    x = np.array([rng.choice(V, p=Q[i]) for i in range(gamma)], dtype=np.int64)
    return x, P, Q


def stack_paths(paths, dtype=torch.float64, device="cpu"):
    x = torch.tensor(np.stack([a for a, _, _ in paths]), device=device)[:, None]
    P = torch.tensor(np.stack([b for _, b, _ in paths]), dtype=dtype, device=device)[:, None]
    Q = torch.tensor(np.stack([c for _, _, c in paths]), dtype=dtype, device=device)[:, None]
    return x, P, Q


def broken_token(drafts, p, q, *, seeds, positions, **kw) -> Verdict:
    """Negative control: token verification that resamples from p (no residual) on rejection."""
    x, p1 = drafts[:, 0], p[:, 0]
    B, g = x.shape
    u = accept_uniforms(seeds, positions, g)
    v = sample_uniforms(seeds, positions, g)
    n = token_accepted(draft_ratios(drafts, p, q)[:, 0], u)
    rows = torch.arange(B)
    y = sample_rows(p1[rows, n], v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


def broken_block(drafts, p, q, *, seeds, positions, **kw) -> Verdict:
    """Negative control: block verification's accepted length with the plain token residual."""
    x, p1, q1 = drafts[:, 0], p[:, 0], q[:, 0]
    B, g = x.shape
    eta = accept_uniforms(seeds, positions, g)
    v = sample_uniforms(seeds, positions, g)
    w = block_weights(draft_ratios(drafts, p, q)[:, 0])
    n = block_accepted(w, p1, q1, eta)
    rows = torch.arange(B)
    y = emit_residual(p1, q1, n, torch.ones(B, dtype=torch.float64), v[rows, n])
    return assemble(drafts, n, torch.zeros_like(n), y)


class BatchedTabular:
    """Vectorised lookup of a :class:`coupling.block.TabularLM` for B contexts at once."""

    def __init__(self, lm: nb.TabularLM, dtype=torch.float64):
        self.V, self.order = lm.vocab_size, lm.order
        self.table = torch.tensor(lm.table.reshape(-1, self.V), dtype=dtype)

    def start(self, B: int) -> torch.Tensor:
        return torch.full((B, self.order), self.V, dtype=torch.int64)  # BOS padding

    def push(
        self, tail: torch.Tensor, tok: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.order == 0:
            return tail
        new = torch.cat([tail[:, 1:], tok[:, None]], 1)
        return new if mask is None else torch.where(mask[:, None], new, tail)

    def laws(self, tail: torch.Tensor) -> torch.Tensor:
        if self.order == 0:
            return self.table[0].expand(tail.shape[0], -1)
        key = torch.zeros(tail.shape[0], dtype=torch.int64)
        for j in range(self.order):
            key = key * (self.V + 1) + tail[:, j]
        return self.table[key]


def simulate_stream(
    verifier, target, draft, gamma: int, length: int, B: int, seed: int, dtype=torch.float64
) -> torch.Tensor:
    """Batched speculative decoding from the empty context until >= ``length`` tokens.

    Returns the first ``length`` tokens of each of the ``B`` requests, ``[B, length]``."""
    T, D = BatchedTabular(target, dtype), BatchedTabular(draft, dtype)
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((B, length * (gamma + 2)), -1, dtype=torch.int64)
    n = torch.zeros(B, dtype=torch.int64)
    tt, td = T.start(B), D.start(B)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * seed
    rows = torch.arange(B)
    while bool((n < length).any()):
        xs, qs, ps = [], [], []
        a, b = tt, td
        for _ in range(gamma):
            qi = D.laws(b)
            xi = sample_rows(qi, torch.rand(B, generator=gen, dtype=torch.float64))
            ps.append(T.laws(a))
            qs.append(qi)
            xs.append(xi)
            a, b = T.push(a, xi), D.push(b, xi)
        ps.append(T.laws(a))
        x = torch.stack(xs, 1)[:, None]
        P = torch.stack(ps, 1)[:, None]
        Q = torch.stack(qs, 1)[:, None]
        ver = verifier(x, P, Q, seeds=seeds, positions=n)
        for j in range(gamma + 1):
            m = ver.tokens[:, j] >= 0
            out[rows[m], (n + j)[m]] = ver.tokens[m, j]
            tt, td = T.push(tt, ver.tokens[:, j], m), D.push(td, ver.tokens[:, j], m)
        n = n + ver.accepted + 1
    return out[:, :length]


def string_counts(tokens: torch.Tensor, V: int) -> np.ndarray:
    L = tokens.shape[1]
    idx = torch.zeros(tokens.shape[0], dtype=torch.int64)
    for j in range(L):
        idx = idx * V + tokens[:, j]
    return np.bincount(idx.numpy(), minlength=V**L)


# ----------------------------------------------------------------------------- RNG
def _py_splitmix_mix(z: int) -> int:
    m = (1 << 64) - 1
    z &= m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def _py_hash(s: int, t: int, c: int, j: int) -> int:
    g, m = 0x9E3779B97F4A7C15, (1 << 64) - 1
    h = _py_splitmix_mix(s + g)
    h = _py_splitmix_mix(h ^ ((t + g) & m))
    h = _py_splitmix_mix(h ^ ((c + g) & m))
    return _py_splitmix_mix(h ^ ((j + g) & m))


@pytest.mark.parametrize("small_prefix", [0, 10**6])
def test_keyed_hash_matches_pure_python_uint64(small_prefix, monkeypatch):
    """Both ways of hashing the key prefix (tensor ops; Python integers for a few keys on a
    CPU) against a plain uint64 transcription of the formula."""
    monkeypatch.setattr(rng_mod, "SMALL_PREFIX", small_prefix)
    rng = np.random.default_rng(0)
    keys = [
        (int(a), int(b), int(c), int(d)) for a, b, c, d in rng.integers(0, 2**62, size=(200, 4))
    ]
    keys += [(0, 0, 0, 0), (2**63 - 1, 1, 2, 3), (-1, 5, 0, 7)]
    s, t, c, j = (torch.tensor([k[i] for k in keys], dtype=torch.int64) for i in range(4))
    got = keyed_hash(s, t, c, j).tolist()
    want = [_py_hash(*k) for k in keys]
    assert [g % (1 << 64) for g in got] == want


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
       st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
       st.integers(0, 3), st.integers(1, 5))
def test_small_key_prefixes_hash_like_the_tensor_path(seeds, positions, stream, n):
    """The Python-integer keys and prefixes (few keys on a CPU) give the tensor path's bits,
    for hashes, uniforms, acceptance coins, residual draws and Gumbel noise, in every broadcast
    shape the rules use."""
    s = torch.tensor(seeds).view(-1, 1, 1)
    t = torch.tensor(positions).view(1, -1, 1)
    j = torch.arange(n).view(1, 1, -1)

    def draw():
        s1, t1 = s[:, 0, 0], t[0, :1, 0].expand(s.shape[0])
        return (keyed_hash(s, t, stream, j), keyed_uniforms(s, t, stream, j),
                uniforms(s1, t1, n, stream=stream),
                gumbel_noise(s[:, :, 0], t[:, :, 0], 50, tokens=torch.tensor([0, 7, 49])),
                coin_uniforms(s1, t1, n, 2), coin_uniforms(s1, t1, 0, 1),
                sample_uniforms(s1, t1, n))

    fast = draw()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rng_mod, "SMALL_PREFIX", 0)
        slow = draw()
    for a, b in zip(fast, slow, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


@settings(max_examples=150, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(0, 3),
       st.lists(st.integers(0, 2**40), min_size=0, max_size=6))
def test_unit_floats_are_the_keyed_uniforms_bit_for_bit(seed, position, stream, counters):
    """rng.unit_floats (one request's coins in Python floats, what the engine's adapter hands
    the token and block rules) returns the tensor path's uniforms exactly."""
    got = rng_mod.unit_floats(seed, position, stream, counters)
    want = keyed_uniforms(torch.tensor(seed), torch.tensor(position), stream,
                          torch.tensor(counters, dtype=torch.int64)).tolist()
    assert got == want
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rng_mod, "SMALL_PREFIX", 0)         # the all-tensor hash, too
        assert got == keyed_uniforms(torch.tensor(seed), torch.tensor(position), stream,
                                     torch.tensor(counters, dtype=torch.int64)).tolist()


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


def test_block_uses_fresh_coins_per_call():
    """Regression: keying block verification's coins by each token's own position reuses,
    in the next call, coins that already failed (block looks at every position); the
    stream test caught it. Coins are keyed by the call's start position instead."""
    u0 = uniforms(torch.tensor([1]), torch.tensor([0]), 4)
    u1 = uniforms(torch.tensor([1]), torch.tensor([1]), 4)
    assert not torch.isin(u1, u0).any()


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


# ----------------------------------------------------------------------------- coin for coin
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("zeros", [False, True])
def test_same_uniforms_same_decisions_as_numpy(rule, zeros):
    rng = np.random.default_rng(1 if zeros else 2)
    for V, gamma in [(2, 1), (3, 2), (5, 4), (8, 6)]:
        B = 150
        paths = [random_path(rng, V, gamma, alpha=0.3, zeros=zeros) for _ in range(B)]
        x, P, Q = stack_paths(paths)
        au = torch.tensor(rng.random((B, gamma)))
        su = torch.tensor(rng.random(B))[:, None].expand(B, gamma + 1)
        fn = token if rule == "token" else block
        ver = fn(x, P, Q, seeds=0, positions=0, accept_u=au, sample_u=su)
        for b, (xb, Pb, Qb) in enumerate(paths):
            n_ref = nb.accepted_length(rule, xb, Pb, Qb, au[b].numpy())
            out_ref = nb.verify_block(
                rule, xb, Pb, Qb, uniforms=np.r_[au[b].numpy(), su[b, 0].item()]
            )
            assert int(ver.accepted[b]) == n_ref
            got = ver.tokens[b][: n_ref + 1].tolist()
            assert got == out_ref.tolist(), (rule, V, gamma, b)
            assert (ver.tokens[b][n_ref + 1 :] == -1).all()


def test_block_weights_match_numpy():
    rng = np.random.default_rng(3)
    paths = [random_path(rng, 6, 5, alpha=0.4) for _ in range(50)]
    x, P, Q = stack_paths(paths)
    w = block_weights(draft_ratios(x, P, Q)[:, 0])
    for b, (xb, Pb, Qb) in enumerate(paths):
        w_ref, _ = nb.block_weights(xb, Pb, Qb)
        np.testing.assert_allclose(w[b].numpy(), w_ref, rtol=1e-14, atol=0)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_float32_inputs_decide_like_their_float64_values(rule):
    """All decisions are computed in float64: float32 probabilities give the decisions of
    their exact float64 values (no float32 arithmetic on the decision path)."""
    rng = np.random.default_rng(4)
    paths = [random_path(rng, 64, 5, alpha=0.2) for _ in range(300)]
    x, P, Q = stack_paths(paths, dtype=torch.float32)
    fn = token if rule == "token" else block
    seeds = torch.arange(300)
    a = fn(x, P, Q, seeds=seeds, positions=7)
    b = fn(x, P.double(), Q.double(), seeds=seeds, positions=7, atol=1e-4)
    assert torch.equal(a.tokens, b.tokens)


# ----------------------------------------------------------------------------- exact laws
def _path_counts(fn, x, P, Q, B, seed_offset=0):
    """Verify one path B times under B distinct seeds; return counts over (tau, y)."""
    g, V = x.size, P.shape[1]
    xs = torch.tensor(x)[None, None].expand(B, 1, g)
    Ps = torch.tensor(P)[None, None].expand(B, 1, g + 1, V)
    Qs = torch.tensor(Q)[None, None].expand(B, 1, g, V)
    ver = fn(xs, Ps, Qs, seeds=torch.arange(B) + seed_offset, positions=0)
    cell = ver.accepted * V + ver.next_token
    return np.bincount(cell.numpy(), minlength=(g + 1) * V)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_per_path_law_matches_numpy_path_law(rule):
    rng = np.random.default_rng(5)
    fn = token if rule == "token" else block
    for V, g in [(3, 3), (5, 4)]:
        x, P, Q = random_path(rng, V, g, alpha=0.7)
        tau, nxt = nb.path_law(rule, x, P, Q)
        counts = _path_counts(fn, x, P, Q, 200_000)
        assert chi2_pvalue(counts, (tau[:, None] * nxt).ravel()) > ALPHA


def test_per_path_law_negative_control_fails():
    # block verification with the token residual: the emitted token law after a stop is wrong
    rng = np.random.default_rng(5)
    for V, g in [(3, 3), (5, 4)]:
        x, P, Q = random_path(rng, V, g, alpha=0.7)
        tau, nxt = nb.path_law("block", x, P, Q)
        counts = _path_counts(broken_block, x, P, Q, 200_000)
        assert chi2_pvalue(counts, (tau[:, None] * nxt).ravel()) < ALPHA


@pytest.fixture(scope="module")
def tabular_pair():
    # order-1 models that disagree a lot (small Dirichlet concentration)
    return nb.TabularLM(4, order=1, seed=11, concentration=0.6), nb.TabularLM(
        4, order=1, seed=12, concentration=0.6
    )


@pytest.mark.parametrize("rule", ["token", "block"])
def test_stream_is_lossless_200k_requests(rule, tabular_pair):
    """Batched decoding of 200k requests, V=4, gamma=2: the first 3 emitted tokens have the
    target's exact law (64 strings), chi-square at ALPHA; the exact stream law of the numpy
    reference equals it too (TV < 1e-12), so both implementations agree with the target."""
    target, draft = tabular_pair
    exact = nb.target_law(target, 3)
    assert np.abs(nb.stream_law(rule, target, draft, 2, 3) - exact).sum() / 2 < 1e-12
    fn = token if rule == "token" else block
    toks = simulate_stream(fn, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), exact) > ALPHA


@pytest.mark.parametrize(
    "broken", [broken_token, broken_block], ids=["token-target-resample", "block-plain-residual"]
)
def test_stream_negative_controls_fail(broken, tabular_pair):
    target, draft = tabular_pair
    toks = simulate_stream(broken, target, draft, gamma=2, length=3, B=200_000, seed=1)
    assert chi2_pvalue(string_counts(toks, 4), nb.target_law(target, 3)) < ALPHA


def test_block_accepts_more_than_token_on_average(tabular_pair):
    """Sun et al., Theorem 2: E[tau_block] >= E[tau_token]; here the exact values differ and
    the empirical means must land on them (5 sigma)."""
    target, draft = tabular_pair
    B, g = 100_000, 3
    T, D = BatchedTabular(target), BatchedTabular(draft)
    gen = torch.Generator().manual_seed(0)
    a, b = T.start(B), D.start(B)
    xs, qs, ps = [], [], []
    for _ in range(g):
        qi = D.laws(b)
        xi = sample_rows(qi, torch.rand(B, generator=gen, dtype=torch.float64))
        ps.append(T.laws(a)), qs.append(qi), xs.append(xi)
        a, b = T.push(a, xi), D.push(b, xi)
    ps.append(T.laws(a))
    x, P, Q = torch.stack(xs, 1)[:, None], torch.stack(ps, 1)[:, None], torch.stack(qs, 1)[:, None]
    for rule, fn in [("token", token), ("block", block)]:
        n = fn(x, P, Q, seeds=torch.arange(B), positions=0).accepted.double()
        exact = nb.expected_accepted(rule, target, draft, g)
        assert abs(n.mean().item() - exact) < 5 * n.std().item() / B**0.5, rule
    assert nb.expected_accepted("block", target, draft, g) > nb.expected_accepted(
        "token", target, draft, g
    )


def test_motivating_example_exact_rates():
    """Sun et al.'s example (target (1/3, 2/3), draft (2/3, 1/3), gamma=2):
    E[tau] = 10/9 (token), 11/9 (block)."""
    B = 400_000
    p = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64)
    q = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(B, 1, 2, generator=gen, dtype=torch.float64) >= 2 / 3).long()
    P = p.expand(B, 1, 3, 2)
    Q = q.expand(B, 1, 2, 2)
    for fn, want in [(token, 10 / 9), (block, 11 / 9)]:
        n = fn(x, P, Q, seeds=torch.arange(B), positions=0).accepted.double()
        assert abs(n.mean().item() - want) < 5 * n.std().item() / B**0.5


# ----------------------------------------------------------------------------- batch invariance
@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariance(rule, device):
    rng = np.random.default_rng(6)
    B = 64
    paths = [random_path(rng, 50, 4, alpha=0.3) for _ in range(B)]
    x, P, Q = stack_paths(paths, dtype=torch.float32, device=device)
    seeds = torch.tensor(rng.integers(0, 2**40, B), device=device)
    pos = torch.tensor(rng.integers(0, 4000, B), device=device)
    fn = token if rule == "token" else block
    full = fn(x, P, Q, seeds=seeds, positions=pos)
    perm = torch.tensor(rng.permutation(B), device=device)
    shuffled = fn(x[perm], P[perm], Q[perm], seeds=seeds[perm], positions=pos[perm])
    assert torch.equal(shuffled.tokens, full.tokens[perm])
    for b in [0, 17, 63]:
        one = fn(
            x[b : b + 1],
            P[b : b + 1],
            Q[b : b + 1],
            seeds=seeds[b : b + 1],
            positions=pos[b : b + 1],
        )
        assert torch.equal(one.tokens[0], full.tokens[b])
    # the same request 5 times in one batch: 5 identical verdicts
    idx = torch.full((5,), 3, device=device)
    dup = fn(x[idx], P[idx], Q[idx], seeds=seeds[idx], positions=pos[idx])
    assert (dup.tokens == full.tokens[3]).all()
    # a different seed changes decisions somewhere
    other = fn(x, P, Q, seeds=seeds + 1, positions=pos)
    assert not torch.equal(other.tokens, full.tokens)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(["token", "block"]),
    st.integers(0, 4),
    st.sampled_from([2, 3, 7, 60]),
    st.sampled_from([torch.float32, torch.float64]),
    st.booleans(),
)
def test_one_request_numpy_path_is_the_batched_path(case, rule, gamma, V, dtype, zeros):
    """A request verified alone on a CPU takes the numpy path (``chain._one_request_numpy``,
    token and block at any gamma); in a batch it takes the torch path. Both must give
    the same verdict bit for bit, over many keys, with exact zeros in the laws, and with
    q = p on the drafted path (ratios of exactly 1) in some requests."""
    rng = np.random.default_rng(case)
    B = 24
    paths = [random_path(rng, V, gamma, alpha=0.4, zeros=zeros) for _ in range(B)]
    for b in range(0, B, 5):                      # ratio exactly 1 along the whole path
        x, P, Q = paths[b]
        paths[b] = (x, np.vstack([Q, P[-1:]]) if gamma else P, Q)
    x, P, Q = stack_paths(paths, dtype=dtype)
    seeds = torch.tensor(rng.integers(0, 2**62, B))
    pos = torch.tensor(rng.integers(0, 10**6, B))
    fn = token if rule == "token" else block
    batched = fn(x, P, Q, seeds=seeds, positions=pos)
    for b in range(B):
        one = fn(x[b : b + 1], P[b : b + 1], Q[b : b + 1], seeds=seeds[b : b + 1],
                 positions=pos[b : b + 1])
        for got, want in zip(one, batched, strict=True):
            assert got.dtype == want.dtype and torch.equal(got[0], want[b]), (rule, gamma, b)


def test_one_request_numpy_path_is_taken_only_where_it_applies(monkeypatch):
    """The numpy path serves single CPU requests (token and block); uniforms passed in,
    batches and bfloat16 laws keep the batched path."""
    from coupling.torch_backend import chain

    calls = []
    real = chain._one_request_numpy
    monkeypatch.setattr(chain, "_one_request_numpy",
                        lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    rng = np.random.default_rng(11)
    for g, B, rule, dtype, taken in [(1, 1, "token", torch.float32, True),
                                     (3, 1, "token", torch.float64, True),
                                     (1, 1, "block", torch.float32, True),
                                     (2, 1, "block", torch.float32, True),
                                     (4, 1, "block", torch.float64, True),
                                     (2, 2, "block", torch.float32, False),
                                     (1, 2, "token", torch.float32, False),
                                     (1, 1, "token", torch.bfloat16, False)]:
        calls.clear()
        x, P, Q = stack_paths([random_path(rng, 6, g) for _ in range(B)], dtype=dtype)
        atol = 2e-2 if dtype == torch.bfloat16 else None
        v = (token if rule == "token" else block)(x, P, Q, seeds=1, positions=2, atol=atol)
        assert v.tokens.shape == (B, g + 1)
        # B = 1 calls reach the numpy path, which declines bfloat16 and batches
        assert bool(calls and real(x, P, Q, torch.tensor([1] * B), torch.tensor([2] * B))
                    is not None) == taken, (g, B, rule, dtype)
    x, P, Q = stack_paths([random_path(rng, 6, 1)])
    calls.clear()
    token(x, P, Q, seeds=1, positions=2, accept_u=torch.zeros(1, 1))
    assert calls == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("rule", ["token", "block"])
def test_cuda_matches_cpu(rule):
    rng = np.random.default_rng(7)
    paths = [random_path(rng, 40, 4, alpha=0.3) for _ in range(128)]
    fn = token if rule == "token" else block
    a = fn(*stack_paths(paths), seeds=torch.arange(128), positions=5)
    xc, Pc, Qc = stack_paths(paths, device="cuda")
    b = fn(xc, Pc, Qc, seeds=torch.arange(128, device="cuda"), positions=5)
    assert torch.equal(a.tokens, b.tokens.cpu())


# ----------------------------------------------------------------------------- API and validation
def test_verdict_layout_and_unbatched_k_axis():
    rng = np.random.default_rng(8)
    paths = [random_path(rng, 10, 3) for _ in range(20)]
    x, P, Q = stack_paths(paths)
    v = block(x, P, Q, seeds=torch.arange(20), positions=0)
    assert isinstance(v, Verdict)
    assert v.tokens.shape == (20, 4) and v.tokens.dtype == torch.int64
    assert v.accepted.shape == v.branch.shape == v.next_token.shape == (20,)
    assert (v.branch == 0).all()
    for b in range(20):
        n = int(v.accepted[b])
        assert v.tokens[b, :n].tolist() == x[b, 0, :n].tolist()
        assert int(v.tokens[b, n]) == int(v.next_token[b])
        assert (v.tokens[b, n + 1 :] == -1).all()
    # [B, gamma] inputs (k axis dropped) give the same verdict; verify() dispatches
    v2 = verify("block", x[:, 0], P[:, 0], Q[:, 0], seeds=torch.arange(20), positions=0)
    assert torch.equal(v.tokens, v2.tokens)


def _valid(B=3, k=1, g=2, V=5, dtype=torch.float32):
    p = torch.full((B, k, g + 1, V), 1.0 / V, dtype=dtype)
    q = torch.full((B, k, g, V), 1.0 / V, dtype=dtype)
    x = torch.zeros(B, k, g, dtype=torch.int64)
    return x, p, q


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda x, p, q: (x.float(), p, q), "integer token ids"),
        (lambda x, p, q: (x, p[:, :, :-1], q), r"gamma\+1"),
        (lambda x, p, q: (x, p, q[..., :-1]), "q must have shape"),
        (lambda x, p, q: (x[0], p, q), "drafts must have shape"),
        (lambda x, p, q: (x, p.index_fill(-1, torch.tensor([1]), float("nan")), q), "NaN or inf"),
        (lambda x, p, q: (x, p, q.index_fill(-1, torch.tensor([1]), float("inf"))), "NaN or inf"),
        (lambda x, p, q: (x, p + torch.tensor([-0.3, 0.3, 0, 0, 0], dtype=p.dtype), q), "negative"),
        (lambda x, p, q: (x, p * 1.01, q), "sum to 1"),
        (lambda x, p, q: (x + 7, p, q), "outside"),
        (lambda x, p, q: (x - 1, p, q), "outside"),
        (lambda x, p, q: (x, p.long(), q), "floating"),
        (
            lambda x, p, q: (x.expand(3, 2, 2), p.expand(3, 2, 3, 5), q.expand(3, 2, 2, 5)),
            "single draft branch",
        ),
    ],
)
@pytest.mark.parametrize("fn", [token, block])
@pytest.mark.parametrize("numpy_max", [0, 1 << 16], ids=["torch-checks", "numpy-checks"])
@pytest.mark.parametrize("B", [3, 1])
def test_validation_errors(fn, mutate, match, numpy_max, B, monkeypatch):
    """The same errors whether the checks read the laws through torch (large tensors, other
    devices) or numpy (small CPU tensors: ``_common.NUMPY_MAX``), batched or alone."""
    from coupling.torch_backend import _common

    monkeypatch.setattr(_common, "NUMPY_MAX", numpy_max)
    x, p, q = mutate(*_valid(B=B))
    with pytest.raises(ValueError, match=match):
        fn(x, p, q, seeds=0, positions=0)


def test_validation_zero_draft_probability_and_keys():
    x, p, q = _valid()
    q = q.clone()
    q[..., 0] = 0.0
    q[..., 1] += 1.0 / 5
    with pytest.raises(ValueError, match="q = 0"):
        token(x, p, q, seeds=0, positions=0)
    x, p, q = _valid()
    with pytest.raises(ValueError, match="seeds must have shape"):
        block(x, p, q, seeds=torch.zeros(2, dtype=torch.int64), positions=0)
    with pytest.raises(ValueError, match="integers"):
        block(x, p, q, seeds=torch.zeros(3), positions=0)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        block(x, p, q, seeds=0, positions=-1)
    with pytest.raises(ValueError, match="unknown rule"):
        verify("nope", x, p, q, seeds=0, positions=0)
    # validate=False skips the value checks (hot path) but never the shape checks
    token(x, p * 1.01, q, seeds=0, positions=0, validate=False)
    with pytest.raises(ValueError, match="gamma\\+1"):
        token(x, p[:, :, :-1], q, seeds=0, positions=0, validate=False)
