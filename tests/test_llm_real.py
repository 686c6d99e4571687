"""Real-model tests (SmolLM2-135M target + the shipped drafts). All slow-marked.

* the feature-level draft's incremental state (target features, cropped draft cache, k
  branches) gives the same law as a from-scratch recomputation (float32);

* cache rollback: after speculative steps with rejections, the target's incremental logits
  equal a fresh full recomputation (bf16 tolerance);
* losslessness: for a fixed prompt and top-k = 2 (support of the first two tokens: 4 pairs,
  enumerated exactly from the target), each rule's law of the first two generated tokens
  matches plain sampling by chi-square (false-positive rate 1e-3 per rule, fixed seeds),
  and a negative control (always accept the draft of the untrained layer-0 draft) must fail;
* drafter invariance: under one seed ``gumbel`` emits the same stream with the trained draft,
  the feature-level draft, the n-gram drafter and no drafter, equal to plain Gumbel sampling
  from the target alone.
  This one runs in float32: bf16 logits of a batched verification call differ from those of
  a single-token call in the last bits, which can flip a near-tied Gumbel argmax.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from coupling.llm import drafts, heads, int8, models, rules_adapter
from coupling.llm import engine as E
from coupling.llm import feature_draft as FD
from coupling.llm.sampling import SamplingConfig, probs
from tests.llm_helpers import fresh_feature_law, record_first_laws

pytestmark = pytest.mark.slow

PROMPT_TEXT = "Name a colour."


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # single-token steps: one thread avoids OpenMP stalls when the 2 cores are shared
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def real():
    target = models.load_target("bfloat16")
    draft = drafts.load_draft(target)
    tok = models.load_tokenizer()
    prompt = models.chat_prompt(tok, PROMPT_TEXT)
    return target, draft, tok, prompt


def fresh_probs(model, seq, cfg):
    with torch.no_grad():
        return probs(model(torch.tensor([seq])).logits[:, -1], cfg)[0].double()


def test_draft_file_is_small_and_shares_the_target_tensors(real):
    target, draft, _, _ = real
    assert drafts.DRAFT_WEIGHTS.stat().st_size <= 10 * 2**20
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert draft.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert draft.model.norm.weight.data_ptr() == target.model.norm.weight.data_ptr()
    assert draft.config.num_hidden_layers == 1
    assert drafts.param_count(draft, exclude_shared=True) < 4e6


@pytest.fixture(scope="module")
def real32():
    target = models.load_target("float32")
    return target, drafts.load_draft(target)


@pytest.fixture(scope="module")
def draft_int8(real):
    """The token-level draft as the demo runs it (for the engine and HF assisted alike)."""
    return drafts.quantize_draft_int8(
        drafts.load_draft(real[0], head_tokens=drafts.DRAFT_HEAD_TOKENS))


@pytest.fixture(scope="module")
def feature(real):
    """The feature draft as the demo runs it: the demo's head subset, weight-only int8."""
    return FD.load_feature_draft(real[0], head_tokens=drafts.DRAFT_HEAD_TOKENS, int8=True)


def test_feature_draft_file_is_small_and_shares_the_target_tensors(real, feature):
    target = real[0]
    assert FD.FEATURE_DRAFT_WEIGHTS.stat().st_size <= 10 * 2**20
    shared = target.model.embed_tokens.weight.data_ptr()
    assert feature.body.embed_tokens.weight.data_ptr() == shared
    assert feature.body.norm.weight.data_ptr() == target.model.norm.weight.data_ptr()
    assert isinstance(feature.head, heads.SubsetHead)
    assert feature.head.weight.shape[0] == drafts.DRAFT_HEAD_TOKENS
    assert sum(v.numel() for v in feature.own_state_dict().values()) < 5e6
    with pytest.raises(RuntimeError, match="bind"):
        FD.FeatureDrafter(feature).propose([1, 2, 3], 2, 1, SamplingConfig(), torch.Generator())


@pytest.mark.parametrize("rule,k,int8", [("token", 1, False), ("rrs", 2, False),
                                          ("token", 1, True)])
