"""Engine tests on tiny random Llama models (fast; no real checkpoint needed): drafters,
caches and rollback, tree attention, the rules' adapter, predictions, and the law of what the
engine emits.

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

from coupling.llm import accel, cache, rules_adapter
from coupling.llm import engine as E
from coupling.llm import feature_draft as FD
from coupling.llm import predict as P
from coupling.llm.sampling import SamplingConfig, probs
from coupling.tree import Tree
from tests.llm_helpers import (
    V,
    fresh_feature_law,
    fresh_next_logits,
    int8_target,
    record_first_laws,
    tiny_llama,
    tiny_pair,
)


@pytest.fixture(scope="module")
def pair():
    yield from tiny_pair()


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
    assert P.conditional("token", drafts, q, p, 0) == pytest.approx(1 + 0.5 + 0.5)
    # exact from the block path law: w_gamma = 1 accepts the whole block on these drafts
    assert P.conditional("block", drafts, q, p, 0) == pytest.approx(3.0)


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
    draft q never proposes is refused by name, never an IndexError, a silently wrong value or
    inf."""
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


@given(st.integers(0, 2**31 - 1), st.integers(1, 3), st.integers(2, 4))
@settings(max_examples=60, deadline=None)
def test_block_on_the_same_drafts_never_below_token_over_the_draft_law(seed, g, V):
    """The paired comparison the demo reports, enumerated over every drafted path.

    Pathwise, w_j >= prod_{i<=j} min(1, r_i) (induction), so block's estimate 1 + sum_j w_j
    is never below token's exact conditional. Block's exact conditional (its path law) can
    be below token's on one path; over the draft law its mean is the estimate's mean
    (Sun et al.: P(tau >= j | X^j) = w_j), so block is never below token in expectation."""
    import itertools

    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(1, g, V, generator=gen, dtype=torch.float64) ** 3
    q /= q.sum(-1, keepdim=True)
    p = torch.rand(1, g + 1, V, generator=gen, dtype=torch.float64) ** 3
    p /= p.sum(-1, keepdim=True)
    tok = blk = est = 0.0
    for path in itertools.product(range(V), repeat=g):
        drafts = torch.tensor([path])
        weight = float(q[0, torch.arange(g), drafts[0]].prod())
        t, b = P.conditional("token", drafts, q, p, 0), P.conditional("block", drafts, q, p, 0)
        e = 1 + sum(P.step_beta("block", drafts, q, p, 0, 1))
        assert 1.0 <= t <= e + 1e-12 <= g + 1 + 1e-12
        assert 1.0 - 1e-12 <= b <= g + 1 + 1e-12
        tok, blk, est = tok + weight * t, blk + weight * b, est + weight * e
    assert blk == pytest.approx(est, abs=1e-12)
    assert tok <= blk + 1e-12


@given(st.integers(0, 2**31 - 1),
       st.sampled_from([("token", 1, True), ("block", 1, True), ("gumbel", 1, True),
                        ("kseq", 2, True), ("rrs", 3, True), ("rrs", 2, False),
                        ("optimal", 2, True), ("optimal", 2, False)]),
       st.integers(1, 4), st.integers(4, 30))
@settings(max_examples=150, deadline=None)
def test_compressed_decisions_equal_full_vocabulary_decisions(seed, rule_k, g, top):
    """The adapter hands a rule only the tokens where some p or q has mass (and gumbel their
    keyed noise); every verdict equals the one on the full vocabulary."""
    rule, k, replacement = rule_k
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
            elif not replacement and i == 0:
                if j == 0:
                    first = torch.multinomial(qi, k, replacement=False, generator=gen)
                drafts[j, 0] = first[j]
            else:
                drafts[j, i] = torch.multinomial(qi, 1, generator=gen)[0]
    got = [rules_adapter.decide(rule, drafts, q, p, seed % 97, 40, replacement=replacement,
                                compress=c) for c in (True, False)]
    assert got[0] == got[1]


