"""The sampling laws in torch (:mod:`coupling.llm.sampling`) and their compiled paths
(:mod:`coupling.llm.accel`: the top-k / top-p law, the inverse-CDF draws) against torch and a
numpy reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling.llm import accel, sampling
from coupling.llm import engine as E
from coupling.llm.sampling import SamplingConfig, probs


def np_reference(logits: np.ndarray, T: float, k: int, top_p: float) -> np.ndarray:
    x = logits / T
    if k:
        kth = np.sort(x)[::-1][k - 1]
        x = np.where(x < kth, -np.inf, x)
    pr = np.exp(x - x.max())
    pr /= pr.sum()
    if top_p < 1:
        order = np.argsort(-pr, kind="stable")
        cum = np.cumsum(pr[order]) - pr[order]
        keep = np.zeros_like(pr, dtype=bool)
        keep[order[cum < top_p]] = True
        pr = np.where(keep, pr, 0.0)
        pr /= pr.sum()
    return pr


@pytest.mark.parametrize("T,k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 3, 1.0),
                                       (0.8, 0, 0.9), (1.3, 4, 0.5), (1.0, 1, 1.0)])
def test_probs_matches_numpy_reference(T, k, top_p):
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(5, 40)) * 3
    got = probs(torch.tensor(logits), SamplingConfig(T, k, top_p)).double().numpy()
    for row, g in zip(logits, got, strict=True):
        np.testing.assert_allclose(g, np_reference(row, T, k, top_p), atol=1e-6)
        assert abs(g.sum() - 1) < 1e-6


def test_top_p_keeps_the_crossing_token():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    pr = probs(logits, SamplingConfig(1.0, 0, 0.6))[0]
    np.testing.assert_allclose(pr.numpy(), [0.625, 0.375, 0, 0], atol=1e-6)


@pytest.mark.parametrize("kw,msg", [({"temperature": 0.0}, "temperature"),
                                    ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"),
                                    ({"top_p": 1.5}, "top_p")])
def test_sampling_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingConfig(**kw)


@pytest.mark.parametrize("kwargs, msg", [({"temperature": math.inf}, "finite"),
                                         ({"top_k": 2.5}, "integer"),
                                         ({"top_k": math.nan}, "integer"),
                                         ({"top_k": True}, "integer")])
def test_sampling_config_refuses_what_it_would_misread(kwargs, msg):
    """top_k = 2.5 read as 2 by the compiled path, NaN as "off", temperature = inf as a
    uniform law."""
    with pytest.raises(ValueError, match=msg):
        SamplingConfig(**kwargs)


def test_top_p_fast_path_equals_full_sort():
    """The top-k head shortcut and the full-sort fallback give the same nucleus."""
    rng = np.random.default_rng(3)
    for scale in (0.3, 3.0, 8.0):  # flat rows need the fallback, peaked rows the head
        logits = torch.tensor(rng.normal(size=(6, 500)) * scale)
        pr = torch.softmax(logits, -1)
        for top_p in (0.5, 0.9, 0.99):
            fast = sampling._top_p(pr, top_p, head=16)
            ref = torch.stack([torch.tensor(np_reference(np.log(r.numpy()), 1.0, 0, top_p))
                               for r in pr])
            torch.testing.assert_close(fast.double(), ref, atol=1e-9, rtol=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=12, max_size=80), st.integers(1, 11),
       st.sampled_from([1.0, 0.9, 0.5]))
def test_top_k_window_path_keeps_every_tie_like_the_reference(vals, k, top_p):
    """Integer logits tie everywhere (bf16 logits tie often): the windowed top-k path, or its
    fallback when a tie run outgrows the window, keeps every entry tied with the k-th."""
    x = torch.tensor([vals], dtype=torch.float64)
    ref = np_reference(x[0].numpy(), 1.0, k, 1.0)
    for window in (1, 3, 32):
        fast = sampling._probs_top_k(x, SamplingConfig(1.0, k, 1.0), window=window)
        if fast is not None:
            np.testing.assert_allclose(fast[0].numpy(), ref, atol=1e-12)
    got = probs(x, SamplingConfig(1.0, k, top_p))[0].double().numpy()   # float32 inside
    kept = set(np.flatnonzero(got))
    assert kept <= set(np.flatnonzero(ref))
    if top_p == 1.0:
        np.testing.assert_allclose(got, ref, atol=1e-6)
    else:  # the nucleus: smallest prefix of the (tie-broken) order reaching top_p
        assert ref[list(kept)].sum() >= top_p - 1e-6
        assert ref[list(kept)].sum() - ref[list(kept)].min() < top_p + 1e-6


def test_top_k_window_path_falls_back_on_a_long_tie_run():
    x = torch.zeros(1, 100)
    x[0, :3] = 1.0                                   # 3 leaders, then 97 ties at 0
    assert sampling._probs_top_k(x, SamplingConfig(1.0, 5, 1.0), window=8) is None
    pr = probs(x, SamplingConfig(1.0, 5, 1.0))[0]
    assert int((pr > 0).sum()) == 100                 # every tied entry kept, as the reference


def test_draft_sampler_never_returns_zero_probability_tokens_and_has_the_right_law():
    q = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25]] * 20000)
    x = E.draw_rows(q, torch.Generator().manual_seed(0))
    counts = np.bincount(x.numpy(), minlength=5)
    assert counts[0] == counts[2] == 0
    assert stats.chisquare(counts[[1, 3, 4]], 20000 * np.array([0.5, 0.25, 0.25])).pvalue > 1e-3


def compiled_or_skip(name: str):
    fn = accel.function(name)
    if fn is None:
        pytest.skip(f"no compiled {name} here: {accel.status()}")
    return fn


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-6, 6), min_size=12, max_size=90), st.integers(1, 11),
       st.sampled_from([0.7, 1.0, 1.3]), st.sampled_from([1.0, 0.9, 0.5]),
       st.sampled_from(["float32", "bfloat16"]), st.booleans())
def test_native_top_k_law_is_the_reference_law(vals, k, T, top_p, dtype, placed):
    """The compiled top-k / top-p law (``sampling.native_law``): integer logits tie everywhere,
    as bf16 logits often do. Every entry tied with the k-th value is kept, the values are the
    reference's to float32 rounding, and the nucleus is a smallest most-likely prefix reaching
    top_p with its ties broken by column order; with ``columns`` the law lands at those ids."""
    compiled_or_skip("top_k_law")
    k = min(k, len(vals) - 1)
    x = torch.tensor([vals], dtype=getattr(torch, dtype))
    cfg = SamplingConfig(T, k, top_p)
    ref = np_reference(np.array(vals, dtype=np.float64), T, k, 1.0)     # the top-k law
    if placed:                       # a subset head: n columns placed among 3n + 5 tokens
        cols = torch.randperm(3 * len(vals) + 5, generator=torch.Generator().manual_seed(
            len(vals)))[: len(vals)]
        got_v = sampling.native_law(x, cfg, cols, 3 * len(vals) + 5)[0].double().numpy()
        assert got_v.sum() == pytest.approx(got_v[cols.numpy()].sum(), abs=0)
        got = got_v[cols.numpy()]
    else:
        got = sampling.native_law(x, cfg)[0].double().numpy()
    assert abs(got.sum() - 1) < 1e-6
    if top_p == 1.0:
        np.testing.assert_allclose(got, ref, atol=1e-6)
        return
    kept = np.flatnonzero(got)
    assert set(kept) <= set(np.flatnonzero(ref))
    np.testing.assert_allclose(got[kept], ref[kept] / ref[kept].sum(), atol=1e-6)
    # a smallest prefix reaching top_p of the order (probability down, column up)
    order = sorted(np.flatnonzero(ref), key=lambda i: (-ref[i], i))
    before = np.cumsum([ref[i] for i in order]) - [ref[i] for i in order]
    assert set(kept) == {i for i, b in zip(order, before, strict=True) if b < top_p - 1e-9} or \
        abs(min(abs(before - top_p))) < 1e-6           # a cut within float rounding of top_p


def test_native_top_k_law_breaks_nucleus_ties_by_column_and_keeps_k_ties():
    compiled_or_skip("top_k_law")
    # three tokens tied at the top, top-p 0.5: the first two columns of the tie are kept
    x = torch.tensor([[0.0, 2.0, -1.0, 2.0, 2.0, -3.0]])
    got = sampling.native_law(x, SamplingConfig(1.0, 4, 0.5))[0]
    assert (got > 0).nonzero().flatten().tolist() == [1, 3]
    np.testing.assert_allclose(got[[1, 3]].numpy(), [0.5, 0.5], atol=1e-7)
    # top-k 2 with 3 entries tied at the 2nd largest value: all of them stay
    x = torch.tensor([[5.0, 1.0, 1.0, 0.0, 1.0]], dtype=torch.bfloat16)
    got = sampling.native_law(x, SamplingConfig(1.0, 2, 1.0))[0]
    assert (got > 0).nonzero().flatten().tolist() == [0, 1, 2, 4]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_native_top_k_law_leaves_non_finite_logits_to_the_torch_path(bad):
    compiled_or_skip("top_k_law")
    x = torch.tensor([[0.5, 2.0, 1.0, 0.0, -1.0, 3.0]])
    x[0, 4] = bad
    cfg = SamplingConfig(1.0, 3, 0.9)
    assert sampling.native_law(x, cfg) is None
    with_native = probs(x, cfg)
    with accel.disabled("top_k_law"):
        torch.testing.assert_close(with_native, probs(x, cfg), equal_nan=True)


def test_native_top_k_law_leaves_subnormal_scaled_logits_to_the_torch_path():
    """A temperature above 1 can scale logits into the subnormal range, where division
    rounds by an absolute step and ties form that the compiled pre-filter would miss."""
    compiled_or_skip("top_k_law")
    x = torch.tensor([[3.0e-10, 2.0e-10, 1.0e-10, 1.0e-10 - 3e-16, 0.0, 0.0, 0.0, 0.0]])
    cfg = SamplingConfig(1e30, 3, 1.0)
    assert sampling.native_law(x, cfg) is None
    assert (probs(x, cfg) > 0).sum().item() == 4      # x[3] / T rounds onto x[2] / T: kept
    assert sampling.native_law(x, SamplingConfig(1e-3, 3, 1.0)) is not None


def test_native_laws_are_off_where_a_gradient_is_needed():
    compiled_or_skip("top_k_law")
    x = torch.randn(2, 30, requires_grad=True)
    assert sampling.native_law(x, SamplingConfig(1.0, 5, 0.9)) is None
    probs(x, SamplingConfig(1.0, 5, 0.9))[:, 0].sum().backward()
    assert x.grad is not None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 300), st.floats(0.0, 0.95), st.integers(0, 2**31 - 1))
def test_native_inverse_cdf_draws_the_torch_draws(rows, V, zeros, seed):
    """The compiled ``inverse_cdf`` is the float64 cumsum + searchsorted draw, bit for bit:
    the engine's drafts (``engine.draw_rows``, generator uniforms) and
    ``sampling.sample_rows`` (the plain sampler's), against the backend's torch
    ``sample_rows``."""
    from coupling.torch_backend.common import sample_rows

    compiled_or_skip("inverse_cdf")
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(rows, V, generator=g)
    w[torch.rand(rows, V, generator=g) < zeros] = 0.0
    w[:, torch.randint(V, (1,), generator=g)] = 0.5            # every row has some mass
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    u[0] = 1.0 - 2.0 ** -53 if seed % 2 else 0.0                # the edges
    fast = sampling.sample_rows(w, u)
    fast_e = E.draw_rows(w, torch.Generator().manual_seed(seed))
    assert torch.equal(fast, sample_rows(w, u))
    with accel.disabled("inverse_cdf"):
        assert torch.equal(fast, sampling.sample_rows(w, u))
        assert torch.equal(fast_e, E.draw_rows(w, torch.Generator().manual_seed(seed)))
    assert bool((w.gather(1, fast[:, None]) > 0).all())


def test_native_inverse_cdf_takes_the_next_token_at_an_exact_cdf_value():
    from coupling.llm.sampling import sample_rows

    compiled_or_skip("inverse_cdf")
    w = torch.tensor([[0.25, 0.0, 0.25, 0.5]])
    # target = 0.5 * 1.0 equals cdf[2] exactly: the first cdf strictly above it is token 3
    assert sample_rows(w, torch.tensor([0.5], dtype=torch.float64)).tolist() == [3]
    assert sample_rows(w, torch.tensor([0.0], dtype=torch.float64)).tolist() == [0]


def test_native_top_k_law_rejects_columns_outside_the_vocabulary():
    fn = compiled_or_skip("top_k_law")
    x = torch.randn(1, 8)
    with pytest.raises(RuntimeError, match="columns must lie in"):
        fn(x, 1.0, 3, 0.9, torch.tensor([0, 1, 2, 3, 4, 5, 6, 20]), 10)
    with pytest.raises(RuntimeError, match="top_p in"):
        fn(x, 1.0, 3, 0.0, torch.empty(0, dtype=torch.long), 8)