def test_feature_drafter_laws_match_fresh_recomputation_float32(real, real32, rule, k, int8):
    """The drafter's incremental state (target features kept by the target's cache, draft
    cache cropped to pairs with true features, k branches, the lean layer) gives the same
    first-position law as recomputing target features and draft pairs from scratch on the
    committed text through the Hugging Face body."""
    _, _, _, prompt = real
    target = real32[0]
    draft = FD.load_feature_draft(target, head_tokens=8192, int8=int8)
    drafter = FD.FeatureDrafter(draft)
    cfg = SamplingConfig(1.0)
    seen = record_first_laws(drafter)
    res = E.generate(target, drafter, prompt, max_new_tokens=30, rule=rule, gamma=3, k=k,
                     cfg=cfg, seed=0)
    assert any(s.accepted < s.drafted for s in res.steps), "no rejection: rollback untested"
    assert any(s.accepted > 0 for s in res.steps), "nothing accepted: the draft is not loaded"
    for seq, q in seen:
        fresh = fresh_feature_law(target, draft, seq, cfg)
        assert 0.5 * (fresh - q).abs().sum().item() < 1e-4


@pytest.mark.parametrize("rule,k,tree", [("token", 1, None), ("kseq", 4, True),
                                         ("kseq", 4, False)])
def test_rollback_matches_fresh_recomputation_float32(real, real32, rule, k, tree):
    """In float32 the cached, rolled-back, branch-selected logits equal a fresh full pass,
    with k branches verified as one row with tree attention and as a batch of k rows."""
    _, _, _, prompt = real
    target, draft = real32
    cfg = SamplingConfig(1.0)
    tlm = E.CachedLM(target)
    res = E.generate(target, E.ModelDrafter(draft), prompt, max_new_tokens=30, rule=rule,
                     gamma=3, k=k, cfg=cfg, seed=0, target=tlm, tree_attention=tree)
    assert any(s.accepted < s.drafted for s in res.steps), "no rejection: rollback untested"
    if k > 1:
        assert any(s.branch > 0 and s.accepted > 0 for s in res.steps), "no later branch kept"
    seq = prompt + res.tokens
    feed = tlm.sync(seq)
    assert tlm.tokens[0] == seq[: len(tlm.tokens[0])]
    inc = tlm.forward(torch.tensor([feed]))[0, -1].float()
    with torch.no_grad():
        fresh = target(torch.tensor([seq])).logits[0, -1].float()
    torch.testing.assert_close(inc, fresh, atol=2e-3, rtol=1e-3)


def test_tree_row_equals_batch_rows_up_to_rounding(real, real32):
    """The tree row (k branches as one row under a tree mask) gives each branch the laws its
    own batch row gives: in float32 to rounding (TV < 1e-4); in bf16 within twice what bf16
    itself moves the batch rows from float32 (+ 0.01); not a multiple of the change of one
    3-token call into three 1-token calls, which is exactly 0 on some CPUs. Negative control:
    the same row with a plain causal mask, where the second branch sees the first, is far
    off."""
    gen = torch.Generator().manual_seed(0)

    def tv(a, b):
        return 0.5 * (a.float().softmax(-1) - b.float().softmax(-1)).abs().sum(-1).max().item()

    def calls(model, ctx, drafts):
        lm = E.CachedLM(model)
        E.prefill(lm, ctx)
        flat, rows = lm.forward_tree(ctx[-1:], drafts)
        lm = E.CachedLM(model)
        E.prefill(lm, ctx)
        lm.expand(2)
        batch = lm.forward(torch.cat([torch.tensor([ctx[-1:]] * 2), drafts], 1))
        lm = E.CachedLM(model)
        E.prefill(lm, ctx)
        plain = lm.forward(torch.tensor([ctx[-1:] + drafts.reshape(-1).tolist()]))[0]
        return flat[rows], batch, plain[rows[1]]

    prompt = real[3]
    exact, tree_batch, bf16_scale, causal = [], [], [], []
    for _ in range(3):
        ctx = prompt + torch.randint(0, 49152, (3,), generator=gen).tolist()
        drafts = torch.randint(0, 49152, (2, 2), generator=gen)
        tree, batch, plain = calls(real[0], ctx, drafts)
        tree32, batch32, _ = calls(real32[0], ctx, drafts)
        exact.append(tv(tree32, batch32))
        tree_batch.append(tv(tree, batch))
        bf16_scale.append(tv(batch, batch32))
        causal.append(tv(plain, batch[1]))
    assert max(exact) < 1e-4, exact
    assert max(tree_batch) < 2 * max(bf16_scale) + 0.01, (tree_batch, bf16_scale)
    assert min(causal) > 3 * max(tree_batch), (causal, tree_batch)