@given(st.integers(0, 2**31 - 1), st.sampled_from(["token", "block"]), st.integers(1, 4),
       st.integers(0, 10**6))
@settings(max_examples=100, deadline=None)
def test_decide_verdicts_equal_the_batched_twin(seed, rule, g, position):
    """On a CPU the adapter runs the rule's numpy core on keyed uniforms hashed in numpy
    (coupling.keyed.call_uniforms); its verdicts equal the batched torch twin's, whose
    uniforms are hashed in torch, at every position."""
    import coupling

    gen = torch.Generator().manual_seed(seed)
    V = 40
    cfg = SamplingConfig(1.0, top_k=8)
    p = probs(torch.randn(g + 1, V, generator=gen, dtype=torch.float64) * 2, cfg).float()[None]
    q = probs(torch.randn(g, V, generator=gen, dtype=torch.float64) * 2, cfg).float()[None]
    drafts = torch.multinomial(q[0], 1, generator=gen).T                  # [1, g]
    v = coupling.verify(rule, drafts[None], p[None], q[None], seeds=torch.tensor([seed % 97]),
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
    does, for every rule, never return a verdict."""
    g = 2
    p = torch.zeros(2, g + 1, 12)
    p[..., :4] = 0.25
    q = torch.zeros(2, g, 12)
    q[..., :4] = 0.25
    (p if law == "p" else q)[0, 1, 9] = bad          # column 9: no other row has mass there
    drafts = torch.tensor([[1, 2], [3, 0]])
    want = "NaN or inf" if bad != -1e-3 else "negative entries"
    with accel.disabled(*(() if native else accel.NAMES)):
        for rule in rules_adapter.RULES:
            k, replacement = next((k, r) for k, r in ((2, True), (2, False), (1, True))
                                  if _engine_runs(rule, k, r))
            for compress in (True, False):
                with pytest.raises(ValueError, match=f"{law} (contains|has) .*{want}"):
                    rules_adapter.decide(rule, drafts[:k], q[:k], p[:k], 3, 7,
                                         replacement=replacement, compress=compress)


def _engine_runs(rule: str, k: int, replacement: bool) -> bool:
    try:
        rules_adapter.check_rule(rule, k, replacement, lossy=True)
    except ValueError:
        return False
    return True


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
    monkeypatch.setattr(cache, "TREE_MODEL_TYPES", ("gpt2",))
    assert not E.supports_tree(target)
    with pytest.raises(ValueError, match="tree_attention"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="rrs", k=2,
                   tree_attention=True)
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="rrs", k=2)
    assert len(r.tokens) == 4            # unsupported models fall back to a batch of k rows


def test_tree_entries_over_several_calls_score_their_own_paths(pair):
    """forward_nodes: entries fed over two calls (as a drafter grows a tree level by level)
    get the logits of the committed text followed by their own path; select_path keeps one
    path's entries, and the cache, the token record and the feature store are then those of
    that sequence alone (float32)."""
    target, _ = pair
    held, feed = [1, 2, 3, 4], [5, 6]
    lm = E.CachedLM(target)
    lm.keep_features = True
    E.prefill(lm, held + [0])
    first = lm.forward_nodes(feed, [7, 8], [-1, -1])          # two children of the root
    second = lm.forward_nodes([], [9, 0, 2], [0, 0, 1])        # their children
    assert first.shape == (4, V) and second.shape == (3, V)
    paths = {0: [7], 1: [8], 2: [7, 9], 3: [7, 0], 4: [8, 2]}
    rows = list(first[1:]) + list(second)
    torch.testing.assert_close(first[1].float(), fresh_next_logits(target, held + feed),
                               atol=1e-5, rtol=1e-5)
    for e, path in paths.items():
        torch.testing.assert_close(rows[1 + e].float(),
                                   fresh_next_logits(target, held + feed + path),
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="no path"):
        lm.select_path([0, 4])
    lm.select_path([1, 4])
    seq = held + feed + [8, 2]
    assert lm.tokens == [seq] and lm.cache.get_seq_length() == len(seq)
    with torch.no_grad():
        ref = target(torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(lm.feats[0], ref, atol=1e-5, rtol=1e-5)
    nxt = seq + [3]
    got = lm.forward(torch.tensor([lm.sync(nxt)]))[0, -1].float()
    torch.testing.assert_close(got, fresh_next_logits(target, nxt), atol=1e-5, rtol=1e-5)


def test_a_tree_run_records_its_exact_conditional_prediction(pair):
    """Each tree step's prediction is the exact expected tokens given the drafted tree
    (conditional_tree_tokens on the laws the step saw), the steps' accepted nodes form paths
    of the tree, and a tree of one chain is a chain run's decisions."""
    from coupling.sequence.predict import conditional_tree_tokens

    target, draft = pair
    tree = Tree.from_branching([2, 2])
    seen = []
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=20, rule="rrs",
                   cfg=CFG3, seed=3, tree=tree, predict=True,
                   on_step=lambda rec, x, q, p: seen.append((rec, x, q, p)))
    assert len(r.tokens) == 20 and seen
    for rec, x, q, p in seen:
        assert rec.predicted == conditional_tree_tokens(
            "rrs", tree, x.numpy(), p.double().numpy(), q.double().numpy())
        assert 1.0 <= rec.predicted <= tree.depth + 1
        assert rec.accepted == (tree.depths[rec.branch] if rec.branch >= 0 else 0)
    chain = [E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=12, rule="token",
                        gamma=3, cfg=CFG3, seed=5, **kw) for kw in ({}, {"tree": Tree.chain(3)})]
    assert chain[0].tokens == chain[1].tokens
    flat = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=8, rule="rrs",
                      cfg=CFG3, seed=5, tree=Tree.from_branching([3]))    # depth 1: no feed
    assert len(flat.tokens) == 8 and max(s.accepted for s in flat.steps) <= 1


