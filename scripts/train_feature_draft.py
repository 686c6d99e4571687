#!/usr/bin/env python
"""Train the feature-level (EAGLE-style) SmolLM2 draft (coupling/data/feature_draft_smollm2.*).

Method
------
1. Corpus: the target answers templated chat prompts (``train_draft.corpus_prompts``, disjoint
   from the demo's), sampled with the demo's settings (temperature 0.7, top-k 50, top-p 0.95)
   so the text looks like what the draft will see; at every generated position the target's raw
   top-``K`` log-probabilities are stored. Then one batched target pass adds the final-normed
   hidden state ``f_j`` at every position (the feature whose LM-head image is the law of
   ``x_{j+1}``).
2. Model: :class:`coupling.llm.feature_draft.FeatureDraft` (``fc`` 2d -> d and one decoder layer,
   initialised from the target's last layer; embeddings, norm and head are the target's,
   frozen). Pair ``i`` = ``(x_i, f_{i-1})`` predicts ``f^_i``.
3. Loss, per sequence, on two passes:
   - pass 1 reads the target's features ``f_{i-1}`` (what the first drafted token sees);
   - pass 2 reads pass 1's own predictions ``f^_{i-1}`` (detached), which is what every
     later drafted token sees, so drafting two or more tokens is trained too;
   each pass adds the exact KL of the target's law and the draft's law coarsened to
   {target top-K tokens inside the head subset} + {rest} (the draft's head is restricted to the
   ``--head-tokens`` tokens with most target mass, as at run time), plus ``--reg`` times a
   smooth-L1 regression of ``f^_i`` on ``f_i``.
   ``--tvd-weight w`` adds ``w * (1 - overlap)`` per pass, with the overlap exact under the demo's
   sampling settings at logit scale ``--tvd-scale`` (:func:`cfg_overlap`; the shipped draft is
   trained without it and calibrated afterwards).
4. Report: held-out mean sum_x min(p, q) at temperature 1 for drafted positions 1 and 2 (p known
   on its top K, so lower bounds), and exactly under the demo's settings at ``--tvd-scale``,
   before and after. The output is uncalibrated: fit its logit scale afterwards with
   ``scripts/calibrate_draft.py --draft feature --write``.

``--target-quant int8`` writes the corpus with the int8 target (``int8.quantize_target``): its
text, its laws and its features, which are what the draft reads at run time with
``coupling demo --target-quant int8``.

Usage: ``python scripts/train_feature_draft.py [--minutes-train 12] [--n-prompts 960]
[--prompt-set diverse] [--target-quant int8] [--extra-corpus PATH] [--resume WEIGHTS]
[--split prompt]``
"""

from __future__ import annotations

import argparse
import collections
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_draft  # noqa: E402  (corpus prompts and generation, head ranking)

from coupling.llm import calibrate, int8, models  # noqa: E402
from coupling.llm import feature_draft as FD  # noqa: E402
from coupling.llm.sampling import SamplingConfig, probs  # noqa: E402


