"""Engine tests on tiny random Llama models (fast; no real checkpoint needed).

The real-model counterparts (slow) are in tests/test_llm_real.py.

Statistics: chi-square goodness of fit of the law of the first two generated tokens against
the exact target law (enumerated from the tiny model), each at false-positive rate 1e-3 with
a fixed seed set, plus a negative control (a verifier that always accepts the draft) that
must be rejected.
"""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from coupling.llm import engine as E
from coupling.llm import feature_draft as FD
from coupling.llm import predict as P
from coupling.llm import rules_adapter
from coupling.llm.sampling import SamplingConfig, probs
from tests.llm_helpers import fresh_feature_law, record_first_laws

V = 10


def tiny_llama(seed: int, layers: int = 2, scale: float = 1.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale * 40.0)  # random init is near-uniform; sharpen the laws
    return m


@pytest.fixture(scope="module")
def pair():
    # tiny matmuls: one thread avoids OpenMP spin contention on a shared 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_llama(0), tiny_llama(1, layers=1)
    torch.set_num_threads(n)


# --------------------------------------------------------------------------- sampling


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


# --------------------------------------------------------------------------- compiled laws


def _native_or_skip(name: str):
    from coupling.llm import int8_kernel, sampling

    sampling.native_laws(True)
    fn = sampling.native_function(name)
    if fn is None:
        pytest.skip(f"no compiled laws here: {int8_kernel.status()}")
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
    from coupling.llm import sampling

    _native_or_skip("top_k_law")
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
    from coupling.llm import sampling

    _native_or_skip("top_k_law")
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
def test_native_top_k_law_leaves_non_finite_logits_to_the_python_path(bad):
    from coupling.llm import sampling

    _native_or_skip("top_k_law")
    x = torch.tensor([[0.5, 2.0, 1.0, 0.0, -1.0, 3.0]])
    x[0, 4] = bad
    cfg = SamplingConfig(1.0, 3, 0.9)
    assert sampling.native_law(x, cfg) is None
    with_native = probs(x, cfg)
    sampling.native_laws(False)
    try:
        torch.testing.assert_close(with_native, probs(x, cfg), equal_nan=True)
    finally:
        sampling.native_laws(True)


def test_native_top_k_law_leaves_subnormal_scaled_logits_to_the_python_path():
    """A temperature above 1 can scale logits into the subnormal range, where division
    rounds by an absolute step and ties form that the compiled pre-filter would miss."""
    from coupling.llm import sampling

    _native_or_skip("top_k_law")
    x = torch.tensor([[3.0e-10, 2.0e-10, 1.0e-10, 1.0e-10 - 3e-16, 0.0, 0.0, 0.0, 0.0]])
    cfg = SamplingConfig(1e30, 3, 1.0)
    assert sampling.native_law(x, cfg) is None
    assert (probs(x, cfg) > 0).sum().item() == 4      # x[3] / T rounds onto x[2] / T: kept
    assert sampling.native_law(x, SamplingConfig(1e-3, 3, 1.0)) is not None


def test_native_laws_are_off_where_a_gradient_is_needed():
    from coupling.llm import sampling

    _native_or_skip("top_k_law")
    x = torch.randn(2, 30, requires_grad=True)
    assert sampling.native_law(x, SamplingConfig(1.0, 5, 0.9)) is None
    probs(x, SamplingConfig(1.0, 5, 0.9))[:, 0].sum().backward()
    assert x.grad is not None


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 300), st.floats(0.0, 0.95), st.integers(0, 2**31 - 1))
def test_native_inverse_cdf_draws_the_torch_draws(rows, V, zeros, seed):
    """``inverse_cdf`` is the float64 cumsum + searchsorted draw, bit for bit: the engine's
    drafts (``engine._sample_rows``, generator uniforms) and ``sampling.sample_rows`` (the
    plain sampler's), against the backend's torch ``sample_rows``."""
    from coupling.torch_backend._common import sample_rows

    from coupling.llm import sampling

    _native_or_skip("inverse_cdf")
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(rows, V, generator=g)
    w[torch.rand(rows, V, generator=g) < zeros] = 0.0
    w[:, torch.randint(V, (1,), generator=g)] = 0.5            # every row has some mass
    u = torch.rand(rows, generator=g, dtype=torch.float64)
    u[0] = 1.0 - 2.0 ** -53 if seed % 2 else 0.0                # the edges
    fast = sampling.sample_rows(w, u)
    fast_e = E._sample_rows(w, torch.Generator().manual_seed(seed))
    assert torch.equal(fast, sample_rows(w, u))
    sampling.native_laws(False)
    try:
        assert torch.equal(fast, sampling.sample_rows(w, u))
        assert torch.equal(fast_e, E._sample_rows(w, torch.Generator().manual_seed(seed)))
    finally:
        sampling.native_laws(True)
    assert bool((w.gather(1, fast[:, None]) > 0).all())


def test_native_inverse_cdf_takes_the_next_token_at_an_exact_cdf_value():
    from coupling.llm.sampling import sample_rows

    _native_or_skip("inverse_cdf")
    w = torch.tensor([[0.25, 0.0, 0.25, 0.5]])
    # target = 0.5 * 1.0 equals cdf[2] exactly: the first cdf strictly above it is token 3
    assert sample_rows(w, torch.tensor([0.5], dtype=torch.float64)).tolist() == [3]
    assert sample_rows(w, torch.tensor([0.0], dtype=torch.float64)).tolist() == [0]


def test_native_union_support_is_the_torch_support_and_leaves_bad_laws_to_it():
    from coupling.llm import sampling

    _native_or_skip("union_support")
    g = torch.Generator().manual_seed(5)
    p = torch.rand(3, 1003, generator=g) * (torch.rand(3, 1003, generator=g) < 0.02)
    q = torch.rand(2, 1003, generator=g) * (torch.rand(2, 1003, generator=g) < 0.02)
    fast = rules_adapter.support(p, q)
    sampling.native_laws(False)
    try:
        assert torch.equal(fast, rules_adapter.support(p, q))
        for bad in (float("nan"), -0.1, float("inf")):
            pb = p.clone()
            pb[1, 7] = bad
            sampling.native_laws(True)
            fast = rules_adapter.support(pb, q)
            sampling.native_laws(False)
            assert torch.equal(fast, rules_adapter.support(pb, q))
    finally:
        sampling.native_laws(True)


def test_native_top_k_law_rejects_columns_outside_the_vocabulary():
    fn = _native_or_skip("top_k_law")
    x = torch.randn(1, 8)
    with pytest.raises(RuntimeError, match="columns must lie in"):
        fn(x, 1.0, 3, 0.9, torch.tensor([0, 1, 2, 3, 4, 5, 6, 20]), 10)
    with pytest.raises(RuntimeError, match="top_p in"):
        fn(x, 1.0, 3, 0.0, torch.empty(0, dtype=torch.long), 8)


# --------------------------------------------------------------------------- drafters / predict


def test_ngram_lookup_latest_longest_match():
    d = E.NgramDrafter(V, max_n=3)
    seq = [1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 1, 2, 3]
    # longest suffix with an earlier occurrence: [1, 2, 3] at 0 -> continue with 4, 5
    assert d.lookup(seq, 2) == [4, 5]
    assert d.lookup([1, 2, 3, 2, 3], 3) == [2, 3]  # suffix [2,3] at 1 -> [2, 3]
    assert d.lookup([5, 6, 7], 3) == []
    drafts, q = d.propose([1, 2, 1], 2, 1, SamplingConfig(), torch.Generator())
    assert drafts.tolist() == [[2, 1]]
    assert torch.equal(q.sum(-1), torch.ones(1, 2)) and q[0, 0, 2] == 1 and q[0, 1, 1] == 1
    with pytest.raises(ValueError, match="k=2"):
        d.propose([1, 2, 1], 2, 2, SamplingConfig(), torch.Generator())


def test_compose_is_expected_tokens_of_token_verification():
    # gamma = 2, alphas a, b: 1 + a + a b
    assert P.compose([0.5, 0.25]) == pytest.approx(1 + 0.5 + 0.125)
    assert P.compose([]) == 1.0


def test_step_beta_block_weights_and_token_alpha():
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]]])
    p = torch.tensor([[[0.25, 0.25, 0.5], [0.6, 0.2, 0.2], [1 / 3, 1 / 3, 1 / 3]]])
    drafts = torch.tensor([[0, 0]])
    w = P.step_beta("block", drafts, q, p, 0, 1)
    assert w == pytest.approx([0.5, 1.0])  # w1 = min(.25/.5, 1); w2 = min(.5 * .6/.2, 1)
    a = P.step_beta("token", drafts, q, p, 0, 1)
    assert a == pytest.approx([0.5, 0.4])
    assert P.conditional_token(drafts, q, p, 0) == pytest.approx(1 + 0.5 + 0.5)
    assert P.conditional_block(drafts, q, p, 0) == pytest.approx(1 + 0.5 + 1.0)


def _predict_step():
    q = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]]])
    p = torch.tensor([[[0.25, 0.25, 0.5], [0.6, 0.2, 0.2], [1 / 3, 1 / 3, 1 / 3]]])
    return torch.tensor([[0, 0]]), q, p


@pytest.mark.parametrize("change, msg", [
    (dict(rule="blocks"), "rule='blocks'"), (dict(drafts=torch.tensor([[0.0, 0.0]])), "integer"),
    (dict(drafts=torch.tensor([0, 0])), r"\[k, g\]"), (dict(drafts=torch.tensor([[0, 3]])),
                                                       r"\[0, 3\)"),
    (dict(drafts=torch.tensor([[0, 2]])), "probability 0"),     # q = 0: its ratio is infinite
    (dict(q=torch.full((1, 3, 3), 1 / 3)), "q must be"), (dict(p=torch.ones(1, 2, 3) / 3),
                                                          "p must be"),
    (dict(branch=1), "branch=1"), (dict(branch=True), "branch=True"), (dict(k=2), "k=2")])
def test_predictions_refuse_a_malformed_step(change, msg):
    """The predictions index q and p by the drafts: a wrong shape, an unknown rule name or a
    draft q never proposes once gave an IndexError, a silently wrong value or inf."""
    drafts, q, p = _predict_step()
    args = dict(rule="block", drafts=drafts, q=q, p=p, branch=0, k=1) | change
    with pytest.raises(ValueError, match=msg):
        P.step_beta(**args)
    if "k" not in change:
        with pytest.raises(ValueError, match=msg):
            P.check_step(args["rule"], args["drafts"], args["q"], args["p"], args["branch"])
    with pytest.raises(ValueError, match="rule="):
        P.predicted_block_efficiency("tokens", [0.5])
    with pytest.raises(ValueError, match="rule="):
        P.optimal_block_efficiency("rss", None, drafts, q, p, 0)
    if "rule" not in change and "k" not in change:        # the optimal rule's shortcut too
        with pytest.raises(ValueError, match=msg):
            P.optimal_block_efficiency("optimal", None, args["drafts"], args["q"], args["p"],
                                       args["branch"])