def test_generate_refuses_trees_it_cannot_run(pair):
    target, draft = pair
    d = E.ModelDrafter(draft)
    cases = [(dict(tree=[2, 2]), TypeError, "coupling.Tree"),
             (dict(tree=Tree.from_branching([2, 2]), k=2), ValueError, "leave k=1"),
             (dict(tree=Tree.from_branching([2, 2]), rule="block"), ValueError, "Tree.from_chains"),
             (dict(tree=Tree.named("medusa", size=4)), ValueError, "drafter-invariant"),
             (dict(tree=Tree.from_branching([2]), drafter=E.NgramDrafter(V)), ValueError,
              "ModelDrafter")]
    for kw, exc, match in cases:
        kw = {"rule": "rrs", "drafter": d, **kw}
        with pytest.raises(exc, match=match):
            E.generate(target, kw.pop("drafter"), PROMPT, max_new_tokens=4, **kw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_equals_the_walk(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert E.common_prefix(a, b) == n
    assert E.common_prefix(a + b, a + [9] + b) == len(a)


@pytest.mark.parametrize("rule,k,replacement,drafter", [
    ("kseq", 2, True, "model"), ("rrs", 3, True, "model"), ("rrs", 2, False, "model"),
    ("optimal", 2, True, "model"), ("optimal", 2, False, "feature"), ("rrs", 2, True, "feature")])
def test_tree_and_batch_layouts_make_the_same_decisions(pair, rule, k, replacement, drafter):
    """Both layouts score the same branches (float32: p agree to ~1e-7) with the same
    generator, so every decision and the whole stream coincide."""
    target, draft = pair
    torch.manual_seed(3)
    fdraft = FD.FeatureDraft(target).eval()
    runs = []
    for tree in (True, False):
        d = E.ModelDrafter(draft) if drafter == "model" else FD.FeatureDrafter(fdraft)
        runs.append(E.generate(target, d, PROMPT, max_new_tokens=40, rule=rule, gamma=3, k=k,
                               replacement=replacement, cfg=SamplingConfig(1.0), seed=4,
                               tree_attention=tree))
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
    # the paired block-on-the-same-drafts value is recorded and, on a block run, is the rule's
    # own; per step either rule may be ahead (block leads in expectation over the drafts only)
    drafted = [s for s in res.steps if s.drafted]
    assert drafted and all(1 - 1e-12 <= x <= s.drafted + 1 + 1e-12 for s in drafted
                           for x in (s.block_on_drafts, s.conditional))
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
                     drafter=None, tree=None, topology=None):
    counts = np.zeros((V, V))
    dr = drafter or E.ModelDrafter(draft)
    tlm = E.CachedLM(target)
    for s in range(n):
        r = E.generate(target, dr, prompt, max_new_tokens=2, rule=rule, gamma=gamma, k=k,
                       cfg=cfg, seed=10_000 + s, target=tlm, replacement=replacement,
                       tree_attention=tree, tree=topology)
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
@pytest.mark.parametrize("rule,k,replacement,tree", [
    ("token", 1, True, None), ("block", 1, True, None), ("kseq", 2, True, True),
    ("rrs", 2, True, True), ("rrs", 2, False, True), ("gumbel", 1, True, None),
    ("optimal", 2, True, True), ("optimal", 2, False, True), ("rrs", 2, True, False)])
def test_first_two_tokens_follow_the_target_law(pair, rule, k, replacement, tree):
    """k > 1 branches verified as one row with tree attention, and (rrs) as a batch of k."""
    target, draft = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    counts = two_token_counts(target, draft, PROMPT, CFG3, rule, k, n=1000,
                              replacement=replacement, tree=tree)
    # false-positive rate 1e-3 per rule (fixed seeds: deterministic)
    assert chi2_pvalue(counts, law) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule,topology", [
    ("rrs", Tree.from_branching([2, 2])),
    ("rrs", Tree.from_branching([2, 1], children="distinct")),
    ("token", Tree.chain(2)),
    ("strict", Tree.named("medusa", size=6))])
