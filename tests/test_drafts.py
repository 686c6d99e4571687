"""The drafts on tiny random Llama models: int8 layers, heads, weight files, logit-scale
calibration, and the training prompts kept apart from the demo's."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling.llm import drafts, heads, int8
from coupling.llm import engine as E
from coupling.llm import feature_draft as FD
from coupling.llm.sampling import SamplingConfig, probs
from tests.llm_helpers import fresh_next_logits, tiny_llama


def test_int8_linear_rounds_per_row_and_never_touches_shared_modules():
    """Int8Linear: each weight within half a step of its row's scale; the product equals a
    linear layer with the dequantised weight (kernel or fallback); quantising a draft leaves
    the target's (shared) embeddings, norm and head untouched."""
    torch.manual_seed(0)
    for out_f, in_f in ((24, 16), (7, 5), (10, 24)):   # kernel-friendly and fallback shapes
        lin = torch.nn.Linear(in_f, out_f)
        q = int8.Int8Linear.from_linear(lin)
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
    spec = drafts.DraftSpec(1, (1,))
    draft = drafts.quantize_draft_int8(drafts.build_draft(target, spec))
    fd = FD.FeatureDraft(target).quantize_int8()
    assert isinstance(target.lm_head, torch.nn.Linear) and type(fd.head) is int8.Int8Linear
    assert draft.lm_head is not target.lm_head and fd.head is not target.lm_head
    assert draft.model.embed_tokens is target.model.embed_tokens
    with torch.no_grad():
        torch.testing.assert_close(target(ids).logits, before, atol=0, rtol=0)
        assert torch.isfinite(draft(ids).logits).all()
    with pytest.raises(TypeError, match="not Linear"):
        int8.quantize_linears_int8(fd, ("fc",))       # already quantised


def test_int8_target_quantizes_every_projection_and_leaves_earlier_drafts_alone():
    """quantize_target_int8: all seven projections of every layer and the head become
    Int8Linear (logits within 2% in norm), the embeddings stay; a draft built before keeps
    the original head module and its logits; a second call is a clear error; the engine's
    cached, rolled-back logits equal a fresh pass of the quantized target."""
    target = tiny_llama(7, layers=2)
    draft = drafts.build_draft(target, drafts.DraftSpec(1, (1,)))
    head, emb = target.lm_head, target.model.embed_tokens.weight
    ids = torch.tensor([[1, 4, 2, 7, 3]])
    with torch.no_grad():
        before, d_before = target(ids).logits.clone(), draft(ids).logits.clone()
    assert int8.quantize_target_int8(target) is target
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    for layer in target.model.layers:
        mods = [getattr(layer.self_attn, n, None) or getattr(layer.mlp, n) for n in names]
        assert all(type(m) is int8.Int8Linear and m.dense is None for m in mods)
    assert type(target.lm_head) is int8.Int8Linear
    assert target.model.embed_tokens.weight is emb and draft.lm_head is head
    with torch.no_grad():
        after = target(ids).logits
        torch.testing.assert_close(draft(ids).logits, d_before, atol=0, rtol=0)
    rel = float((after - before).norm() / before.norm())
    assert 0 < rel < 2e-2, rel
    with pytest.raises(ValueError, match="already weight-only int8"):
        int8.quantize_target_int8(target)
    with pytest.raises(ValueError, match="build drafts from the target before"):
        drafts.build_draft(target, drafts.DraftSpec(1, (1,)))
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
    target = tiny_llama(8, layers=2)
    fd = FD.FeatureDraft(target).eval()
    fd.head = heads.SubsetHead(target.lm_head.weight, torch.tensor([7, 2, 9, 0, 4, 5]))
    f = torch.randn(3, 16)
    for _ in range(2):
        with torch.no_grad():
            want = probs(fd.logits(f), cfg)
            got = fd.law(fd.head_logits(f), cfg)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)   # softmax summation order
        assert bool((got[:, [1, 3, 6, 8]] == 0).all())
        fd.head = heads.quantized_head_int8(fd.head)   # second round: the int8 head


def test_draft_weight_files_round_trip(tmp_path, monkeypatch):
    """save_draft / save_feature_draft then load_*: the same tensors (at bf16), the same subset
    head, the spec and meta in the sidecar; a bad head_tokens request is a clear error."""
    import json

    # the environment names the default file only: an explicit path always wins
    monkeypatch.setenv("COUPLING_DRAFT", str(tmp_path / "missing.safetensors"))
    monkeypatch.setenv("COUPLING_FEATURE_DRAFT", str(tmp_path / "missing.safetensors"))
    target = tiny_llama(5, layers=3)
    ranking = torch.tensor([7, 3, 9, 0, 5])
    spec = drafts.DraftSpec(1, (2,))
    draft = drafts.build_draft(target, spec)
    with torch.no_grad():
        for prm in draft.model.layers[0].parameters():
            prm.add_(0.01 * torch.randn_like(prm))
    path = drafts.save_draft(draft, spec, tmp_path / "d.safetensors", {"steps": 3}, ranking)
    assert json.loads(path.with_suffix(".json").read_text()) == {
        "spec": {"n_layers": 1, "init_layers": [2], "shared_layers": 0}, "steps": 3}
    back = drafts.load_draft(target, path, head_tokens=3)
    for (k, a), b in zip(drafts.own_state_dict(draft, spec).items(),
                         drafts.own_state_dict(back, spec).values(), strict=True):
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
        drafts.load_draft(target)
    with pytest.raises(ValueError, match="tokens"):
        heads.SubsetHead(target.lm_head.weight, torch.tensor([1, 10]))   # V = 10
    drafts.save_draft(draft, spec, tmp_path / "n.safetensors")  # no ranking stored
    with pytest.raises(ValueError, match="no head_tokens ranking"):
        drafts.load_draft(target, tmp_path / "n.safetensors", head_tokens=2)