@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(2, 6))
@settings(max_examples=200, deadline=None)
def test_block_on_the_same_drafts_never_below_token(seed, g, V):
    """The paired comparison the demo reports: w_j >= prod_{i<=j} min(1, r_i) pathwise."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(1, g, V, generator=gen, dtype=torch.float64) ** 3
    q /= q.sum(-1, keepdim=True)
    p = torch.rand(1, g + 1, V, generator=gen, dtype=torch.float64) ** 3
    p /= p.sum(-1, keepdim=True)
    drafts = torch.multinomial(q[0], 1, generator=gen).T                  # [1, g]
    tok, blk = P.conditional_token(drafts, q, p, 0), P.conditional_block(drafts, q, p, 0)
    assert 1.0 <= tok <= blk + 1e-12 <= g + 1 + 1e-12


@given(st.integers(0, 2**31 - 1), st.sampled_from([("token", 1), ("block", 1), ("gumbel", 1),
                                                   ("kseq", 2), ("rrs", 3), ("rrs_wor", 2),
                                                   ("optimal", 2), ("optimal_wor", 2)]),
       st.integers(1, 4), st.integers(4, 30))
@settings(max_examples=150, deadline=None)
def test_compressed_decisions_equal_full_vocabulary_decisions(seed, rule_k, g, top):
    """The adapter hands a rule only the tokens where some p or q has mass (and gumbel their
    keyed noise); every verdict equals the one on the full vocabulary."""
    rule, k = rule_k
    if rules_adapter.available().get(rule):
        return
    Vbig = 300
    cfg = SamplingConfig(1.0, top_k=top)

    def laws(prefix: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        # a context-dependent pair of models: branches with one prefix share their laws
        gen = torch.Generator().manual_seed(hash((seed,) + prefix) % 2**31)
        lp = torch.randn(Vbig, generator=gen, dtype=torch.float64) * 2
        lq = lp + torch.randn(Vbig, generator=gen, dtype=torch.float64)
        return probs(lp[None], cfg)[0].float(), probs(lq[None], cfg)[0].float()

    gen = torch.Generator().manual_seed(seed)
    drafts = torch.zeros(k, g, dtype=torch.long)
    p = torch.zeros(k, g + 1, Vbig)
    q = torch.zeros(k, g, Vbig)
    for j in range(k):
        for i in range(g + 1):
            p[j, i], qi = laws(tuple(drafts[j, :i].tolist()))
            if i == g:
                break
            q[j, i] = qi
            if rule == "gumbel":
                drafts[j, i] = rules_adapter.gumbel_draft(qi[None], seed % 97, 40 + i)[0]
            elif rule in rules_adapter.WITHOUT_REPLACEMENT and i == 0:
                if j == 0:
                    first = torch.multinomial(qi, k, replacement=False, generator=gen)
                drafts[j, 0] = first[j]
            else:
                drafts[j, i] = torch.multinomial(qi, 1, generator=gen)[0]
    got = [rules_adapter.decide(rule, drafts, q, p, seed % 97, 40, compress=c)
           for c in (True, False)]
    assert got[0] == got[1]


@given(st.integers(0, 2**31 - 1), st.sampled_from(["token", "block"]), st.integers(1, 4),
       st.integers(0, 10**6))
@settings(max_examples=100, deadline=None)
def test_decide_verdicts_do_not_depend_on_the_coin_path(seed, rule, g, position):
    """One request's coins are hashed in Python floats (rng.unit_floats); the adapter's
    verdicts equal the backend's with every coin from its tensor path (SMALL_PREFIX = 0)."""
    from coupling import torch_backend as tb
    from coupling.torch_backend import rng

    gen = torch.Generator().manual_seed(seed)
    V = 40
    cfg = SamplingConfig(1.0, top_k=8)
    p = probs(torch.randn(g + 1, V, generator=gen, dtype=torch.float64) * 2, cfg).float()[None]
    q = probs(torch.randn(g, V, generator=gen, dtype=torch.float64) * 2, cfg).float()[None]
    drafts = torch.multinomial(q[0], 1, generator=gen).T                  # [1, g]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rng, "SMALL_PREFIX", 0)
        v = tb.verify(rule, drafts[None], p[None], q[None], seeds=torch.tensor([seed % 97]),
                      positions=torch.tensor([position]))
    m = int(v.accepted[0])
    want = (m, 0, v.tokens[0, : m + 1].tolist())
    for compress in (True, False):
        assert rules_adapter.decide(rule, drafts, q, p, seed % 97, position,
                                    compress=compress) == want


def test_compressed_decide_refuses_a_draft_outside_both_supports():
    p = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.5, 0.0]]])
    q = torch.tensor([[[0.0, 1.0, 0.0, 0.0]]])
    assert rules_adapter.support(p, q).tolist() == [0, 1, 2]
    assert rules_adapter.support(q).tolist() == [1]
    assert rules_adapter.decide("token", torch.tensor([[1]]), q, p, 0, 5)[0] in (0, 1)
    with pytest.raises(ValueError, match="outside the support"):     # token 3: no p, no q
        rules_adapter.decide("token", torch.tensor([[3]]), q, p, 0, 5)
    for compress in (True, False):  # token 2: in p's support, q = 0: the backend refuses it
        with pytest.raises(ValueError, match="draft probability q = 0"):
            rules_adapter.decide("token", torch.tensor([[2]]), q, p, 0, 5, compress=compress)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), -1e-3, float("inf")])
@pytest.mark.parametrize("law", ["p", "q"])
def test_decide_names_a_bad_entry_that_lies_outside_every_support(law, bad, native):
    """A NaN, infinite or negative entry is outside the support, so the compressed laws alone
    would not contain it: decide must check the full laws and refuse them, as compress=False
    does, for every rule (it once returned a verdict for NaN and negative entries)."""
    from coupling.llm import sampling

    g = 2
    p = torch.zeros(2, g + 1, 12)
    p[..., :4] = 0.25
    q = torch.zeros(2, g, 12)
    q[..., :4] = 0.25
    (p if law == "p" else q)[0, 1, 9] = bad          # column 9: no other row has mass there
    drafts = torch.tensor([[1, 2], [3, 0]])
    want = "NaN or inf" if bad != -1e-3 else "negative entries"
    sampling.native_laws(native)
    try:
        for rule in rules_adapter.RULES:
            k = 1 if rule in rules_adapter.SINGLE_DRAFT_RULES else 2
            if rules_adapter.available()[rule] is not None:
                continue
            for compress in (True, False):
                with pytest.raises(ValueError, match=f"{law} (contains|has) .*{want}"):
                    rules_adapter.decide(rule, drafts[:k], q[:k], p[:k], 3, 7,
                                         compress=compress)
    finally:
        sampling.native_laws(True)


@pytest.mark.parametrize("compress", [True, False])
def test_decide_refuses_float_draft_ids_and_two_vocabularies(compress):
    """What compression would blur: float or bool ids (searchsorted takes them) and laws over
    two vocabularies (a tokenizer mismatch) are refused as on the full laws."""
    p = torch.full((1, 2, 6), 1 / 6)
    q = torch.full((1, 1, 6), 1 / 6)
    for ids in (torch.tensor([[2.0]]), torch.tensor([[1.0]], dtype=torch.float32),
                torch.tensor([[True]])):
        with pytest.raises(ValueError, match="integer token ids"):
            rules_adapter.decide("token", ids, q, p, 0, 5, compress=compress)
    for rule in ("token", "rrs"):
        with pytest.raises(ValueError, match="share one vocabulary"):
            rules_adapter.decide(rule, torch.tensor([[2]]), q[..., :5] * 1.2, p, 0, 5,
                                 compress=compress)


@pytest.mark.parametrize("rule", ["token", "gumbel"])
def test_sample_target_refuses_a_bad_law(rule):
    p = torch.full((1, 8), 0.125)
    assert 0 <= rules_adapter.sample_target(rule, p, 0, 3) < 8
    for bad, msg in ((float("nan"), "NaN or inf"), (-0.125, "negative"), (0.5, "sum to 1")):
        pb = p.clone()
        pb[0, 5] = bad
        with pytest.raises(ValueError, match=msg):
            rules_adapter.sample_target(rule, pb, 0, 3)
    with pytest.raises(ValueError, match="q contains NaN"):
        rules_adapter.gumbel_draft(torch.tensor([[0.5, float("nan"), 0.5]]), 0, 3)
    for q in (torch.zeros(1, 3), torch.tensor([[0, 3, 1]])):    # no mass; integer counts
        with pytest.raises(ValueError, match="sum to 1|floating"):
            rules_adapter.gumbel_draft(q, 0, 3)


# --------------------------------------------------------------------------- cache rollback


def fresh_next_logits(model, seq):
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0, -1].float()


def test_cache_sync_equals_fresh_recomputation(pair):
    target, _ = pair
    lm = E.CachedLM(target)
    E.prefill(lm, [1, 2, 3, 4])
    assert lm.tokens == [[1, 2, 3]]                   # prefill keeps the last prompt token out
    lm.forward(torch.tensor([[4, 5, 6, 7]]))          # cache holds 1 2 3 4 5 6 7
    seq = [1, 2, 3, 4, 5, 9]                           # diverges after "5"
    feed = lm.sync(seq)
    assert feed == [9] and lm.cache.get_seq_length() == 5
    got = lm.forward(torch.tensor([feed]))[0, -1].float()
    torch.testing.assert_close(got, fresh_next_logits(target, seq), atol=1e-5, rtol=1e-5)
    # branches: expand to 3, select one, then sync
    lm.expand(3)
    lm.forward(torch.tensor([[1], [2], [3]]))
    lm.select(2)
    assert lm.tokens == [seq + [3]]
    seq2 = seq + [3, 8]
    got = lm.forward(torch.tensor([lm.sync(seq2)]))[0, -1].float()
    torch.testing.assert_close(got, fresh_next_logits(target, seq2), atol=1e-5, rtol=1e-5)


def test_prefill_reuse_keeps_the_common_prefix_and_generation_is_unchanged(pair):
    """prefill(reuse=True) feeds only what the cache lacks of prompt[:-1] (the last position's
    logits only: last_only), and a generation through a reused CachedLM is the very
    generation of a fresh one (same tokens, same decisions), prompt after prompt."""
    target, draft = pair
    lm = E.CachedLM(target)
    calls = lm.calls
    E.prefill(lm, [1, 2, 3, 4, 5], reuse=True)            # empty cache: feeds 1 2 3 4
    assert lm.tokens == [[1, 2, 3, 4]] and lm.calls == calls + 1
    lm.forward(torch.tensor([[5, 6]]))
    E.prefill(lm, [1, 2, 3, 4, 5], reuse=True)            # holds 1..6: crops, feeds nothing
    assert lm.tokens == [[1, 2, 3, 4]] and lm.calls == calls + 2
    E.prefill(lm, [1, 2, 7, 8, 9], reuse=True)            # keeps 1 2, feeds 7 8
    assert lm.tokens == [[1, 2, 7, 8]] and lm.cache.get_seq_length() == 4
    got = lm.forward(torch.tensor([[9]]))[0, -1].float()
    torch.testing.assert_close(got, fresh_next_logits(target, [1, 2, 7, 8, 9]), atol=1e-5,
                               rtol=1e-5)
    last = E.CachedLM(target).forward(torch.tensor([[3, 1, 4]]), last_only=True)
    assert last.shape == (1, 1, target.config.vocab_size)
    torch.testing.assert_close(last[0, -1].float(), fresh_next_logits(target, [3, 1, 4]))
    cfg = SamplingConfig(1.0)
    shared = E.CachedLM(target)
    for prompt, rule, k in (([5, 6, 7, 8], "token", 1), ([5, 6, 9], "rrs", 2),
                            ([5, 6, 7, 8], "kseq", 2)):
        runs = [E.generate(target, E.ModelDrafter(draft), prompt, max_new_tokens=10, rule=rule,
                           k=k, gamma=3, cfg=cfg, seed=4, target=t)
                for t in (shared, None)]
        assert runs[0].tokens == runs[1].tokens
        assert [(s.accepted, s.branch) for s in runs[0].steps] == \
            [(s.accepted, s.branch) for s in runs[1].steps]