def test_static_trees_follow_the_target_law(pair, rule, topology):
    """generate(tree=): a tree drafted level by level by tree attention in the draft, verified
    in one target call node by node, emits the target's law (i.i.d., distinct and top-k
    children; false-positive rate 1e-3 per case, fixed seeds)."""
    target, draft = pair
    law = exact_two_token_law(target, PROMPT, CFG3)
    counts = two_token_counts(target, draft, PROMPT, CFG3, rule, 1, n=1000, topology=topology)
    assert chi2_pvalue(counts, law) > 1e-3


@pytest.mark.slow
def test_a_tree_whose_drafts_are_not_drawn_from_q_is_detected(pair, monkeypatch):
    """Negative control of the tree test above: the drafter takes the likeliest tokens but
    reports i.i.d. children; rrs is then lossy, and the same test rejects it."""
    from coupling.llm import drafters

    target, draft = pair
    monkeypatch.setattr(drafters, "draw_children",
                        lambda law, m, children, gen: torch.topk(law, m).indices)
    law = exact_two_token_law(target, PROMPT, CFG3)
    counts = two_token_counts(target, draft, PROMPT, CFG3, "rrs", 1, n=1000,
                              topology=Tree.from_branching([2, 2]))
    assert chi2_pvalue(counts, law) < 1e-3


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
    # what would run silently wrong (a negative gamma: plain sampling) or fail obscurely
    # (IndexError from the embedding, "Overflow when unpacking long long", TypeError)
    bad = (({"gamma": -1}, "gamma must be an integer >= 0, got -1"),
           ({"max_new_tokens": 2.5}, "max_new_tokens must be a positive integer, got 2.5"),
           ({"k": 2.5}, "k must be a positive integer, got 2.5"), ({"seed": 2**70}, "seed="))
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
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        E.sample_chain(torch.full((1, V), 1 / V), None, None, 2, 0, torch.Generator())
    with pytest.raises(ValueError, match="gamma must be a positive integer, got 0"):
        E.sample_chain(torch.full((1, V), 1 / V), None, None, 0, 1, torch.Generator())
    with pytest.raises(ValueError, match="gamma must be an integer >= 0, got -1"):
        E.NgramDrafter(V).propose(PROMPT, -1, 1, SamplingConfig(), torch.Generator())
    with pytest.raises(ValueError, match="vocab_size=3"):
        E.NgramDrafter(3).propose([5, 1, 5], 2, 1, SamplingConfig(), torch.Generator())