def test_target_runs_grouped_sdpa_with_the_logits_of_plain_sdpa(real):
    """load_target switches SmolLM2 to models.GROUPED_SDPA; in bf16 its verification call, tree
    row and rollback give the very logits of transformers' sdpa (bit for bit)."""
    target, _, _, prompt = real
    assert target.config._attn_implementation == models.GROUPED_SDPA
    plain = models.load_target("bfloat16")
    plain.set_attn_implementation("sdpa")
    outs = []
    for model in (plain, target):
        lm = E.CachedLM(model)
        E.prefill(lm, prompt)
        got = [lm.forward(torch.tensor([prompt[-1:] + [504, 3158]]))]
        lm.sync(prompt + [504])
        flat, rows = lm.forward_tree([504], torch.tensor([[28, 29], [1030, 30]]))
        got.append(flat[rows])
        lm.select_branch(0)
        got.append(lm.forward(torch.tensor([lm.sync(prompt + [504, 28, 29, 30])])))
        outs.append(got)
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)


def test_int8_target_stays_within_a_few_percent_of_the_float32_target(real, real32):
    """The weight-only int8 target (demo --target-quant int8) on 60 positions of real text,
    every product on torch's int8 kernel: its next-token laws (the demo's sampling settings)
    are within TV 0.08 of the float32 target's on average (about 0.04 measured; bf16's own
    distance is about 0.015), so a broken kernel (garbage or NaN logits) or a quantized
    embedding would fail; and a 1-token call and the same position inside a 3-token call agree
    to bf16 rounding."""
    target, _, tok, prompt = real
    q8 = int8.quantize_target_int8(models.load_target("bfloat16"))
    assert {m.kernel for m in q8.modules() if isinstance(m, int8.Int8Linear)} == {"torch"}
    cfg = SamplingConfig(0.7, 50, 0.95)
    res = E.autoregressive(real32[0], prompt, max_new_tokens=60, cfg=cfg, seed=5)
    seq = torch.tensor([prompt + res.tokens])
    n = len(prompt) - 1

    def laws(model):
        with torch.no_grad():
            return probs(model(seq).logits[0, n:].float(), cfg).double()

    ref = laws(real32[0])
    tv = {name: (0.5 * (laws(m) - ref).abs().sum(-1)).mean().item()
          for name, m in (("int8", q8), ("bf16", target))}
    assert tv["int8"] < 0.08 and tv["bf16"] < 0.05, tv
    lm = E.CachedLM(q8)
    E.prefill(lm, prompt)
    three = lm.forward(torch.tensor([prompt[-1:] + res.tokens[:2]]))[0, 0].float()
    lm.sync(prompt)
    one = lm.forward(torch.tensor([prompt[-1:]]))[0, 0].float()
    assert 0.5 * (three.softmax(-1) - one.softmax(-1)).abs().sum().item() < 0.02


def test_rollback_bf16_within_bf16_noise(real):
    """bf16: rolled-back cache vs fresh pass differ only by bf16 rounding (same order as an
    append-only cache vs a fresh pass)."""
    target, draft, _, prompt = real
    cfg = SamplingConfig(1.0)
    tlm = E.CachedLM(target)
    res = E.generate(target, E.ModelDrafter(draft), prompt, max_new_tokens=30, rule="token",
                     gamma=3, cfg=cfg, seed=0, target=tlm)
    seq = prompt + res.tokens
    inc = probs(tlm.forward(torch.tensor([tlm.sync(seq)]))[:, -1], cfg)[0].double()
    fresh = fresh_probs(target, seq, cfg)
    ar = E.CachedLM(target)          # append-only reference: one token at a time, no rollback
    E.prefill(ar, seq)
    app = probs(ar.forward(torch.tensor([seq[-1:]]))[:, -1], cfg)[0].double()
    tv_roll = 0.5 * (inc - fresh).abs().sum().item()
    tv_app = 0.5 * (app - fresh).abs().sum().item()
    assert tv_roll < max(3 * tv_app, 1e-3) + 0.02, (tv_roll, tv_app)


CFG2 = SamplingConfig(1.0, top_k=2)


def exact_law(target, prompt):
    p1 = fresh_probs(target, prompt, CFG2)
    support = torch.nonzero(p1).flatten().tolist()
    cells = {}
    for x1 in support:
        p2 = fresh_probs(target, prompt + [x1], CFG2)
        for x2 in torch.nonzero(p2).flatten().tolist():
            cells[(x1, x2)] = float(p1[x1] * p2[x2])
    return cells


