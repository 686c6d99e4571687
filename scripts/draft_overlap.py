#!/usr/bin/env python
"""Teacher-forced overlap of the shipped drafts with the SmolLM2 target, on text of two kinds.

For each text, the target reads it once (its laws p_j and final hidden states f_j); the
token-level draft reads it once (its laws q_j); the feature draft reads the pairs
(x_j, f_{j-1}) (its laws for the first drafted position, as at run time). Reported: the mean
over generated positions of alpha_j = sum_x min(p_j, q_j), at temperature 1 and with the demo's
sampling transforms (T = 0.7, top-k 50, top-p 0.95) applied to both laws. alpha at drafted
position 1 is what token verification accepts there, so it predicts the demo's acceptance.

Texts:
* ``demo``: the target's own answers (demo settings, seed = prompt index) to the demo prompts
  (``coupling/data/prompts.json``), which no draft was trained on;
* ``corpus PATH``: sequences of a saved training corpus (``--corpus``; the first ``--n``).

A gap between the two measures how far the drafts generalise beyond their training prompts.

Both drafts run with the calibrated logit scales stored with their weights
(``scripts/calibrate_draft.py``) unless ``--logit-scale`` overrides them.

``--head-tokens 2048,4096,8192`` reports each size of the drafts' head subset (the demo runs
``drafts.DRAFT_HEAD_TOKENS``) on the same texts.

``--target-quant none,int8`` quantizes the target (``int8.quantize_target``, after its drafts
took what they share), one target per entry: the texts are the first one's answers, and every
target's overlap is reported on those same texts, so two targets are compared without the
luck of their own sampled answers.

Usage: ``python scripts/draft_overlap.py [--prompts 8] [--tokens 96] [--corpus PATH --n 16]
[--int8] [--logit-scale 1] [--head-tokens 4096,8192] [--target-quant none,int8]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from coupling.llm import demo, drafts, int8, models
from coupling.llm import engine as E
from coupling.llm import feature_draft as FD
from coupling.llm.sampling import SamplingConfig, probs

CFGS = {"T=1": SamplingConfig(1.0), "demo": SamplingConfig(0.7, 50, 0.95)}


@torch.no_grad()
def overlaps(target, token_draft, feature_draft, ids: torch.Tensor, n_prompt: int) -> dict:
    """alpha_j per generated position for both drafts and both sampling settings."""
    ids = ids[None]
    out = target(ids, output_hidden_states=True)
    f = out.hidden_states[-1]
    laws = {"token": token_draft(ids).logits[0, 1:],                          # x_2 .. x_n
            "feature": feature_draft.logits(feature_draft.features(ids[:, 1:], f[:, :-1]))[0]}
    p_logits = out.logits[0, 1:]
    gen = slice(n_prompt - 1, None)          # laws of the generated tokens only
    res = {}
    for name, c in CFGS.items():
        p = probs(p_logits[gen].float(), c)
        for d, q_logits in laws.items():
            res[(d, name)] = torch.minimum(p, probs(q_logits[gen].float(), c)).sum(-1)
    return res


def report(label: str, target, token_draft, feature_draft, texts) -> dict:
    acc: dict = {}
    for ids, n_prompt in texts:
        for k, v in overlaps(target, token_draft, feature_draft, ids, n_prompt).items():
            acc.setdefault(k, []).append(v)
    means = {f"{d} {c}": float(torch.cat(v).mean()) for (d, c), v in acc.items()}
    n = sum(len(v) for v in acc[("token", "T=1")])
    print(f"{label} ({n} positions): " + ", ".join(f"{k} {v:.3f}" for k, v in means.items()))
    return means


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--corpus", type=Path, action="append", default=[])
    ap.add_argument("--n", type=int, default=16, help="sequences per corpus")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--int8", action="store_true",
                    help="both drafts with weight-only int8 weights (as the demo runs them)")
    ap.add_argument("--logit-scale", type=float, default=None,
                    help="run both drafts with this logit scale instead of their calibrated "
                         "ones (1: uncalibrated)")
    ap.add_argument("--head-tokens", type=str, default=None,
                    help="comma-separated sizes of the drafts' head subsets, each reported "
                         "(default drafts.DRAFT_HEAD_TOKENS, the demo's; 0: the full head)")
    ap.add_argument("--dtype", type=str, default="bfloat16",
                    help="the target's dtype, which its drafts take too (float32: the feature "
                         "draft then reads float32 features; it was trained on bf16 ones)")
    ap.add_argument("--target-quant", type=str, default="none",
                    help="comma-separated targets among none, int8 (int8.quantize_target), "
                         "each reported on the first one's texts")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        quants = int8.target_quants(args.target_quant)
    except ValueError as exc:
        ap.error(str(exc))
    if len(quants) > 1:
        return compare_targets(args, quants)

    target = models.load_target(args.dtype)
    tok = models.load_tokenizer()
    heads = [int(h) for h in (args.head_tokens or str(drafts.DRAFT_HEAD_TOKENS)).split(",")]
    # every head's drafts before the target is quantized: build_draft refuses a quantized one
    pairs = [load_drafts(target, head, args) for head in heads]
    int8.quantize_target(target, quants[0])
    token_draft, feature_draft = pairs[0]
    print(f"logit scales: token-level draft {token_draft.coupling_logit_scale:g}, "
          f"feature draft {feature_draft.logit_scale:g}")
    texts = demo_texts(target, tok, args)
    corpora = [(path, torch.load(path)[: args.n]) for path in args.corpus]
    for head, (token_draft, feature_draft) in zip(heads, pairs, strict=True):
        tag = f"head {head or 'full'}: "
        report(tag + "demo prompts", target, token_draft, feature_draft, texts)
        for path, data in corpora:
            report(f"{tag}corpus {path.name}", target, token_draft, feature_draft,
                   [(s["ids"], s["n_prompt"]) for s in data])
    return 0


def load_drafts(target, head: int, args):
    """The token-level and feature drafts of ``target`` with a ``head``-token head subset, int8
    under ``--int8``, at ``--logit-scale`` (default: their calibrated scales)."""
    token_draft = drafts.load_draft(target, head_tokens=head, logit_scale=args.logit_scale)
    if args.int8:
        drafts.quantize_draft_int8(token_draft)
    feature_draft = FD.load_feature_draft(target, head_tokens=head, int8=args.int8,
                                          logit_scale=args.logit_scale)
    return token_draft, feature_draft


def demo_texts(target, tok, args) -> list:
    """The target's answers to the first ``--prompts`` demo prompts (demo settings, seed =
    prompt index): [(ids, prompt length)]."""
    texts = []
    for j, text in enumerate(demo.load_prompts()[: args.prompts]):
        prompt = models.chat_prompt(tok, text)
        res = E.autoregressive(target, prompt, max_new_tokens=args.tokens, cfg=CFGS["demo"],
                               seed=j)
        texts.append((torch.tensor(prompt + res.tokens), len(prompt)))
    return texts


def compare_targets(args, quants: list[str]) -> int:
    """Each target of ``quants`` with its own drafts, all on the first target's texts."""
    head = int((args.head_tokens or str(drafts.DRAFT_HEAD_TOKENS)).split(",")[0])
    tok = models.load_tokenizer()
    runs = []
    for q in quants:
        target = models.load_target(args.dtype)
        token_draft, feature_draft = load_drafts(target, head, args)
        runs.append((q, int8.quantize_target(target, q), token_draft, feature_draft))
    texts = demo_texts(runs[0][1], tok, args)
    for q, target, token_draft, feature_draft in runs:
        report(f"target {q}: demo prompts, {quants[0]}'s answers", target, token_draft,
               feature_draft, texts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