def test_gumbel_autoregressive_and_point_mass_drafts_agree(pair):
    """Drafter invariance on the tiny model: gumbel with model / n-gram / no drafts == AR."""
    target, draft = pair
    cfg = SamplingConfig(1.0)
    ar = E.autoregressive(target, PROMPT, max_new_tokens=24, cfg=cfg, seed=5, gumbel=True)
    fd = FD.FeatureDrafter(FD.FeatureDraft(target).eval())
    for d in (E.ModelDrafter(draft), fd, E.NgramDrafter(V), E.NoDrafter(V)):
        r = E.generate(target, d, PROMPT, max_new_tokens=24, rule="gumbel", gamma=3, cfg=cfg,
                       seed=5)
        assert r.tokens == ar.tokens, d.name
    assert not math.isnan(ar.seconds)


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
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=12, rule="rrs",
                   gamma=2, k=2, replacement=False, cfg=SamplingConfig(1.0, top_k=1), seed=1,
                   predict=True)
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


@pytest.mark.parametrize("rule,k,replacement", [("kseq", 2, True), ("rrs", 3, True),
                                                ("rrs", 2, False), ("optimal", 2, True),
                                                ("optimal", 2, False)])
def test_optimal_prediction_bounds_the_rules_prediction_step_by_step(pair, rule, k,
                                                                     replacement):
    """"BE opt" evaluates the LP optimum of the rule's own information model (its k branches'
    draft law) on the laws of each step: never below the rule's own prediction, equal to it
    for the optimal rules, and with distinct drafts at least what i.i.d. drafts would give."""
    target, draft = pair
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=24, rule=rule,
                   gamma=2, k=k, replacement=replacement, cfg=SamplingConfig(1.0, top_k=8),
                   seed=5, predict=True)
    assert r.steps
    for s in r.steps:
        assert s.optimal_predicted >= s.predicted - 1e-12
        if rule == "optimal":
            assert s.optimal_predicted == s.predicted
    if rule in ("kseq", "rrs"):
        assert any(s.optimal_predicted > s.predicted + 1e-6 for s in r.steps)


def test_without_replacement_is_refused_for_a_rule_defined_on_iid_branches(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="replacement=False"):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule="kseq",
                   gamma=2, k=2, replacement=False)


@pytest.mark.parametrize("rule,k,replacement,msg", [
    ("rrs_wor", 2, True, "choose one of"), ("optimal_wor", 2, True, "choose one of"),
    ("greedy", 2, False, "its own law"), ("spechub", 2, False, "its own law"),
    ("greedy", 2, True, "replacement=True"), ("spechub", 3, False, "k=3"),
    ("typical", 1, True, "lossy"), ("relaxed", 2, True, "lossy")])
def test_rules_the_engine_cannot_run_as_asked_are_refused(pair, rule, k, replacement, msg):
    """Exactly the registry's names; a draft law the rule does not take; a rule whose draft
    law is its own (greedy's top tokens, spechub's hub), which the drafters do not draw; a
    lossy rule unless labelled lossy."""
    target, draft = pair
    with pytest.raises(ValueError, match=msg):
        E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=4, rule=rule,
                   gamma=2, k=k, replacement=replacement)
    with pytest.raises(ValueError, match=msg):
        rules_adapter.check_rule(rule, k, replacement)