def counts_for(target, drafter, prompt, rule, k, n, seed0=50_000):
    tlm = E.CachedLM(target)
    out: dict[tuple[int, int], int] = {}
    for s in range(n):
        r = E.generate(target, drafter, prompt, max_new_tokens=2, rule=rule, gamma=2, k=k,
                       cfg=CFG2, seed=seed0 + s, target=tlm)
        key = (r.tokens[0], r.tokens[1])
        out[key] = out.get(key, 0) + 1
    return out


def pvalue(counts, law):
    if any(key not in law for key in counts):
        return 0.0  # a pair of target probability 0 was emitted
    keys = sorted(law)
    obs = np.array([counts.get(key, 0) for key in keys], dtype=float)
    exp = np.array([law[key] for key in keys])
    return float(stats.chisquare(obs, exp / exp.sum() * obs.sum()).pvalue)


@pytest.fixture(scope="module")
def law(real):
    target, _, _, prompt = real
    cells = exact_law(target, prompt)
    assert len(cells) == 4 and abs(sum(cells.values()) - 1) < 1e-6  # float32 laws
    return cells


# every rule family (one chain, a block, k i.i.d. branches twice, shared noise) and every
# drafter at least once; the rule's code does not depend on the drafter, and the engine tests
# cross every rule with every draft layout on small models
@pytest.mark.parametrize("rule,k,drafter", [
    ("token", 1, "trained"), ("kseq", 2, "trained"), ("gumbel", 1, "trained"),
    ("block", 1, "feature"), ("rrs", 2, "feature"), ("token", 1, "trained int8")])
def test_first_two_tokens_follow_plain_sampling(real, law, feature, draft_int8, rule, k,
                                                drafter):
    target, draft, _, prompt = real
    d = FD.FeatureDrafter(feature) if drafter == "feature" else \
        E.ModelDrafter(draft_int8 if drafter == "trained int8" else draft)
    counts = counts_for(target, d, prompt, rule, k, n=120)
    assert pvalue(counts, law) > 1e-3


def test_negative_control_always_accept_fails(real, law, monkeypatch):
    target, _, _, prompt = real
    bad_draft = drafts.build_draft(target, drafts.DraftSpec(1, (0,)))  # untrained early exit

    def always_accept(rule, drafts, q, p, seed, position, *, replacement=True):
        g = drafts.shape[1]
        return g, 0, drafts[0].tolist() + [int(torch.multinomial(p[0, g], 1))]

    monkeypatch.setattr(rules_adapter, "decide", always_accept)
    counts = counts_for(target, E.ModelDrafter(bad_draft), prompt, "token", 1, n=200)
    assert pvalue(counts, law) < 1e-3


def test_gumbel_is_drafter_invariant_on_the_real_model():
    target = models.load_target("float32")
    draft = drafts.load_draft(target)
    tok = models.load_tokenizer()
    prompt = models.chat_prompt(tok, "Describe a sunrise.")
    cfg = SamplingConfig(0.8)
    V = target.config.vocab_size
    ar = E.autoregressive(target, prompt, max_new_tokens=32, cfg=cfg, seed=11, gumbel=True)
    plain = E.autoregressive(target, prompt, max_new_tokens=32, cfg=cfg, seed=11)
    assert ar.tokens != plain.tokens  # the Gumbel stream is a different sampler's output
    fdraft = FD.FeatureDrafter(FD.load_feature_draft(target, head_tokens=8192))
    for d in (E.ModelDrafter(draft), fdraft, E.NgramDrafter(V), E.NoDrafter(V)):
        r = E.generate(target, d, prompt, max_new_tokens=32, rule="gumbel", gamma=4, cfg=cfg,
                       seed=11)
        assert r.tokens == ar.tokens, d.name