@pytest.mark.parametrize("fed,k,g,branch", [(1, 2, 2, 1), (2, 3, 3, 2), (1, 3, 1, 0),
                                            (3, 2, 4, 1)])
def test_forward_tree_scores_each_branch_as_its_own_sequence(pair, fed, k, g, branch):
    """One row with tree attention gives every branch the logits of prefix + fed + branch,
    and after select_branch the cache, the token record and the feature store are those of
    the chosen sequence alone, through a later rollback into the branch too (float32)."""
    target, _ = pair
    gen = torch.Generator().manual_seed(100 * fed + 10 * k + g)
    held = [1, 2, 3, 4]
    feed = torch.randint(0, V, (fed,), generator=gen).tolist()
    drafts = torch.randint(0, V, (k, g), generator=gen)
    lm = E.CachedLM(target)
    lm.keep_features = True
    E.prefill(lm, held + [0])            # caches `held`; the branches go after the cache
    flat, rows = lm.forward_tree(feed, drafts)
    assert flat.shape == (1 + k * g, V) and rows.shape == (k, g + 1)
    logits = flat[rows]
    for j in range(k):
        seq = held + feed + drafts[j].tolist()
        torch.testing.assert_close(logits[j].float(),
                                   fresh_logits(target, seq)[len(held) + fed - 1:],
                                   atol=1e-5, rtol=1e-5)
    keep = g if branch % 2 else g - 1          # the whole branch, or its accepted prefix
    lm.select_branch(branch, keep=keep)
    seq = held + feed + drafts[branch].tolist()[:keep]
    assert lm.tokens == [seq] and lm.cache.get_seq_length() == len(seq)
    with torch.no_grad():
        ref = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(lm.feats[0], ref, atol=1e-5, rtol=1e-5)
    for nxt in (seq + [7], seq[: len(held) + fed + 1] + [8, 9]):   # keep all, roll back
        got = lm.forward(torch.tensor([lm.sync(nxt)]))[0, -1].float()
        torch.testing.assert_close(got, fresh_next_logits(target, nxt), atol=1e-5, rtol=1e-5)
        assert lm.tokens[0] == nxt


def fresh_logits(model, seq):
    with torch.no_grad():
        return model(torch.tensor([seq])).logits[0].float()