@torch.no_grad()
def add_features(target, data, batch_tokens: int = 4096) -> None:
    """Store the target's final-normed hidden state at every position of every sequence
    (``s["feat"]`` [len(ids), d], bf16), batching sequences of similar length."""
    order = sorted(range(len(data)), key=lambda i: len(data[i]["ids"]))
    i = 0
    while i < len(order):
        n = max(1, batch_tokens // len(data[order[i]]["ids"]))
        group = order[i:i + n]
        width = max(len(data[j]["ids"]) for j in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        for r, j in enumerate(group):
            ids[r, :len(data[j]["ids"])] = data[j]["ids"]
        h = target.model(input_ids=ids).last_hidden_state  # right padding: causal, harmless
        for r, j in enumerate(group):
            data[j]["feat"] = h[r, :len(data[j]["ids"])].to(torch.bfloat16).clone()
        i += n


def pad_batch(seqs):
    """Right-padded tensors for a list of corpus sequences.

    Returns ids [B, n] (pair tokens x_1..x_{N-1}), feat_in [B, n, d] (f_0..f_{N-2}),
    feat_tgt [B, n, d] (f_1..f_{N-1}), valid [B, n], law_idx / law_logp [B, n, K] and
    law_mask [B, n] (pair i has a stored target law for x_{i+1} iff i >= n_prompt - 1).
    """
    B = len(seqs)
    n = max(len(s["ids"]) - 1 for s in seqs)
    d = seqs[0]["feat"].shape[-1]
    K = seqs[0]["idx"].shape[-1]
    ids = torch.zeros(B, n, dtype=torch.long)
    f_in = torch.zeros(B, n, d)
    f_tg = torch.zeros(B, n, d)
    valid = torch.zeros(B, n)
    idx = torch.zeros(B, n, K, dtype=torch.long)
    logp = torch.full((B, n, K), -1e4)
    lmask = torch.zeros(B, n)
    for r, s in enumerate(seqs):
        N, P = len(s["ids"]), s["n_prompt"]
        ids[r, :N - 1] = s["ids"][1:]
        f_in[r, :N - 1] = s["feat"][:-1].float()
        f_tg[r, :N - 1] = s["feat"][1:].float()
        valid[r, :N - 1] = 1
        G = s["idx"].shape[0]                      # laws of x_P .. x_{P+G-1}: pairs P-1 ..
        idx[r, P - 2:P - 2 + G] = s["idx"].long()
        logp[r, P - 2:P - 2 + G] = s["logp"].float()
        lmask[r, P - 2:P - 2 + G] = 1
    return ids, f_in, f_tg, valid, idx, logp, lmask


def subset_kl(sub_logits, pos, idx_in, logp, mask):
    """KL(p || q) on {target top-K tokens inside the head subset} + {rest}, mean over mask.

    sub_logits [B, n, S] over the subset; pos [B, n, K] index of each top-K token in the subset
    (clamped); idx_in [B, n, K] whether it is in the subset.
    """
    logq = torch.log_softmax(sub_logits.float(), -1)
    p = logp.exp() * idx_in
    lq = logq.gather(-1, pos) * idx_in
    p_rest = (1 - p.sum(-1)).clamp_min(0)
    q_rest = (1 - (lq.exp() * idx_in).sum(-1)).clamp_min(1e-9)
    ce = -(p * lq).sum(-1) - p_rest * q_rest.log()
    # subtract the target's own entropy term so the value is a KL (>= 0), for readable logs
    h = -(p * torch.where(idx_in > 0, logp, torch.zeros_like(logp))).sum(-1) \
        - p_rest * p_rest.clamp_min(1e-12).log()
    return ((ce - h) * mask).sum() / mask.sum().clamp_min(1)


def overlap(sub_logits, pos, idx_in, logp, mask):
    """Mean sum_{x in top-K} min(p, q) at temperature 1 (a lower bound of the overlap)."""
    q = torch.softmax(sub_logits.float(), -1).gather(-1, pos) * idx_in
    m = torch.minimum(logp.exp(), q).sum(-1)
    return float((m * mask).sum() / mask.sum().clamp_min(1))


def cfg_overlap(sub_logits, subset_pos_of_topk, p_cfg, mask, cfg, scale: float):
    """Mean exact overlap under the sampling settings, :func:`calibrate.topk_overlap` of
    q = probs(scale * logits, cfg) over the head's tokens and p_cfg, the target's law under cfg
    on its stored top K (``subset_pos_of_topk`` [B, n, K]: -1 outside the head), over the
    masked pairs. Differentiable in the logits (the kept set is piecewise constant), so 1 - it
    is a total-variation loss on the very quantity the rules accept (DistillSpec's TVD, at the
    decoding settings)."""
    m = calibrate.topk_overlap(p_cfg, probs(scale * sub_logits, cfg), subset_pos_of_topk)
    return (m * mask).sum() / mask.sum().clamp_min(1)


def two_pass(draft, W_sub, batch, subset_pos, tvd=None):
    """Both passes on one padded batch: returns (loss parts, overlaps) per pass.

    ``tvd = (cfg, scale)`` adds each pass's exact overlap under ``cfg`` (a tensor, for the loss)
    as a fourth entry."""
    ids, f_in, f_tg, valid, idx, logp, lmask = batch
    raw_pos = subset_pos[idx]
    idx_in = (raw_pos >= 0).float()
    pos = raw_pos.clamp_min(0)
    p_cfg = calibrate.target_law_on_topk(logp, tvd[0]) if tvd is not None else None
    out = []
    feats = f_in
    for _ in range(2):
        fh = draft.features(ids, feats)                                  # [B, n, d] float32
        sub = F.linear(fh, W_sub)
        kl = subset_kl(sub, pos, idx_in, logp, lmask)
        reg = (F.smooth_l1_loss(fh, f_tg, reduction="none").mean(-1) * valid).sum() / valid.sum()
        parts = (kl, reg, overlap(sub.detach(), pos, idx_in, logp, lmask))
        if tvd is not None:
            parts += (cfg_overlap(sub, raw_pos, p_cfg, lmask, *tvd),)
        out.append(parts)
        # pass 2 input: pair i reads f^_{i-1}; pair 1 keeps the target's f_0
        feats = torch.cat([f_in[:, :1], fh.detach()[:, :-1]], 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-prompts", type=int, default=960)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=32, help="corpus generation batch")
    ap.add_argument("--top-k", type=int, default=64, help="stored target log-probabilities")
    ap.add_argument("--minutes-train", type=float, default=12.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seq-per-step", type=int, default=8)
    ap.add_argument("--reg", type=float, default=1.0, help="weight of the feature regression")
    ap.add_argument("--head-tokens", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-set", choices=("templated", *train_draft.PROMPT_SETS),
                    default="templated",
                    help="corpus prompts: train_draft.corpus_prompts, or .diverse_prompts over "
                         "train_draft.PROMPT_SETS[set] (CHAT_KINDS for diverse, CHAT_KINDS_2 "
                         "for diverse2, ...)")
    ap.add_argument("--target-quant", choices=tuple(int8.TARGET_QUANTS), default="none",
                    help="the target that writes a new corpus (its text, laws and features): "
                         "bf16 as loaded, or quantized as the demo runs it (int8.quantize_"
                         "target). Training always uses the bf16 target's embeddings, norm and "
                         "head, which the draft shares at run time whatever the target's quant")
    ap.add_argument("--corpus", type=Path, default=None,
                    help="default ~/.cache/coupling/feature_corpus[_{prompt set}][_{quant}]"
                         "_s{seed}_n{n}.pt")
    ap.add_argument("--extra-corpus", type=Path, action="append", default=[],
                    help="train on this saved corpus too (repeatable)")
    ap.add_argument("--resume", type=Path, default=None, help="start from these weights")
    ap.add_argument("--split", choices=("prompt", "random"), default="prompt",
                    help="held-out sequences: whole prompts unseen in training, or any 24")
    ap.add_argument("--tvd-weight", type=float, default=0.0,
                    help="add this times (1 - overlap under the demo's sampling settings) per "
                         "pass to the loss (0: the KL and regression loss alone)")
    ap.add_argument("--tvd-scale", type=float, default=1.0,
                    help="logit scale the overlap term (and its report) applies, e.g. the "
                         "draft's calibrated one")
    ap.add_argument("--corpus-only", action="store_true")
    ap.add_argument("--out", type=Path, default=FD.FEATURE_DRAFT_WEIGHTS)
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = models.load_target("bfloat16")
    tok = models.load_tokenizer()
    if args.corpus is None:
        tag = "" if args.prompt_set == "templated" else f"_{args.prompt_set}"
        tag += "" if args.target_quant == "none" else f"_{args.target_quant}"
        args.corpus = models.cache_dir() / f"feature_corpus{tag}_s{args.seed}_n{args.n_prompts}.pt"
    if args.corpus.is_file():
        data = torch.load(args.corpus)
        print(f"loaded corpus {args.corpus}: {len(data)} sequences")
    else:
        t0 = time.perf_counter()
        # quantize_target swaps the target's projections and head in place, and the draft
        # below starts from its bf16 last layer and shares its bf16 head: quantize a copy
        writer = (target if args.target_quant == "none" else
                  int8.quantize_target(models.load_target("bfloat16"), args.target_quant))
        if args.prompt_set == "templated":
            prompts = train_draft.corpus_prompts(args.n_prompts, args.seed)
        else:
            prompts = train_draft.diverse_prompts(args.n_prompts, args.seed,
                                                  train_draft.PROMPT_SETS[args.prompt_set])
        data = train_draft.generate_corpus(
            writer, tok, prompts, args.new_tokens,
            args.batch, args.top_k, args.seed, temperature=0.7, sample_top_k=50,
            sample_top_p=0.95)
        t1 = time.perf_counter()
        add_features(writer, data)
        print(f"corpus: {len(data)} sequences in {t1 - t0:.0f} s, features in "
              f"{time.perf_counter() - t1:.0f} s")
        args.corpus.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, args.corpus)
    for extra in args.extra_corpus:
        more = torch.load(extra)
        print(f"loaded corpus {extra}: {len(more)} sequences")
        data = data + more
    data = [s for s in data if s["n_prompt"] >= 2 and s["idx"].shape[0] >= 1]
    n_tok = sum(int(s["idx"].shape[0]) for s in data)
    print(f"corpus: {n_tok} target positions")
    if args.corpus_only:
        return 0

    V = target.config.vocab_size
    ranking = train_draft.head_ranking(data, V)
    subset = ranking[:args.head_tokens].long()
    print(f"head subset {args.head_tokens}: mean target mass covered "
          f"{train_draft.coverage(data, ranking, args.head_tokens):.4f}")
    subset_pos = calibrate.subset_positions(subset, V)
    W_sub = target.lm_head.weight.detach()[subset].float()

    rng = random.Random(args.seed)
    rng.shuffle(data)
    if args.split == "random":
        held, train = data[:24], data[24:]
    else:
        # whole prompts out: the corpus samples each prompt several times, so a random split
        # would score the draft on prompts it was trained on
        prompt_of = [tuple(s["ids"][:s["n_prompt"]].tolist()) for s in data]
        count = collections.Counter(prompt_of)
        out: set = set()
        for key in prompt_of:
            if sum(count[k] for k in out) >= 24:
                break
            out.add(key)
        held = [s for s, k in zip(data, prompt_of, strict=True) if k in out]
        train = [s for s, k in zip(data, prompt_of, strict=True) if k not in out]
    print(f"split {args.split}: {len(held)} held-out, {len(train)} training sequences")
    held_batch = pad_batch(held)

    draft = FD.FeatureDraft(target)
    if args.resume is not None:
        start = FD.load_feature_draft(target, args.resume)
        with torch.no_grad():
            draft.fc.load_state_dict(start.fc.state_dict())
            draft.body.layers[0].load_state_dict(start.body.layers[0].state_dict())
    draft.fc.float()
    draft.body.layers[0].float()
    draft.body.norm.float()   # the shared norm, in float32 for training (restored below)
    for prm in draft.parameters():
        prm.requires_grad_(False)
    params = list(draft.fc.parameters()) + list(draft.body.layers[0].parameters())
    for prm in params:
        prm.requires_grad_(True)
    draft.body.embed_tokens.float()

    # the demo's settings: the overlap the rules accept (reported always, trained if asked)
    tvd = (SamplingConfig(0.7, 50, 0.95), calibrate.check_logit_scale(args.tvd_scale))

    def evaluate():
        """Held-out overlap at drafted positions 1, 2: at T=1 (lower bounds), then exact under
        the demo's settings with --tvd-scale."""
        with torch.no_grad():
            res = two_pass(draft, W_sub, held_batch, subset_pos, tvd)
            return [o[2] for o in res] + [float(o[3]) for o in res]

    before = evaluate()
    print(f"held-out overlap (drafted position 1, 2) before training: {before[0]:.4f}, "
          f"{before[1]:.4f}; demo settings x{args.tvd_scale:g}: {before[2]:.4f}, {before[3]:.4f}")
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    budget = args.minutes_train * 60
    t0 = time.perf_counter()
    step, log = 0, []
    while time.perf_counter() - t0 < budget:
        frac = (time.perf_counter() - t0) / budget
        for g in opt.param_groups:  # warmup, then cosine by wall-clock fraction
            g["lr"] = args.lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * frac))
        batch = pad_batch(rng.sample(train, args.seq_per_step))
        parts = two_pass(draft, W_sub, batch, subset_pos, tvd if args.tvd_weight else None)
        (kl1, reg1, ov1), (kl2, reg2, ov2) = (x[:3] for x in parts)
        loss = kl1 + kl2 + args.reg * (reg1 + reg2)
        if args.tvd_weight:
            loss = loss + args.tvd_weight * (2 - parts[0][3] - parts[1][3])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        log.append((kl1.item(), kl2.item(), reg1.item(), ov1, ov2))
        step += 1
        if step % 25 == 0:
            m = [sum(x[i] for x in log[-25:]) / 25 for i in range(5)]
            print(f"step {step} kl {m[0]:.3f}/{m[1]:.3f} reg {m[2]:.4f} overlap "
                  f"{m[3]:.3f}/{m[4]:.3f} ({time.perf_counter() - t0:.0f}/{budget:.0f} s)",
                  flush=True)
    after = evaluate()
    print(f"held-out overlap (drafted position 1, 2) after training: {after[0]:.4f}, "
          f"{after[1]:.4f}; demo settings x{args.tvd_scale:g}: {after[2]:.4f}, {after[3]:.4f} "
          f"({step} steps)")
    draft.body.norm.to(torch.bfloat16)
    draft.body.embed_tokens.to(torch.bfloat16)
    meta = {"steps": step, "corpus_sequences": len(data), "corpus_positions": n_tok,
            "split": args.split, "heldout_sequences": len(held),
            "resumed_from": str(args.resume) if args.resume else None,
            "heldout_overlap_pos1_before": round(before[0], 4),
            "heldout_overlap_pos2_before": round(before[1], 4),
            "heldout_overlap_pos1_after": round(after[0], 4),
            "heldout_overlap_pos2_after": round(after[1], 4),
            "heldout_demo_settings_overlap_before": [round(x, 4) for x in before[2:]],
            "heldout_demo_settings_overlap_after": [round(x, 4) for x in after[2:]],
            "heldout_demo_settings_scale": args.tvd_scale, "tvd_weight": args.tvd_weight,
            "head_tokens_trained": args.head_tokens,
            "minutes_total": round((time.perf_counter() - t_start) / 60, 1),
            "command": "python scripts/train_feature_draft.py "
            + " ".join(sys.argv[1:] if argv is None else argv)}
    path = FD.save_feature_draft(draft, args.out, meta, head_tokens=ranking)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB); {meta}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