def test_rules_with_their_own_draft_law_run_at_one_draft_and_lossy_rules_labelled(pair):
    target, draft = pair
    for rule in ("greedy", "spechub"):
        r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=6, rule=rule,
                       gamma=2, k=1, seed=1)
        assert len(r.tokens) == 6 and r.lossless
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=6, rule="typical",
                   gamma=2, k=2, seed=1, lossy=True)
    assert len(r.tokens) == 6 and not r.lossless


def test_optimal_without_replacement_drafts_distinct_branches(pair):
    """``optimal`` with ``replacement=False``: successive sampling of k distinct first tokens
    and the exact optimal plan for that tuple law."""
    assert rules_adapter.distinct_first(False, 2)
    assert not rules_adapter.distinct_first(True, 2) and not rules_adapter.distinct_first(False, 1)
    target, draft = pair
    seen = []
    E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=16, rule="optimal",
               gamma=2, k=2, replacement=False, cfg=SamplingConfig(1.0, top_k=8), seed=2,
               on_step=lambda rec, drafts, q, p: seen.append(drafts[:, 0].tolist()))
    assert seen and all(len(set(first)) == len(first) for first in seen)
    # a point-mass q drafts one branch instead of failing, as rrs does
    r = E.generate(target, E.ModelDrafter(draft), PROMPT, max_new_tokens=8, rule="optimal",
                   gamma=2, k=2, replacement=False, cfg=SamplingConfig(1.0, top_k=1), seed=1,
                   predict=True)
    assert len(r.tokens) == 8 and all(s.predicted >= 1.0 for s in r.steps)


@pytest.mark.parametrize("name", [n for n in rules_adapter.MULTI_DRAFT_RULES + rules_adapter.
                                  SINGLE_DRAFT_RULES if rules_adapter.shares_noise(n)])
def test_engine_drafts_shared_noise_rules_by_their_own_noise(name):
    """The engine's chain drafter, handed a shared-noise rule (``rule.shared_noise``), drafts
    every branch by that rule's keyed noise: the twin's ``draft_branches`` bit for bit at every
    offset, and two draft models agree per branch as often as the Gumbel coupling's collision
    probability says (5 sigma), where keyed inverse-CDF drafts (the control) agree 0.2 of the
    time on these laws."""
    from coupling.llm.drafters import sample_chain
    from coupling.rules import RULES

    rule = RULES[name]
    k, g, n = (1 if rule.max_drafts == 1 else 3), 2, 1500
    laws = [torch.tensor(w, dtype=torch.float64) for w in ([.4, .3, .2, .1], [.1, .2, .3, .4])]
    gen = torch.Generator().manual_seed(0)
    drafts = {}
    for m, q in enumerate(laws):
        out = []
        for seed in range(n):
            x, _ = sample_chain(q[None], lambda x, q=q: q.expand(len(x), -1),  # noqa: B023
                                lambda k: None, g, k, gen, noise=(name, seed, 11))
            out.append(x)
        drafts[m] = torch.stack(out)                                          # [n, k, g]
    seeds = torch.arange(n)
    for i in range(g):
        want = rule.torch.draft_branches(laws[0].expand(n, k, 4), seeds, torch.full((n,), 11 + i))
        assert torch.equal(drafts[0][:, :, i], want)
    collision = RULES["gumbel"].acceptance(laws[0].numpy(), laws[1].numpy())
    agree = float((drafts[0] == drafts[1]).double().mean())
    assert abs(agree - collision) < 5 * (collision * (1 - collision) / (n * k)) ** 0.5
    assert abs(0.2 - collision) > 0.1