def test_forward_tree_guards_and_the_batch_fallback(pair, monkeypatch):
    target, draft = pair
    lm = E.CachedLM(target)
    E.prefill(lm, [1, 2, 3])
    with pytest.raises(RuntimeError, match="pending forward_tree"):
        lm.select_branch(0)
    lm.forward_tree([3], torch.tensor([[1], [2]]))
    with pytest.raises(RuntimeError, match="select_branch"):
        lm.forward(torch.tensor([[1]]))
    with pytest.raises(RuntimeError, match="select_branch"):
        lm.sync([1, 2, 3, 4])
    with pytest.raises(RuntimeError, match="pending"):
        lm.forward_tree([3], torch.tensor([[1], [2]]))
    with pytest.raises(ValueError, match="branch=2"):
        lm.select_branch(2)
    with pytest.raises(ValueError, match="keep=2"):
        lm.select_branch(1, keep=2)
    lm.select_branch(1)
    assert lm.tokens == [[1, 2, 3, 2]] and lm.cache.get_seq_length() == 4
    assert E.supports_tree(target)
    monkeypatch.setattr(E, "TREE_MODEL_TYPES", ("gpt2",))
    assert not E.supports_tree(target)
    with pytest.raises(ValueError, match="tree_attention"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="rrs", k=2,
                   tree_attention=True)
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="rrs", k=2)
    assert len(r.tokens) == 4            # unsupported models fall back to a batch of k rows


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_equals_the_walk(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert E.common_prefix(a, b) == n
    assert E.common_prefix(a + b, a + [9] + b) == len(a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_sdpa_is_bit_identical_to_sdpa_and_skips_the_kv_copy(dtype, monkeypatch):
    """models.GROUPED_SDPA gives the very logits of transformers' sdpa for every call the
    engine makes (prefill, 1 token, a 3-token verification, a tree row, a batch of branches),
    and its masked multi-token calls never expand the KV cache to every query head."""
    from transformers.integrations import sdpa_attention

    from coupling.llm import models

    copies = 0
    repeat_kv = sdpa_attention.repeat_kv

    def counting_repeat_kv(x, n_rep):
        nonlocal copies
        copies += n_rep > 1
        return repeat_kv(x, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting_repeat_kv)
    plain, grouped = tiny_llama(5).to(dtype), models.use_grouped_sdpa(tiny_llama(5).to(dtype))
    assert plain.config._attn_implementation == "sdpa"
    assert grouped.config._attn_implementation == models.GROUPED_SDPA
    assert E.supports_tree(grouped)
    outs, kv_copies = [], []
    for model in (plain, grouped):
        copies = 0
        lm = E.CachedLM(model)
        E.prefill(lm, [1, 2, 3, 4, 5])
        got = [lm.forward(torch.tensor([[5]])), lm.forward(torch.tensor([[6, 7, 8]]))]
        flat, rows = lm.forward_tree([9], torch.tensor([[1, 2], [3, 4]]))
        got.append(flat[rows])
        lm.select_branch(1)
        lm.expand(2)
        got.append(lm.forward(torch.tensor([[1, 2, 3], [4, 5, 6]])))
        with torch.no_grad():
            got.append(model(torch.tensor([[3, 1, 4, 1, 5, 9]])).logits)      # no cache
        outs.append(got)
        kv_copies.append(copies)
    for a, b in zip(*outs, strict=True):
        assert a.dtype == dtype and torch.equal(a, b)
    assert kv_copies[0] > 0 and kv_copies[1] == 0
    assert models.use_grouped_sdpa(grouped) is grouped     # idempotent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_sdpa_mask_is_sdpas_boolean_mask_made_additive_once(dtype):
    """The mask GROUPED_SDPA's layers get: 0 where transformers' sdpa mask says True, -inf where
    it says False (what the attention kernel made of the boolean mask in every layer), in the
    model's dtype; a mask sdpa skips stays None."""
    from transformers.masking_utils import sdpa_mask

    from coupling.llm import models

    kw = dict(batch_size=1, q_length=3, kv_length=7, q_offset=4)
    want = sdpa_mask(**kw)
    got = models._additive_sdpa_mask(**kw, dtype=dtype)
    assert want.dtype == torch.bool and got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got == 0, want) and torch.isneginf(got[~want]).all()
    assert models._additive_sdpa_mask(batch_size=1, q_length=3, kv_length=3,
                                      dtype=dtype) is None      # causal, no cache: skipped


@pytest.mark.parametrize("rule,k,drafter", [("kseq", 2, "model"), ("rrs", 3, "model"),
                                            ("rrs_wor", 2, "model"), ("optimal", 2, "model"),
                                            ("optimal_wor", 2, "feature"), ("rrs", 2, "feature")])
def test_tree_and_batch_layouts_make_the_same_decisions(pair, rule, k, drafter):
    """Both layouts score the same branches (float32: p agree to ~1e-7) with the same
    generator, so every decision and the whole stream coincide."""
    if rules_adapter.available().get(rule):
        pytest.skip(rules_adapter.available()[rule])
    target, draft = pair
    torch.manual_seed(3)
    fdraft = FD.FeatureDraft(target).eval()
    runs = []
    for tree in (True, False):
        d = E.ModelDrafter(draft) if drafter == "model" else FD.FeatureDrafter(fdraft)
        runs.append(E.generate(target, d, PROMPT, max_new_tokens=40, rule=rule, gamma=3, k=k,
                               cfg=SamplingConfig(1.0), seed=4, tree_attention=tree))
    tree, batch = runs
    assert tree.tokens == batch.tokens
    assert [(s.accepted, s.branch) for s in tree.steps] == \
        [(s.accepted, s.branch) for s in batch.steps]
    assert any(s.branch > 0 and s.accepted > 0 for s in tree.steps), "no later branch kept"


@pytest.mark.parametrize("rule,k", [("token", 1), ("block", 1)])
def test_engine_caches_track_the_emitted_stream(pair, rule, k):
    target, draft = pair
    cfg = SamplingConfig(1.0)
    tlm = E.CachedLM(target)
    dr = E.ModelDrafter(draft)
    prompt = [1, 2, 3]
    res = E.generate(target, dr, prompt, max_new_tokens=20, rule=rule, gamma=3, k=k, cfg=cfg,
                     seed=3, target=tlm, predict=True)
    seq = prompt + res.tokens
    assert len(res.tokens) == 20
    # the target cache holds a prefix of the committed stream; the next logits match a fresh run
    feed = tlm.sync(seq + [0])
    assert tlm.tokens[0] == (seq + [0])[: len(tlm.tokens[0])]
    got = tlm.forward(torch.tensor([feed]))[0, -1].float()
    torch.testing.assert_close(got, fresh_next_logits(target, seq + [0]), atol=1e-4, rtol=1e-4)
    assert all(0 <= s.accepted <= s.drafted for s in res.steps)
    assert res.block_efficiency == pytest.approx(np.mean([s.accepted + 1 for s in res.steps]))
    # the paired block-on-the-same-drafts value is recorded and, on a block run, is the rule's own
    drafted = [s for s in res.steps if s.drafted]
    assert drafted and all(s.block_on_drafts >= s.conditional - 1e-12 for s in drafted)
    if rule == "block":
        assert all(s.block_on_drafts == s.conditional for s in drafted)


def test_block_equals_token_on_point_mass_drafts(pair):
    """With q one-hot (n-gram drafts) r_i = p_i(X_i) <= 1, so w_j = prod r_i: block and token
    coincide on every block, including the steps where nothing was drafted."""
    target, _ = pair
    V = target.config.vocab_size
    prompt = [5, 6, 7, 8] * 4
    res = E.generate(target, E.NgramDrafter(V), prompt, max_new_tokens=30, rule="token",
                     gamma=3, k=1, cfg=SamplingConfig(1.0), seed=1, predict=True)
    assert {s.drafted > 0 for s in res.steps} == {True, False}  # both kinds of step occur
    for s in res.steps:
        assert s.block_on_drafts == pytest.approx(s.conditional, abs=1e-12)


# --------------------------------------------------------------------------- losslessness


def exact_two_token_law(target, prompt, cfg):
    """law[x1, x2] = p(x1 | prompt) p(x2 | prompt, x1), with cfg's transforms."""
    p1 = probs(fresh_next_logits(target, prompt)[None], cfg)[0].double()
    law = torch.zeros(V, V, dtype=torch.float64)
    for x1 in range(V):
        if p1[x1] > 0:
            p2 = probs(fresh_next_logits(target, prompt + [x1])[None], cfg)[0].double()
            law[x1] = p1[x1] * p2
    return law.numpy()


def two_token_counts(target, draft, prompt, cfg, rule, k, n, gamma=2, replacement=True,
                     drafter=None, tree=None):
    counts = np.zeros((V, V))
    dr = drafter or E.ModelDrafter(draft)
    tlm = E.CachedLM(target)
    for s in range(n):
        r = E.generate(target, dr, prompt, max_new_tokens=2, rule=rule, gamma=gamma, k=k,
                       cfg=cfg, seed=10_000 + s, target=tlm, replacement=replacement,
                       tree_attention=tree)
        counts[r.tokens[0], r.tokens[1]] += 1
    return counts


def chi2_pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    keep = law.ravel() > 0
    if counts.ravel()[~keep].sum() > 0:
        return 0.0  # a pair of target probability 0 was emitted: certainly not the target law
    exp = law.ravel()[keep] * counts.sum()
    obs = counts.ravel()[keep]
    return float(stats.chisquare(obs, exp / exp.sum() * obs.sum()).pvalue)


CFG3 = SamplingConfig(1.0, top_k=3)
PROMPT = [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("rule,k,tree", [("token", 1, None), ("block", 1, None),
                                         ("kseq", 2, True), ("rrs", 2, True),
                                         ("rrs_wor", 2, True), ("gumbel", 1, None),
                                         ("optimal", 2, True), ("optimal_wor", 2, True),
                                         ("rrs", 2, False)])
def test_first_two_tokens_follow_the_target_law(pair, rule, k, tree):
    """k > 1 branches verified as one row with tree attention, and (rrs) as a batch of k."""
    reason = rules_adapter.available().get(rule)
    if reason:
        pytest.skip(reason)
    target, draft = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    counts = two_token_counts(target, draft, PROMPT, CFG3, rule, k, n=1000, tree=tree)
    # false-positive rate 1e-3 per rule (fixed seeds: deterministic)
    assert chi2_pvalue(counts, law) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule,k", [("rrs", 2)])
def test_rules_are_lossless_for_the_int8_target(rule, k):
    """An int8 target is just another target: the first two tokens follow its own law
    (enumerated from the quantized model), as in the test above."""
    target, draft = int8_target()
    law = exact_two_token_law(target, PROMPT, CFG3)
    counts = two_token_counts(target, draft, PROMPT, CFG3, rule, k, n=1000, tree=True)
    assert chi2_pvalue(counts, law) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule,k", [("token", 1), ("rrs", 2)])
def test_feature_drafter_is_lossless(pair, rule, k):
    """The feature-level drafter (its q is whatever law it sampled from) keeps every rule
    lossless; here on an untrained FeatureDraft over the tiny target."""
    target, _ = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    fd = FD.FeatureDrafter(FD.FeatureDraft(target).eval())
    counts = two_token_counts(target, None, PROMPT, CFG3, rule, k, n=1000, drafter=fd)
    assert chi2_pvalue(counts, law) > 1e-3


@pytest.mark.parametrize("rule,k,int8", [("token", 1, False), ("rrs", 2, False),
                                          ("kseq", 3, False), ("token", 1, True)])
def test_feature_drafter_state_matches_fresh_recomputation(pair, rule, k, int8):
    """Incremental target features + a draft cache cropped to true-feature pairs (the lean
    layer on a PairCache) give the same first-position law as recomputing everything on the
    committed text through the Hugging Face body; with int8 weights too."""
    target, _ = pair
    torch.manual_seed(7)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)  # not the identity-like init: exercise the fc path
    if int8:
        draft.quantize_int8()
    fd = FD.FeatureDrafter(draft)
    cfg = SamplingConfig(1.0)
    seen = record_first_laws(fd)
    res = E.generate(target, fd, PROMPT, max_new_tokens=24, rule=rule, gamma=3, k=k, cfg=cfg,
                     seed=1)
    assert any(s.accepted < s.drafted for s in res.steps)
    assert len(seen) >= 4
    for seq, q in seen:
        torch.testing.assert_close(q, fresh_feature_law(target, draft, seq, cfg), atol=1e-5,
                                   rtol=1e-4)


@pytest.mark.parametrize("B,n0,n", [(1, 12, 1), (1, 12, 3), (2, 5, 1), (1, 0, 4)])
def test_native_feature_step_is_the_python_step_bit_for_bit(pair, B, n0, n):
    """With every product on the AVX2 int8 kernel, the feature draft's step runs as one C++
    call (``FeatureDraft.native_step``); its features, head logits (logit scale applied) and
    cache entries must be the Python lean path's, bit for bit: after a prefix, for several
    new pairs (the causal mask), and for k rows."""
    from coupling.llm import int8_kernel

    target, _ = pair
    torch.manual_seed(3)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
    draft.logit_scale = 1.4
    draft.quantize_int8()
    if int8_kernel.feature_step() is None:
        pytest.skip(f"no AVX2 int8 kernel here: {int8_kernel.status()}")
    assert draft._native is not None
    d = target.config.hidden_size
    g = torch.Generator().manual_seed(B * 100 + n0 + n)
    py, nat = FD.PairCache(), FD.PairCache()
    with torch.no_grad():
        if n0:
            ids0, f0 = torch.randint(0, V, (1, n0), generator=g), torch.randn(1, n0, d, generator=g)
            draft.features(ids0, f0, py)
            draft.native_step(ids0, f0, nat)
        if B > 1:
            py.batch_repeat_interleave(B)
            nat.batch_repeat_interleave(B)
        ids, f = torch.randint(0, V, (B, n), generator=g), torch.randn(B, n, d, generator=g)
        want = draft.features(ids, f, py)
        want_logits = draft.head_logits(want[:, -1])
        got, got_logits = draft.native_step(ids, f, nat)
    assert torch.equal(got, want) and torch.equal(got_logits, want_logits)
    assert py.length == nat.length == n0 + n
    assert torch.equal(py.k[:, :, :py.length], nat.k[:, :, :nat.length])
    assert torch.equal(py.v[:, :, :py.length], nat.v[:, :, :nat.length])
    # not int8 (or another product): the Python path, no native step
    assert FD.FeatureDraft(target).eval().native_step(ids, f, FD.PairCache()) is None


@pytest.mark.slow
def test_negative_control_always_accept_is_detected(pair, monkeypatch):
    """A verifier that accepts every draft outputs the draft's law: the test must catch it."""
    target, draft = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    qlaw = exact_two_token_law(draft, PROMPT, CFG3)
    assert 0.5 * np.abs(law - qlaw).sum() > 0.2  # the tiny draft really differs

    def always_accept(rule, drafts, q, p, seed, position, *, replacement=True):
        g = drafts.shape[1]
        bonus = int(torch.multinomial(p[0, g], 1))
        return g, 0, drafts[0].tolist() + [bonus]

    monkeypatch.setattr(rules_adapter, "decide", always_accept)
    counts = two_token_counts(target, draft, PROMPT, CFG3, "token", 1, n=1000)
    assert chi2_pvalue(counts, law) < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule,k,side", [("token", 1, "above"), ("token", 1, "below"),
                                         ("block", 1, "above"), ("rrs", 2, "above")])
def test_confidence_gated_blocks_follow_the_target_law(pair, rule, k, side):
    """``draft_confidence``: blocks of gamma = 2 where the draft's first law peaks at the
    threshold or more, of one token elsewhere. The threshold sits just above or just below
    the first step's peak, so both lengths occur within the runs (asserted); the first two
    tokens must still follow the target's law (level 1e-3, as above)."""
    target, draft = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    peak = float(probs(fresh_next_logits(draft, PROMPT)[None], CFG3).max())
    conf = peak + (-1e-6 if side == "above" else 1e-6)     # first step: gamma 2 / gamma 1
    counts = np.zeros((V, V))
    first, later = set(), set()
    tlm, dr = E.CachedLM(target), E.ModelDrafter(draft)
    for s in range(1000):
        r = E.generate(target, dr, PROMPT, max_new_tokens=3, rule=rule, gamma=2, k=k, cfg=CFG3,
                       seed=20_000 + s, target=tlm, draft_confidence=conf)
        counts[r.tokens[0], r.tokens[1]] += 1
        first.add(r.steps[0].drafted)
        later.update(st.drafted for st in r.steps[1:])
    assert first == {2 if side == "above" else 1}
    assert later == {1, 2}                      # later steps take both lengths
    assert chi2_pvalue(counts, law) > 1e-3


def test_draft_confidence_picks_the_block_length_from_the_first_law():
    """sample_chain drafts gamma tokens when max q1 reaches the threshold, else one; None
    always drafts gamma; generate rejects a threshold outside [0, 1]."""
    gen = torch.Generator().manual_seed(0)
    flat = torch.full((1, 4), 0.25)
    peaked = torch.tensor([[0.75, 0.125, 0.0625, 0.0625]])          # exact in float32

    def step(x):
        return peaked.expand(x.shape[0], -1)

    for q1, conf, want in [(flat, 0.5, 1), (peaked, 0.5, 3), (peaked, 0.75, 3),
                           (peaked, 0.76, 1), (flat, None, 3), (flat, 0.0, 3)]:
        toks, qs = E.sample_chain(q1, step, lambda k: None, 3, 1, gen, confidence=conf)
        assert toks.shape == (1, want) and qs.shape == (1, want, 4), (q1, conf)
        assert torch.equal(qs[0, 0], q1[0])
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="draft_confidence"):
            E.generate(None, None, PROMPT, max_new_tokens=2, draft_confidence=bad)


