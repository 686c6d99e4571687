#!/usr/bin/env python
"""Same-process A/B of feature-draft variants: weights files x logit scales x head sizes,
against autoregressive sampling measured in the same process.

For each demo prompt (``coupling/data/prompts.json``, 96 new tokens, the demo's sampling
settings, seed = prompt index): plain autoregressive sampling, then token and block
verification (``--gamma``, default 2) with every variant, int8 weights as the demo runs them
and each ``--head-tokens`` size of the head's token subset (default the demo's,
``drafts.DRAFT_HEAD_TOKENS``). The variants' order rotates from prompt to prompt, so a machine
that speeds up or slows down during a prompt does not favour one variant. Printed per variant
and rule: block efficiency (tokens per target call), tokens/s and the ratio to autoregressive,
and per step
the target call, the draft's calls and everything else (laws, rule, sampling, bookkeeping).

Usage::

    python benchmarks/bench_draft_ab.py                                  # shipped, s = stored vs 1
    python benchmarks/bench_draft_ab.py --weights A.safetensors --weights B.safetensors
    python benchmarks/bench_draft_ab.py --scales stored --head-tokens 8192,4096 --gamma 1 \
        --rules token --target-quant int8 --threads 2
    python benchmarks/bench_draft_ab.py --weights A.safetensors --weights B.safetensors \
        --scales stored --rules block --draft-confidence 0.8 --target-quant int8 \
        --threads 2 --prompts 12 --max-new-tokens 128 --seeds 0,1000
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import add_run_args, demo_prompts, seeded_passes

    from coupling.llm import engine as E
    from coupling.llm import models
    from coupling.llm.drafts import DRAFT_HEAD_TOKENS
    from coupling.llm.feature_draft import FEATURE_DRAFT_WEIGHTS, FeatureDrafter, load_feature_draft
    from coupling.llm.int8 import TARGET_QUANTS, quantize_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, action="append", default=[],
                    help="feature-draft weights (repeatable; default the shipped file)")
    ap.add_argument("--scales", type=str, default="stored,1",
                    help="comma-separated logit scales per weights file; 'stored' = its own")
    ap.add_argument("--rules", type=str, default="token,block")
    ap.add_argument("--head-tokens", type=str, default=None,
                    help="comma-separated sizes of the draft head's token subset "
                         "(default drafts.DRAFT_HEAD_TOKENS)")
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="gate the gamma-th drafted token (generate(draft_confidence=c)); the "
                         "demo's is 0.8")
    ap.add_argument("--target-quant", choices=tuple(TARGET_QUANTS), default="none")
    ap.add_argument("--seeds", type=str, default="0",
                    help="comma-separated base seeds (prompt i runs with seed base + i): a "
                         "table per pass and one pooled over all of them")
    add_run_args(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = models.load_target("bfloat16")
    tok, cfg, prompts = demo_prompts(args.prompts)
    variants = {}
    for path in args.weights or [FEATURE_DRAFT_WEIGHTS]:
        for s in args.scales.split(","):
            for h in map(int, (args.head_tokens or str(DRAFT_HEAD_TOKENS)).split(",")):
                scale = None if s == "stored" else float(s)
                d = load_feature_draft(target, path, head_tokens=h, int8=True, logit_scale=scale)
                variants[f"{path.name} s={d.logit_scale:g} head={h}"] = d
    quantize_target(target, args.target_quant)   # after the drafts took what they share
    rules = args.rules.split(",")
    groups = [[(f"{name} {rule}",
                lambda p, kw, d=variants[name], rule=rule: E.generate(
                    target, FeatureDrafter(d), p, rule=rule, gamma=args.gamma,
                    draft_confidence=args.draft_confidence, **kw))
               for rule in rules] for name in variants]
    gate = "" if args.draft_confidence is None else f"@{args.draft_confidence:g}"
    seeded_passes(
        target, prompts, groups, seeds=[int(s) for s in args.seeds.split(",")],
        label="variant", width=55, cfg=cfg, max_new_tokens=args.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        header=lambda base: (
            f"target {args.target_quant}, gamma = {args.gamma}{gate}, {len(prompts)} prompts x "
            f"{args.max_new_tokens} tokens, seeds {base}..{base + len(prompts) - 1}, "
            f"{args.threads} thread(s)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