def test_hf_assisted_baseline_runs_with_the_same_draft(real, draft_int8):
    target, draft, tok, prompt = real
    for d in (draft, draft_int8):   # the demo hands HF the int8 draft the engine runs
        r = E.hf_assisted(target, d, prompt, max_new_tokens=12, cfg=SamplingConfig(0.7),
                          gamma=4, seed=0, eos_token_id=tok.eos_token_id)
        assert 1 <= len(r.tokens) <= 12 and r.target_calls >= 1
    # Hugging Face's own draft-length gate (the demo's --draft-confidence): a threshold of 1
    # stops drafting after every token of probability < 1, so a call drafts at most one token
    r = E.hf_assisted(target, draft_int8, prompt, max_new_tokens=12, cfg=SamplingConfig(0.7),
                      gamma=4, seed=0, eos_token_id=tok.eos_token_id, confidence=1.0)
    assert draft_int8.generation_config.assistant_confidence_threshold == 1.0
    assert 2 * r.target_calls >= len(r.tokens) >= 1


def test_demo_runs_end_to_end_and_writes_the_promised_json(tmp_path):
    """`coupling demo` on one prompt and a few tokens: the JSON has the promised keys,
    both drafts run with the calibrated logit scales stored with their weights (override:
    --draft-logit-scale), and the plot is written."""
    import json

    from safetensors import safe_open

    from coupling.llm import demo

    out, png = tmp_path / "d.json", tmp_path / "d.png"
    rc = demo.main(["--prompts", "1", "--max-new-tokens", "6", "--methods",
                    "hf_assisted,token,block_feature", "--threads", "1", "--no-progress",
                    "--json", str(out), "--plot", str(png)])
    assert rc == 0 and png.stat().st_size > 0
    res = json.loads(out.read_text())
    assert set(res["baselines"]) == {"autoregressive", "hf_assisted"}
    for name in ("token", "block_feature"):
        row = res["rules"][name]
        assert row["optimal_predicted_block_efficiency"] is None     # k = 1: no "BE opt"
        for key in ("block_efficiency", "predicted_block_efficiency", "acceptance_rate",
                    "tokens_per_s", "speedup_vs_autoregressive"):
            assert math.isfinite(row[key]), (name, key)
    for b in res["baselines"].values():
        assert b["tokens_per_s"] > 0
    assert res["baselines"]["autoregressive"]["speedup_ci95"] == pytest.approx([1.0, 1.0])
    for row in (*res["baselines"].values(), *res["rules"].values()):
        lo, hi = row["speedup_ci95"]             # one prompt: the interval is the point
        assert lo == pytest.approx(row["speedup_vs_autoregressive"]) == pytest.approx(hi)
        assert len(row["per_prompt_tokens_per_s"]) == 1
    stored = {}
    for key, path in (("draft_logit_scale", drafts.DRAFT_WEIGHTS),
                      ("feature_draft_logit_scale", FD.FEATURE_DRAFT_WEIGHTS)):
        with safe_open(str(path), framework="pt") as f:
            stored[key] = float(f.get_tensor("logit_scale")[0])
        assert stored[key] > 1.0
        assert res["models"][key] == stored[key]
    assert demo.main(["--prompts", "1", "--max-new-tokens", "2", "--methods", "token",
                      "--draft-logit-scale", "1", "--no-progress", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["models"]["draft_logit_scale"] == 1.0
    assert res["settings"]["multi_draft_layout"] == "tree"
    stored_params = res["models"]["target_params"]
    assert demo.main(["--prompts", "1", "--max-new-tokens", "3", "--methods", "rrs_k2",
                      "--multi-draft-layout", "batch", "--target-quant", "none", "--no-progress",
                      "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["settings"]["multi_draft_layout"] == "batch"
    row = res["rules"]["rrs_k2"]
    assert math.isfinite(row["block_efficiency"])
    # the multi-draft rows carry the LP optimum's prediction on the same laws ("BE opt")
    assert row["optimal_predicted_block_efficiency"] >= row["predicted_block_efficiency"] - 1e-12
    assert res["models"]["target_quant"] == "none"
    assert demo.main(["--prompts", "1", "--max-new-tokens", "3", "--methods", "token",
                      "--target-quant", "int8", "--no-progress", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["models"]["target_quant"] == "int8"
    assert res["models"]["target_params"] == stored_params
    assert res["settings"]["gamma"] == 2 and res["settings"]["draft_confidence"] == 0.8
    assert res["settings"]["auto"] == [
        "--gamma 2 --draft-confidence 0.8: on the int8 target a second drafted token pays only "
        "where the draft's first law peaks at 0.8 or more (benchmarks/bench_gamma.py)"]
    assert demo.main(["--prompts", "1", "--methods", "token", "--draft-logit-scale", "0",
                      "--no-progress"]) == 2