def test_generate_validates_arguments(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="k=2"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="token", k=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="nonsense")
    # what once ran silently wrong (a negative gamma: plain sampling) or failed obscurely
    # (IndexError from the embedding, "Overflow when unpacking long long", TypeError)
    bad = (({"gamma": -1}, "gamma=-1"), ({"max_new_tokens": 2.5}, "max_new_tokens=2.5"),
           ({"k": 2.5}, "k=2.5"), ({"seed": 2**70}, "seed="))
    for kwargs, msg in bad:
        with pytest.raises(ValueError, match=msg):
            E.generate(target, E.ModelDrafter(draft), PROMPT, **{"max_new_tokens": 4, **kwargs})
    for prompt, msg in (([], "at least one token"), ([1, V], "outside"), ([-1, 2], "outside")):
        with pytest.raises(ValueError, match=msg):
            E.generate(target, E.ModelDrafter(draft), prompt, max_new_tokens=4)
        with pytest.raises(ValueError, match=msg):
            E.autoregressive(target, prompt, max_new_tokens=4)
    for drafter in (E.NgramDrafter(V + 2), E.NoDrafter(V - 2), E.ModelDrafter(tiny_llama(2))):
        if drafter.vocab_size == V:
            continue
        with pytest.raises(ValueError, match="share one tokenizer"):
            E.generate(target, drafter, PROMPT, max_new_tokens=4)
    with pytest.raises(ValueError, match="k=0"):
        E.sample_chain(torch.full((1, V), 1 / V), None, None, 2, 0, torch.Generator())
    with pytest.raises(ValueError, match="gamma=0"):
        E.sample_chain(torch.full((1, V), 1 / V), None, None, 0, 1, torch.Generator())
    with pytest.raises(ValueError, match="gamma=-1"):
        E.NgramDrafter(V).propose(PROMPT, -1, 1, SamplingConfig(), torch.Generator())
    with pytest.raises(ValueError, match="vocab_size=3"):
        E.NgramDrafter(3).propose([5, 1, 5], 2, 1, SamplingConfig(), torch.Generator())


@pytest.mark.parametrize("kwargs, msg", [({"temperature": math.inf}, "finite"),
                                         ({"top_k": 2.5}, "integer"),
                                         ({"top_k": math.nan}, "integer"),
                                         ({"top_k": True}, "integer")])
def test_sampling_config_refuses_what_it_would_misread(kwargs, msg):
    """top_k = 2.5 read as 2 by the compiled path, NaN as "off", temperature = inf as a
    uniform law."""
    with pytest.raises(ValueError, match=msg):
        SamplingConfig(**kwargs)


def test_speedup_interval_is_exact_where_the_bootstrap_law_is_known():
    """demo.speedup_interval: prompts that all run r times faster give the point [r, r]; two
    prompts at speedups 1 and 2 (equal tokens and times) resample to "both 1" and "both 2"
    with probability 1/4 each, so the central 95% range is exactly [1, 2], and the 50% range
    lies inside it; the draws are seeded."""
    from coupling.llm.demo import speedup_interval

    assert speedup_interval([10, 20, 5], [1, 2, 0.5], [10, 20, 5], [2, 4, 1]) == \
        pytest.approx((2.0, 2.0), abs=1e-12)
    assert speedup_interval([7], [1.0], [7], [1.5]) == pytest.approx((1.5, 1.5))
    wide = speedup_interval([10, 10], [1, 1], [10, 10], [1, 2])
    assert wide == pytest.approx((1.0, 2.0), abs=1e-12)
    lo, hi = speedup_interval([10, 10], [1, 1], [10, 10], [1, 2], level=0.5)
    assert 1.0 <= lo <= hi <= 2.0 and hi - lo < 1.0
    rng = np.random.default_rng(3)
    t, s, at, as_ = rng.integers(50, 97, 8), rng.uniform(2, 4, 8), np.full(8, 96), \
        rng.uniform(3, 5, 8)
    a, b = speedup_interval(t, s, at, as_), speedup_interval(t, s, at, as_)
    pooled = (t.sum() / s.sum()) / (at.sum() / as_.sum())
    assert a == b and a[0] < pooled < a[1]


@pytest.mark.parametrize("args, kwargs, msg", [
    (([1, 2], [1, 1], [1], [1]), {}, "one entry per prompt"),
    (([], [], [], []), {}, "one entry per prompt"),
    (([1], [0.0], [1], [1]), {}, "seconds finite and > 0"),
    (([1], [1], [1], [float("nan")]), {}, "finite"),
    (([-1], [1], [1], [1]), {}, ">= 0"),
    (([1], [1], [1], [1]), {"level": 1.5}, "level=1.5"),
    (([1], [1], [1], [1]), {"resamples": 0}, "resamples=0")])
def test_speedup_interval_refuses_malformed_runs(args, kwargs, msg):
    from coupling.llm.demo import speedup_interval

    with pytest.raises(ValueError, match=msg):
        speedup_interval(*args, **kwargs)


@pytest.mark.parametrize("argv, msg", [
    (["--prompts", "0"], "--prompts 0"), (["--prompts", "1000"], "--prompts 1000"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"), (["--gamma", "-3"], "--gamma -3"),
    (["--threads", "-1"], "--threads -1"), (["--draft-confidence", "1.5"], "--draft-confidence"),
    (["--seed", str(2**64)], "--seed"), (["--methods", ""], "--methods"),
    (["--json", "/"], "is a directory"), (["--draft-head", "-5"], "--draft-head -5"),
    (["--draft-logit-scale", "-1"], "--draft-logit-scale"),
    (["--draft-logit-scale", "inf"], "--draft-logit-scale"),
    (["--draft-logit-scale", "nan"], "--draft-logit-scale")])
def test_demo_refuses_settings_before_loading_models(argv, msg):
    """--prompts 0 once ran 8 prompts and --gamma -3 plain sampling in the "token" row;
    --json on a directory failed after the whole run."""
    from coupling.llm import demo

    with pytest.raises(ValueError, match=msg):
        demo.check_args(demo._parser().parse_args(argv))
    demo.check_args(demo._parser().parse_args([]))        # the defaults pass


def test_gumbel_autoregressive_and_point_mass_drafts_agree(pair):
    """Drafter invariance on the tiny model: gumbel with model / n-gram / no drafts == AR."""
    reason = rules_adapter.available().get("gumbel")
    if reason:
        pytest.skip(reason)
    target, draft = pair
    cfg = SamplingConfig(1.0)
    ar = E.autoregressive(target, PROMPT, max_new_tokens=24, cfg=cfg, seed=5, gumbel=True)
    fd = FD.FeatureDrafter(FD.FeatureDraft(target).eval())
    for d in (E.ModelDrafter(draft), fd, E.NgramDrafter(V), E.NoDrafter(V)):
        r = E.generate(target, d, PROMPT, max_new_tokens=24, rule="gumbel", gamma=3, cfg=cfg,
                       seed=5)
        assert r.tokens == ar.tokens, d.name
    assert not math.isnan(ar.seconds)


def test_top_p_fast_path_equals_full_sort():
    """The top-k head shortcut and the full-sort fallback give the same nucleus."""
    from coupling.llm import sampling

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
    from coupling.llm import sampling

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
    from coupling.llm import sampling

    x = torch.zeros(1, 100)
    x[0, :3] = 1.0                                   # 3 leaders, then 97 ties at 0
    assert sampling._probs_top_k(x, SamplingConfig(1.0, 5, 1.0), window=8) is None
    pr = probs(x, SamplingConfig(1.0, 5, 1.0))[0]
    assert int((pr > 0).sum()) == 100                 # every tied entry kept, as the reference


def test_int8_linear_rounds_per_row_and_never_touches_shared_modules():
    """Int8Linear: each weight within half a step of its row's scale; the product equals a
    linear layer with the dequantised weight (kernel or fallback); quantising a draft leaves
    the target's (shared) embeddings, norm and head untouched."""
    from coupling.llm import models

    torch.manual_seed(0)
    for out_f, in_f in ((24, 16), (7, 5), (10, 24)):   # kernel-friendly and fallback shapes
        lin = torch.nn.Linear(in_f, out_f)
        q = models.Int8Linear.from_linear(lin)
        w = lin.weight.detach()
        err = (q.dequantized() - w).abs()
        assert bool((err <= q.scale[:, None] / 2 + 1e-7).all())
        assert int(q.qweight.abs().max()) == 127        # every row uses its full range
        x = torch.randn(2, 3, in_f)
        want = torch.nn.functional.linear(x, q.dequantized(), lin.bias.detach())
        torch.testing.assert_close(q(x), want, atol=1e-5, rtol=1e-5)
        assert (q.dense is None) == (in_f % 16 == 0)

    target = tiny_llama(6, layers=2)
    ids = torch.tensor([[1, 4, 2, 7]])
    with torch.no_grad():
        before = target(ids).logits.clone()
    spec = models.DraftSpec(1, (1,))
    draft = models.quantize_draft_int8(models.build_draft(target, spec))
    fd = FD.FeatureDraft(target).quantize_int8()
    assert isinstance(target.lm_head, torch.nn.Linear) and type(fd.head) is models.Int8Linear
    assert draft.lm_head is not target.lm_head and fd.head is not target.lm_head
    assert draft.model.embed_tokens is target.model.embed_tokens
    with torch.no_grad():
        torch.testing.assert_close(target(ids).logits, before, atol=0, rtol=0)
        assert torch.isfinite(draft(ids).logits).all()
    with pytest.raises(TypeError, match="not Linear"):
        models.quantize_linears_int8(fd, ("fc",))       # already quantised


def int8_target(seed: int = 7):
    """A tiny target and a draft built on it, then the target quantized (the demo's order)."""
    from coupling.llm import models

    target = tiny_llama(seed, layers=2)
    draft = models.build_draft(target, models.DraftSpec(1, (1,)))
    return models.quantize_target_int8(target), draft


def test_int8_target_quantizes_every_projection_and_leaves_earlier_drafts_alone():
    """quantize_target_int8: all seven projections of every layer and the head become
    Int8Linear (logits within 2% in norm), the embeddings stay; a draft built before keeps
    the original head module and its logits; a second call is a clear error; the engine's
    cached, rolled-back logits equal a fresh pass of the quantized target."""
    from coupling.llm import models

    target = tiny_llama(7, layers=2)
    draft = models.build_draft(target, models.DraftSpec(1, (1,)))
    head, emb = target.lm_head, target.model.embed_tokens.weight
    ids = torch.tensor([[1, 4, 2, 7, 3]])
    with torch.no_grad():
        before, d_before = target(ids).logits.clone(), draft(ids).logits.clone()
    assert models.quantize_target_int8(target) is target
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in target.model.layers:
        mods = [getattr(layer.self_attn, n, None) or getattr(layer.mlp, n) for n in names]
        assert all(type(m) is models.Int8Linear and m.dense is None for m in mods)
    assert type(target.lm_head) is models.Int8Linear
    assert target.model.embed_tokens.weight is emb and draft.lm_head is head
    with torch.no_grad():
        after = target(ids).logits
        torch.testing.assert_close(draft(ids).logits, d_before, atol=0, rtol=0)
    rel = float((after - before).norm() / before.norm())
    assert 0 < rel < 2e-2, rel
    with pytest.raises(ValueError, match="already weight-only int8"):
        models.quantize_target_int8(target)
    with pytest.raises(ValueError, match="build drafts from the target before"):
        models.build_draft(target, models.DraftSpec(1, (1,)))
    with pytest.raises(ValueError, match="build drafts from the target before"):
        FD.FeatureDraft(target)
    tlm = E.CachedLM(target)
    res = E.generate(target, E.ModelDrafter(draft), [1, 2, 3], max_new_tokens=12, rule="token",
                     gamma=3, cfg=SamplingConfig(1.0), seed=2, target=tlm)
    assert any(s.accepted < s.drafted for s in res.steps)
    seq = [1, 2, 3] + res.tokens
    inc = tlm.forward(torch.tensor([tlm.sync(seq)]))[0, -1].float()
    torch.testing.assert_close(inc, fresh_next_logits(target, seq), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg", [SamplingConfig(1.0), SamplingConfig(0.7, 3, 0.9),
                                 SamplingConfig(1.0, 8, 1.0), SamplingConfig(1.3, 0, 0.5)])