def test_draft_training_prompts_are_disjoint_from_the_demo_prompts():
    """The drafts are measured on the demo prompts: no training prompt may be one of them; the
    first diverse chat set shares a 4-word opening with exactly one of them (documented in
    scripts/train_draft.py), the other sets with none, and no set shares a prompt, a template
    or an opening with another."""
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
    # the second set: no prompt, template or opening in common
    second = td.diverse_prompts(640, 4, td.CHAT_KINDS_2)
    assert len(set(second)) >= 140 and not set(second) & (set(demo) | set(diverse))
    assert not {p for p in second if " ".join(p.split()[:4]) in prefix}
    assert not {t for t, _ in td.CHAT_KINDS_2} & {t for t, _ in td.CHAT_KINDS}
    # the third set: nothing in common with the demo or the first two sets either
    third = td.diverse_prompts(640, 5, td.CHAT_KINDS_3)
    assert len(set(third)) >= 140 and not set(third) & (set(demo) | set(diverse) | set(second))
    assert not {p for p in third if " ".join(p.split()[:4]) in prefix}
    assert not {t for t, _ in td.CHAT_KINDS_3} & ({t for t, _ in td.CHAT_KINDS}
                                                  | {t for t, _ in td.CHAT_KINDS_2})
    earlier = {" ".join(p.split()[:4]) for p in set(diverse) | set(second)}
    assert not {" ".join(p.split()[:4]) for p in third} & earlier
    # the fourth set: the same
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
    target = tiny_llama(6, layers=2)
    spec = drafts.DraftSpec(1, (1,))
    ranking = torch.tensor([7, 3, 9, 0, 5, 1, 2, 4])
    draft = drafts.build_draft(target, spec)
    path = drafts.save_draft(draft, spec, tmp_path / "d.safetensors", {"steps": 1}, ranking)
    plain = drafts.load_draft(target, path)
    assert plain.coupling_logit_scale == 1.0 and plain.lm_head is target.lm_head
    drafts.store_logit_scale(path, 1.45, {"logit_scale": 1.45, "note": "test"})
    assert json.loads(path.with_suffix(".json").read_text())["note"] == "test"
    ids = torch.tensor([[1, 4, 2, 8]])
    with torch.no_grad():
        ref = plain(ids).logits
        for head_tokens in (0, 5):
            scaled = drafts.load_draft(target, path, head_tokens=head_tokens)
            assert scaled.coupling_logit_scale == 1.45
            base = drafts.load_draft(target, path, head_tokens=head_tokens, logit_scale=1.0)
            want = base(ids).logits * 1.45
            torch.testing.assert_close(scaled(ids).logits, want)
            if head_tokens == 0:
                torch.testing.assert_close(want, ref * 1.45)
                assert scaled.lm_head.weight is target.lm_head.weight
                assert drafts.param_count(scaled, exclude_shared=True) == \
                    drafts.param_count(base, exclude_shared=True)
            q8 = drafts.quantize_draft_int8(drafts.load_draft(target, path, head_tokens=5))
            assert isinstance(q8.lm_head, heads.ScaledHead)
            assert torch.isfinite(q8(ids).logits[0, -1]).sum() == 5
        over = drafts.load_draft(target, path, logit_scale=2.0)
        torch.testing.assert_close(over(ids).logits, ref * 2.0)
    with pytest.raises(ValueError, match="ScaledHead"):
        drafts.save_draft(drafts.load_draft(target, path), spec, tmp_path / "x.safetensors")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="logit_scale"):
            drafts.load_draft(target, path, logit_scale=bad)
        with pytest.raises(ValueError, match="logit_scale"):
            C.check_logit_scale(bad)

    fd = FD.FeatureDraft(target)
    fpath = FD.save_feature_draft(fd, tmp_path / "f.safetensors", {}, ranking)
    drafts.store_logit_scale(fpath, 1.4)
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


def test_target_quant_lists_are_parsed_and_bad_entries_named():
    assert int8.target_quants("none") == ["none"]
    assert int8.target_quants("none,int8") == ["none", "int8"]
    for bad in ("int4", "int8,", "w8a16", "int8,fp8"):
        with pytest.raises(ValueError, match=f"--target-quant {bad}: choose among none, int8"):
            int8.target_quants(bad)