def test_subset_head_law_equals_the_law_of_the_full_logits(cfg):
    """FeatureDraft.law on the subset head's own logits == probs of the [V] logits with -inf
    off the subset (top-k larger than the subset included), int8 head or not."""
    from coupling.llm import models

    target = tiny_llama(8, layers=2)
    fd = FD.FeatureDraft(target).eval()
    fd.head = models.SubsetHead(target.lm_head.weight, torch.tensor([7, 2, 9, 0, 4, 5]))
    f = torch.randn(3, 16)
    for _ in range(2):
        with torch.no_grad():
            want = probs(fd.logits(f), cfg)
            got = fd.law(fd.head_logits(f), cfg)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)   # softmax summation order
        assert bool((got[:, [1, 3, 6, 8]] == 0).all())
        fd.head = models.quantized_head_int8(fd.head)   # second round: the int8 head


def test_pair_cache_lean_layer_matches_the_hugging_face_body(pair):
    """The drafter's lean layer on a PairCache (appends of several pairs, crop, k-row
    expansion, row selection) reproduces the Hugging Face body run on the whole sequence."""
    target, _ = pair
    torch.manual_seed(3)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
        ids = torch.randint(0, V, (1, 12))
        f = torch.randn(1, 12, 16)
        ref = draft.features(ids, f)                                   # no cache: HF body
        c = FD.PairCache(capacity=4)                                   # forces regrowth
        parts = [draft.features(ids[:, a:b], f[:, a:b], c) for a, b in ((0, 5), (5, 6), (6, 9))]
        torch.testing.assert_close(torch.cat(parts, 1), ref[:, :9], atol=1e-5, rtol=1e-5)
        c.crop(-2)                                                     # back to 7 pairs
        c.batch_repeat_interleave(3)
        out = draft.features(ids[:, 7:8].expand(3, -1), f[:, 7:8].expand(3, -1, -1), c)
        torch.testing.assert_close(out, ref[:, 7:8].expand(3, -1, -1), atol=1e-5, rtol=1e-5)
        c.batch_select_indices(torch.tensor([2]))
        out = draft.features(ids[:, 8:12], f[:, 8:12], c)
        torch.testing.assert_close(out, ref[:, 8:12], atol=1e-5, rtol=1e-5)
        assert c.get_seq_length() == 12
    with pytest.raises(ValueError, match="negative"):
        c.crop(2)


def test_lean_layer_stacked_int8_projections_are_bit_identical(pair):
    """FeatureDraft.quantize_int8 stacks q/k/v and gate/up into one int8 matrix each for the
    lean path (per-row scales: the stacked rows quantize as they do apart); the features are
    those of the seven separate int8 projections, bit for bit."""
    target, _ = pair
    torch.manual_seed(5)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
    draft.quantize_int8()
    assert draft.fused is not None and draft.fused_sizes == [
        m.out_features for m in (draft.body.layers[0].self_attn.q_proj,
                                 draft.body.layers[0].self_attn.k_proj,
                                 draft.body.layers[0].self_attn.v_proj)]
    ids, f = torch.randint(0, V, (1, 9)), torch.randn(1, 9, 16)
    outs = []
    for fused in (draft.fused, None):
        draft.fused = fused
        c = FD.PairCache()
        with torch.no_grad():
            outs.append(torch.cat([draft.features(ids[:, :6], f[:, :6], c)]
                                  + [draft.features(ids[:, i:i + 1], f[:, i:i + 1], c)
                                     for i in range(6, 9)], 1))
    assert torch.equal(outs[0], outs[1])


def test_rrs_without_replacement_drafts_fewer_branches_from_a_peaked_law(pair):
    """k distinct first tokens need k tokens of positive draft mass: a point-mass q (a
    top-p cut to one token; here top-k 1) drafts fewer branches instead of failing, and the
    engine and its prediction follow the branches actually drafted."""
    q1 = torch.zeros(1, 6)
    q1[0, 4] = 1.0
    gen = torch.Generator().manual_seed(0)
    rows = []
    drafts, q = E.sample_chain(q1, None, rows.append, 1, 3, gen, distinct_first=True)
    assert drafts.tolist() == [[4]] and q.shape == (1, 1, 6) and rows == [1]
    target, draft = pair
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=12, rule="rrs_wor",
                   gamma=2, k=2, cfg=SamplingConfig(1.0, top_k=1), seed=1, predict=True)
    assert len(r.tokens) == 12 and all(s.predicted >= 1.0 for s in r.steps)


def test_distinct_first_tokens_follow_successive_sampling():
    """The k = 2 distinct first tokens (drawn among the tokens of positive mass only) have the
    successive-sampling law P(a, b) = q_a q_b / (1 - q_a): chi-square at a 1e-3 false-positive
    rate on 20000 draws (fixed seed), and the same counts reject the law of two i.i.d. draws
    conditioned on being distinct, q_a q_b / (1 - sum q^2) (negative control)."""
    q = np.array([0.0, 0.5, 0.0, 0.25, 0.15, 0.0, 0.1, 0.0])
    q1 = torch.tensor(q[None], dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    counts = collections.Counter()
    for _ in range(20_000):
        drafts, _ = E.sample_chain(q1, None, lambda rows: None, 1, 2, gen, distinct_first=True)
        counts[tuple(drafts[:, 0].tolist())] += 1
    pairs = [(a, b) for a in range(8) for b in range(8) if a != b and q[a] > 0 and q[b] > 0]
    assert set(counts) <= set(pairs)
    f_obs = np.array([counts[ab] for ab in pairs], dtype=float)
    successive = np.array([q[a] * q[b] / (1 - q[a]) for a, b in pairs])
    conditioned = np.array([q[a] * q[b] / (1 - (q ** 2).sum()) for a, b in pairs])
    assert abs(successive.sum() - 1) < 1e-12 and abs(conditioned.sum() - 1) < 1e-12
    assert stats.chisquare(f_obs, successive * f_obs.sum()).pvalue > 1e-3
    assert stats.chisquare(f_obs, conditioned * f_obs.sum()).pvalue < 1e-6


@pytest.mark.parametrize("rule,k", [("kseq", 2), ("rrs", 3), ("rrs_wor", 2), ("optimal", 2),
                                    ("optimal_wor", 2)])
def test_optimal_prediction_bounds_the_rules_prediction_step_by_step(pair, rule, k):
    """"BE opt" evaluates the LP optimum of the rule's own information model (its k branches'
    draft law) on the laws of each step: never below the rule's own prediction, equal to it
    for the optimal rules, and with distinct drafts at least what i.i.d. drafts would give."""
    target, draft = pair
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=24, rule=rule,
                   gamma=2, k=k, cfg=SamplingConfig(1.0, top_k=8), seed=5, predict=True)
    assert r.steps
    for s in r.steps:
        assert s.optimal_predicted >= s.predicted - 1e-12
        if rule.startswith("optimal"):
            assert s.optimal_predicted == s.predicted
    if rule in ("kseq", "rrs"):
        assert any(s.optimal_predicted > s.predicted + 1e-6 for s in r.steps)


def test_without_replacement_is_refused_for_a_rule_defined_on_iid_branches(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="i.i.d. branches only"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="kseq",
                   gamma=2, k=2, replacement=False)


def test_optimal_without_replacement_drafts_distinct_branches_and_names_its_verifier(pair):
    """``optimal_wor`` = successive sampling of k distinct first tokens + the exact optimal
    plan for that tuple law (the backend's ``optimal`` with ``replacement=False``)."""
    assert rules_adapter.backend_rule("optimal_wor") == ("optimal", False)
    assert rules_adapter.backend_rule("optimal", False) == ("optimal", False)
    assert rules_adapter.backend_rule("kseq", False) == ("kseq", False)
    assert rules_adapter.distinct_first("optimal_wor")
    assert rules_adapter.distinct_first("rrs", False)
    assert not rules_adapter.distinct_first("kseq", False)
    target, draft = pair
    seen = []
    E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=16, rule="optimal_wor",
               gamma=2, k=2, cfg=SamplingConfig(1.0, top_k=8), seed=2,
               on_step=lambda rec, drafts, q, p: seen.append(drafts[:, 0].tolist()))
    assert seen and all(len(set(first)) == len(first) for first in seen)
    # a point-mass q drafts one branch instead of failing, as rrs_wor does
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=8, rule="optimal_wor",
                   gamma=2, k=2, cfg=SamplingConfig(1.0, top_k=1), seed=1, predict=True)
    assert len(r.tokens) == 8 and all(s.predicted >= 1.0 for s in r.steps)


def test_draft_sampler_never_returns_zero_probability_tokens_and_has_the_right_law():
    q = torch.tensor([[0.0, 0.5, 0.0, 0.25, 0.25]] * 20000)
    x = E._sample_rows(q, torch.Generator().manual_seed(0))
    counts = np.bincount(x.numpy(), minlength=5)
    assert counts[0] == counts[2] == 0
    assert stats.chisquare(counts[[1, 3, 4]], 20000 * np.array([0.5, 0.25, 0.25])).pvalue > 1e-3


def test_early_exit_is_the_first_layers_then_norm_and_head():
    """models.early_exit: the first L layers, the final norm, the head; every tensor shared."""
    from coupling.llm import models

    target = tiny_llama(4, layers=3)
    ee = models.early_exit(target, 2)
    assert ee.model.layers[1] is target.model.layers[1] and ee.lm_head is target.lm_head
    assert all(p.device.type != "meta" for p in ee.parameters())
    assert all(b.device.type != "meta" for b in ee.buffers())
    ids = torch.tensor([[1, 4, 2, 7, 3]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[2]   # after layer 2
        want = target.lm_head(target.model.norm(h))
        torch.testing.assert_close(ee(ids).logits, want)
    with pytest.raises(ValueError, match="n_layers"):
        models.early_exit(target, 3)


def test_draft_weight_files_round_trip(tmp_path, monkeypatch):
    """save_draft / save_feature_draft then load_*: the same tensors (at bf16), the same subset
    head, the spec and meta in the sidecar; a bad head_tokens request is a clear error."""
    import json

    from coupling.llm import models

    # the environment names the default file only: an explicit path always wins
    monkeypatch.setenv("COUPLING_DRAFT", str(tmp_path / "missing.safetensors"))
    monkeypatch.setenv("COUPLING_FEATURE_DRAFT", str(tmp_path / "missing.safetensors"))
    target = tiny_llama(5, layers=3)
    ranking = torch.tensor([7, 3, 9, 0, 5])
    spec = models.DraftSpec(1, (2,))
    draft = models.build_draft(target, spec)
    with torch.no_grad():
        for prm in draft.model.layers[0].parameters():
            prm.add_(0.01 * torch.randn_like(prm))
    path = models.save_draft(draft, spec, tmp_path / "d.safetensors", {"steps": 3}, ranking)
    assert json.loads(path.with_suffix(".json").read_text()) == {
        "spec": {"n_layers": 1, "init_layers": [2], "shared_layers": 0}, "steps": 3}
    back = models.load_draft(target, path, head_tokens=3)
    for (k, a), b in zip(models.own_state_dict(draft, spec).items(),
                         models.own_state_dict(back, spec).values(), strict=True):
        torch.testing.assert_close(b, a.to(torch.bfloat16).to(b.dtype), msg=k)
    ids = torch.tensor([[1, 4, 2]])
    with torch.no_grad():
        lg = back(ids).logits[0, -1]
    assert torch.isfinite(lg).nonzero().flatten().tolist() == [3, 7, 9]

    fd = FD.FeatureDraft(target)
    with torch.no_grad():
        fd.fc.bias.add_(0.5)
    fpath = FD.save_feature_draft(fd, tmp_path / "f.safetensors", {"steps": 4}, ranking)
    assert json.loads(fpath.with_suffix(".json").read_text()) == {"steps": 4}
    fback = FD.load_feature_draft(target, fpath, head_tokens=2)
    for (k, a), b in zip(fd.own_state_dict().items(), fback.own_state_dict().values(),
                         strict=True):
        torch.testing.assert_close(b, a.to(torch.bfloat16).to(b.dtype), msg=k)
    feats = torch.randn(1, 3, 16)
    with torch.no_grad():
        assert torch.isfinite(fback.logits(fback.features(ids, feats))[0, -1]).nonzero() \
            .flatten().tolist() == [3, 7]
    with pytest.raises(ValueError, match="head_tokens=6"):
        FD.load_feature_draft(target, fpath, head_tokens=6)
    with pytest.raises(FileNotFoundError, match="missing"):
        FD.load_feature_draft(target)
    with pytest.raises(FileNotFoundError, match="missing"):
        models.load_draft(target)
    with pytest.raises(ValueError, match="tokens"):
        models.SubsetHead(target.lm_head.weight, torch.tensor([1, 10]))   # V = 10
    models.save_draft(draft, spec, tmp_path / "n.safetensors")  # no ranking stored
    with pytest.raises(ValueError, match="no head_tokens ranking"):
        models.load_draft(target, tmp_path / "n.safetensors", head_tokens=2)


def test_draft_training_prompts_are_disjoint_from_the_demo_prompts():
    """The drafts are measured on the demo prompts: no training prompt may be one of them; the
    first diverse chat set (feature draft, stage 2) shares a 4-word opening with exactly one of
    them (documented in scripts/train_draft.py; the shipped draft was trained on it), the
    second (stage 3) and third (stage 4) with none."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("train_draft", root / "scripts/train_draft.py")
    td = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(td)
    demo = json.loads((root / "coupling/data/prompts.json").read_text())["prompts"]
    diverse = td.diverse_prompts(640, 3)
    assert len(set(diverse)) >= 150
    assert not set(demo) & (set(diverse) | set(td.corpus_prompts(960, 2)))
    prefix = {" ".join(d.split()[:4]) for d in demo}
    shared = {p for p in set(diverse) if " ".join(p.split()[:4]) in prefix}
    assert shared == {"Summarize the causes of the Great Depression."}
    # the second set (feature draft, stage 3): no prompt, template or opening in common
    second = td.diverse_prompts(640, 4, td.CHAT_KINDS_2)
    assert len(set(second)) >= 140 and not set(second) & (set(demo) | set(diverse))
    assert not {p for p in second if " ".join(p.split()[:4]) in prefix}
    assert not {t for t, _ in td.CHAT_KINDS_2} & {t for t, _ in td.CHAT_KINDS}
    # the third set (stage 4): nothing in common with the demo or the first two sets either
    third = td.diverse_prompts(640, 5, td.CHAT_KINDS_3)
    assert len(set(third)) >= 140 and not set(third) & (set(demo) | set(diverse) | set(second))
    assert not {p for p in third if " ".join(p.split()[:4]) in prefix}
    assert not {t for t, _ in td.CHAT_KINDS_3} & ({t for t, _ in td.CHAT_KINDS}
                                                  | {t for t, _ in td.CHAT_KINDS_2})
    earlier = {" ".join(p.split()[:4]) for p in set(diverse) | set(second)}
    assert not {" ".join(p.split()[:4]) for p in third} & earlier
    # the fourth set (stage 6): the same
    fourth = td.diverse_prompts(640, 6, td.CHAT_KINDS_4)
    assert len(set(fourth)) >= 135
    assert not set(fourth) & (set(demo) | set(diverse) | set(second) | set(third))
    assert not {p for p in fourth if " ".join(p.split()[:4]) in prefix}
    assert not {t for t, _ in td.CHAT_KINDS_4} & ({t for t, _ in td.CHAT_KINDS}
                                                  | {t for t, _ in td.CHAT_KINDS_2}
                                                  | {t for t, _ in td.CHAT_KINDS_3})
    earlier |= {" ".join(p.split()[:4]) for p in third}
    assert not {" ".join(p.split()[:4]) for p in fourth} & earlier
    assert set(td.PROMPT_SETS) == {"diverse", "diverse2", "diverse3", "diverse4"}


# --------------------------------------------------------------------------- calibrated scale


def test_target_law_on_topk_is_the_law_over_the_whole_vocabulary():
    """From the top-K log-probabilities alone (what corpora store), the law under settings
    that truncate to top_k <= K is exactly the law computed from all V logits."""
    from coupling.llm import calibrate as C

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(40, 300, generator=g) * 3
    logp = torch.log_softmax(logits, -1)
    vals, idx = logp.topk(64, -1)
    for cfg in (SamplingConfig(0.7, 50, 0.95), SamplingConfig(1.0, 64), SamplingConfig(1.3, 5)):
        got = torch.zeros(40, 300).scatter_(-1, idx, C.target_law_on_topk(vals, cfg))
        torch.testing.assert_close(got, probs(logits, cfg), atol=1e-6, rtol=0)
    for bad in (SamplingConfig(0.7), SamplingConfig(0.7, 65, 0.9)):
        with pytest.raises(ValueError, match="top_k"):
            C.target_law_on_topk(vals, bad)


@settings(max_examples=15, deadline=None)
@given(flat=st.floats(1.2, 2.0), seed=st.integers(0, 10_000))
def test_overlap_by_scale_finds_the_scale_that_undoes_a_flat_draft(flat, seed):
    """A draft whose logits are the target's divided by ``flat`` is recovered at s = flat
    (overlap 1 when its head holds every token) and the fit picks the grid point nearest to
    it; the overlap over the K stored tokens equals sum_x min(p, q) over the vocabulary."""
    from coupling.llm import calibrate as C

    g = torch.Generator().manual_seed(seed)
    V, N = 120, 64
    logits = torch.randn(N, V, generator=g) * 2.5
    cfg = SamplingConfig(0.7, 20, 0.95)
    vals, idx = torch.log_softmax(logits, -1).topk(32, -1)
    p = C.target_law_on_topk(vals, cfg)
    subset = torch.randperm(V, generator=g)[:90]            # the draft's head: 90 of 120 tokens
    lookup = torch.full((V,), -1, dtype=torch.long)
    lookup[subset] = torch.arange(90)
    assert torch.equal(C.subset_positions(subset, V), lookup)
    pos = lookup[idx]
    draft = logits[:, subset] / flat
    grid = tuple(round(1.0 + 0.05 * i, 2) for i in range(25))
    fit = C.overlap_by_scale(logits / flat, p, idx, cfg, grid, chunk=17)   # every token
    assert abs(C.best_scale(fit) - flat) <= 0.05 + 1e-9
    # a subset head: the number equals sum_x min(p, q) from full-vocabulary laws
    table = C.overlap_by_scale(draft, p, pos, cfg, grid, chunk=17)
    best = C.best_scale(table)
    q_full = torch.zeros(N, V).index_copy_(-1, subset, probs(best * draft, cfg))
    want = torch.minimum(probs(logits, cfg), q_full).sum(-1).mean()
    assert table[best] == pytest.approx(float(want), abs=1e-5)
    # with the whole vocabulary in the head, s = flat gives the target's own law back
    whole = C.overlap_by_scale(logits / flat, p, idx, cfg, (flat,))[flat]
    assert whole == pytest.approx(1.0, abs=1e-5)


def test_logit_scale_is_stored_with_the_weights_and_applied_by_both_drafts(tmp_path):
    """store_logit_scale writes the scale into a weights file; load_draft and
    load_feature_draft then sample from softmax(s * logits) (ScaledHead, composing with the
    subset head and int8), an explicit override wins, bad scales are clear errors, and a
    scaled draft is never saved as if it were trained weights."""
    import json

    from coupling.llm import calibrate as C
    from coupling.llm import models

    target = tiny_llama(6, layers=2)
    spec = models.DraftSpec(1, (1,))
    ranking = torch.tensor([7, 3, 9, 0, 5, 1, 2, 4])
    draft = models.build_draft(target, spec)
    path = models.save_draft(draft, spec, tmp_path / "d.safetensors", {"steps": 1}, ranking)
    plain = models.load_draft(target, path)
    assert plain.coupling_logit_scale == 1.0 and plain.lm_head is target.lm_head
    models.store_logit_scale(path, 1.45, {"logit_scale": 1.45, "note": "test"})
    assert json.loads(path.with_suffix(".json").read_text())["note"] == "test"
    ids = torch.tensor([[1, 4, 2, 8]])
    with torch.no_grad():
        ref = plain(ids).logits
        for head_tokens in (0, 5):
            scaled = models.load_draft(target, path, head_tokens=head_tokens)
            assert scaled.coupling_logit_scale == 1.45
            base = models.load_draft(target, path, head_tokens=head_tokens, logit_scale=1.0)
            want = base(ids).logits * 1.45
            torch.testing.assert_close(scaled(ids).logits, want)
            if head_tokens == 0:
                torch.testing.assert_close(want, ref * 1.45)
                assert scaled.lm_head.weight is target.lm_head.weight
                assert models.param_count(scaled, exclude_shared=True) == \
                    models.param_count(base, exclude_shared=True)
            q8 = models.quantize_draft_int8(models.load_draft(target, path, head_tokens=5))
            assert isinstance(q8.lm_head, models.ScaledHead)
            assert torch.isfinite(q8(ids).logits[0, -1]).sum() == 5
        over = models.load_draft(target, path, logit_scale=2.0)
        torch.testing.assert_close(over(ids).logits, ref * 2.0)
    with pytest.raises(ValueError, match="ScaledHead"):
        models.save_draft(models.load_draft(target, path), spec, tmp_path / "x.safetensors")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="logit_scale"):
            models.load_draft(target, path, logit_scale=bad)
        with pytest.raises(ValueError, match="logit_scale"):
            C.check_logit_scale(bad)

    fd = FD.FeatureDraft(target)
    fpath = FD.save_feature_draft(fd, tmp_path / "f.safetensors", {}, ranking)
    models.store_logit_scale(fpath, 1.4)
    fs = FD.load_feature_draft(target, fpath, head_tokens=6)
    f1 = FD.load_feature_draft(target, fpath, head_tokens=6, logit_scale=1.0)
    assert fs.logit_scale == 1.4 and f1.logit_scale == 1.0
    cfg = SamplingConfig(0.7, 4, 0.95)
    with torch.no_grad():
        feat = f1.features(ids, torch.randn(1, 4, 16))[:, -1]
        torch.testing.assert_close(fs.law(fs.head_logits(feat), cfg),
                                   probs(1.4 * f1.logits(feat), cfg))
        torch.testing.assert_close(fs.logits(feat), 1.4 * f1.logits(feat))


def test_feature_draft_training_overlap_term_is_the_calibration_overlap_and_has_gradients():
    """scripts/train_feature_draft.py's optional loss term (1 - exact overlap under the demo's
    settings) computes the same number as coupling.llm.calibrate, masked by the rows that have
    a stored law, and passes gradients to the logits."""
    import importlib.util
    from pathlib import Path

    from coupling.llm import calibrate as C

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("train_feature_draft",
                                                  root / "scripts/train_feature_draft.py")
    tfd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tfd)
    g = torch.Generator().manual_seed(11)
    V, S, K = 40, 30, 16
    full = torch.randn(2, 5, V, generator=g) * 2
    logp, idx = torch.log_softmax(full, -1).topk(K, -1)
    subset = torch.randperm(V, generator=g)[:S]
    lookup = torch.full((V,), -1, dtype=torch.long)
    lookup[subset] = torch.arange(S)
    pos = lookup[idx]
    mask = torch.tensor([[1.0, 1, 0, 1, 1], [0, 1, 1, 1, 0]])
    cfg = SamplingConfig(0.7, 10, 0.95)
    p_cfg = C.target_law_on_topk(logp, cfg)
    sub = (torch.randn(2, 5, S, generator=g) * 2).requires_grad_(True)
    got = tfd.cfg_overlap(sub, pos, p_cfg, mask, cfg, 1.3)
    per_row = C.topk_overlap(p_cfg.reshape(-1, K), probs(1.3 * sub.detach(), cfg).reshape(-1, S),
                             pos.reshape(-1, K))
    want = per_row[mask.flatten() > 0].mean()
    assert float(got.detach()) == pytest.approx(float(want), abs=1e-6)
    got.backward()
    assert torch.isfinite(sub.grad).all() and sub.grad.abs().sum() > 0


def test_demo_states_what_parallel_verification_cost():
    """The demo's line on the price of a verification call: the token rule's call over a
    decoding call, and the bound BE / c on any rule verifying gamma drafted tokens; it says
    that no such rule can win when the best BE does not exceed c (the n-gram drafter, whose
    calls often score fewer tokens, is left out of that claim)."""
    from coupling.llm.demo import verification_price

    def res(call_ms, bes):
        rules = {"token": {"target_call_ms": call_ms, "block_efficiency": bes[0],
                           "drafter": "trained"},
                 "block_feature": {"target_call_ms": call_ms, "block_efficiency": bes[1],
                                   "drafter": "feature"},
                 "token_ngram": {"target_call_ms": 60.0, "block_efficiency": 9.0,
                                 "drafter": "ngram"}}
        return {"rules": rules, "autoregressive_target_call_ms": 50.0,
                "settings": {"gamma": 2}, "models": {"target_quant": quant}}

    quant = "none"
    cheap = verification_price(res(51.0, (1.3, 1.55)))
    assert "1.02x a decoding call" in cheap and "none of them" not in cheap
    assert "--target-quant" not in cheap
    dear = verification_price(res(88.0, (1.38, 1.55)))
    assert "1.76x" in dear and "best such BE of this run, 1.55" in dear and "none of them" in dear
    assert "--target-quant w8a16 or int8" in dear   # the way out on a CPU without native bf16
    quant = "int8"
    assert "--target-quant" not in verification_price(res(88.0, (1.38, 1.55)))
    assert verification_price({"rules": {}, "autoregressive_target_call_ms": 50.0}) is None


def test_confidence_fit_predicts_the_gated_speed_exactly_on_toy_steps():
    """scripts/fit_draft_confidence.py's predictions: ungated (c = 0) it is the gamma = 2 step's
    speed over gamma = 1's, never gated (c > 1) exactly 1, and in between it counts only the
    gated steps' second-token yield and cost; likewise for a tree of 2 first drafts where the
    draft is unsure."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("fit", root / "scripts/fit_draft_confidence.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    peak = np.array([0.9, 0.2, 0.95, 0.4])
    a1 = np.array([0.8, 0.1, 0.9, 0.3])
    a2 = np.array([0.5, 0.4, 0.6, 0.2])
    base = (1 + a1).mean() / 30.0
    assert fit.predicted_speed(peak, a1, a2, 1.01, 30.0, 4.0) == pytest.approx(1.0)
    full = (1 + a1 + a1 * a2).mean() / 34.0
    assert fit.predicted_speed(peak, a1, a2, 0.0, 30.0, 4.0) == pytest.approx(full / base)
    gated = (1 + a1 + np.array([1, 0, 1, 0]) * a1 * a2).mean() / 32.0
    assert fit.predicted_speed(peak, a1, a2, 0.8, 30.0, 4.0) == pytest.approx(gated / base)
    # the tree where unsure: every step a tree (c > 1) is E[1 + opt2] over the tree's price;
    # c = 0 is the ungated chain; in between, each step counts as its own shape
    opt2 = np.array([0.85, 0.3, 0.95, 0.5])
    tree = fit.predicted_speed_tree
    assert tree(peak, a1, a2, opt2, 1.01, 30.0, 4.0, 5.0) == pytest.approx(
        (1 + opt2).mean() / 35.0 / base)
    assert tree(peak, a1, a2, opt2, 0.0, 30.0, 4.0, 5.0) == pytest.approx(full / base)
    mixed = (np.array([1 + a1[0] + a1[0] * a2[0], 1.3, 1 + a1[2] + a1[2] * a2[2], 1.5]).mean()
             / (30.0 + 4.0 * 0.5 + 5.0 * 0.5))
    assert tree(peak, a1, a2, opt2, 0.8, 30.0, 4.0, 5.0) == pytest.approx(mixed / base)


def test_speedup_vs_premium_reads_both_json_layouts_and_fits_exactly(tmp_path, capsys):
    """scripts/speedup_vs_premium.py: the premium is the rule's mean target call over plain
    sampling's, read from a demo JSON and from bench_llm.py's nested one; files without the
    rule or its call time are skipped; on points on a line the fit is that line, r = -1."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("svp", root / "scripts/speedup_vs_premium.py")
    svp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(svp)

    def demo(ar_ms, ms, speedup):
        return {"autoregressive_target_call_ms": ar_ms,
                "rules": {"block_feature": {"target_call_ms": ms, "block_efficiency": 1.5,
                                            "speedup_vs_autoregressive": speedup}}}

    (tmp_path / "a.json").write_text(json.dumps(demo(30.0, 31.5, 1.34)))            # flat
    (tmp_path / "b.json").write_text(json.dumps({"demo": demo(30.0, 33.0, 1.28)}))  # nested
    (tmp_path / "c.json").write_text(json.dumps(demo(30.0, 34.5, 1.22)))
    (tmp_path / "d.json").write_text(json.dumps({"rules": {}}))                     # skipped
    paths = sorted(tmp_path.glob("*.json"))
    table = svp.rows(paths, "block_feature")
    assert [(t[0], t[1]) for t in table] == [("a", 1.05), ("b", 1.1), ("c", 1.15)]
    slope, icept, r = svp.fit([t[1] for t in table], [t[4] for t in table])
    assert slope == pytest.approx(-1.2) and icept == pytest.approx(2.6) and r == pytest.approx(-1)
    assert svp.main([str(p) for p in paths]) == 0
    assert "at premium 1.00: 1.400x" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        svp.main([str(paths[-1])])                  # no file has the rule: a clear error


def test_target_quant_lists_are_parsed_and_bad_entries_named():
    from coupling.llm import models

    assert models.target_quants("none") == ["none"]
    assert models.target_quants("int8,w8a16") == ["int8", "w8a16"]
    for bad in ("int4", "int8,", "w8a16,fp8"):
        with pytest.raises(ValueError, match=f"--target-quant {bad}: choose among none, int8"):
            models.target_quants(bad)


def test_demo_picks_the_int8_target_and_gated_gamma_only_where_the_cpu_is_avx2():
    """``--target-quant auto`` and an unset ``--gamma``: the int8-weight target with integer
    sums (``w8a16``) at gamma 2 gated at a first-law peak of ``INT8_DRAFT_CONFIDENCE`` on a
    CPU whose best instruction set is AVX2 (no native bf16 products), the bf16 target at an
    ungated gamma 2 on an AVX-512 CPU and on CUDA; explicit values are kept (an explicit gamma
    is not gated unless asked), and each choice made here is said."""
    from coupling.llm.demo import INT8_DRAFT_CONFIDENCE, _parser, auto_settings, resolve_auto

    quant, gamma, conf, why = auto_settings("cpu", "auto", None, capability="AVX2")
    assert (quant, gamma, conf) == ("w8a16", 2, INT8_DRAFT_CONFIDENCE) == ("w8a16", 2, 0.8)
    assert len(why) == 2 and "AVX2" in why[0] and "0.8" in why[1]
    assert auto_settings("cpu", "auto", None, capability="AVX512")[:3] == ("none", 2, None)
    assert auto_settings("cuda", "auto", None)[:3] == ("none", 2, None)
    assert auto_settings("cpu", "none", None, capability="AVX2")[:3] == ("none", 2, None)
    assert auto_settings("cpu", "int8", None, capability="AVX512")[:3] == ("int8", 2, 0.8)
    assert auto_settings("cpu", "int8", None, capability="AVX2",
                         draft_confidence=0.5)[:3] == ("int8", 2, 0.5)
    assert auto_settings("cpu", "w8a16", None, capability="AVX512")[:3] == ("w8a16", 2, 0.8)
    assert auto_settings("cpu", "auto", 3, capability="AVX2")[:3] == ("w8a16", 3, None)
    assert auto_settings("cpu", "none", 2, capability="AVX2") == ("none", 2, None, [])
    args = _parser().parse_args(["--target-quant", "none", "--gamma", "4"])
    assert args.target_quant == "none" and args.gamma == 4
    resolve_auto(args)
    assert (args.target_quant, args.gamma, args.draft_confidence, args.auto) == \
        ("none", 4, None, [])
    args = _parser().parse_args(["--gamma", "1", "--draft-confidence", "0.6"])
    assert resolve_auto(args).draft_confidence == 0.6
    args = _parser().parse_args([])
    assert (args.target_quant, args.gamma) == ("auto", None)
    resolve_auto(args)
    assert args.target_quant in ("none", "w8a16") and args.gamma == 2 and args.auto
    assert args.draft_confidence == (0.8 if args.target_quant == "w8a16" else None)
    args.gamma = 5
    assert resolve_auto(args).gamma == 5                      # resolved once

