#!/usr/bin/env python
"""Where a speculative step's time goes: the engine's step functions timed inside real runs.

Speculative sampling beats plain sampling by its block efficiency times the ratio of a decoding
call to a whole step (``bench_llm.py`` prints that ceiling); what the step adds to its target
call (the draft's forward passes, the laws, the rule, sampling, cache bookkeeping) is what the
measured speedup loses to the ceiling. Timed in isolation these pieces look cheaper than they
are: after a target call has streamed its weights through the caches, every small op pays for
cold caches. This script therefore wraps the engine's own functions with timers and runs whole
generations (the demo's prompts and settings, the shipped feature draft as the demo runs it),
then prints milliseconds per step for each wrapped function, nested calls included in their
callers, next to the target call and the totals of ``GenerationResult``.

Usage::

    python benchmarks/bench_step_profile.py --target-quant int8 --threads 2
    python benchmarks/bench_step_profile.py --rule block --gamma 2 --prompts 8
    python benchmarks/bench_step_profile.py --target-quant int8 --threads 2 --gamma 2 \
        --draft-confidence 0.8 --rule block
    python benchmarks/bench_step_profile.py --target-quant int8 --threads 2 --rule optimal --k 2 \
        --distinct
"""

from __future__ import annotations

import argparse
import collections
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def timed(owner, name: str, label: str, acc: collections.Counter) -> None:
    """Replace ``owner.name`` by a wrapper adding its wall time to ``acc[label]``."""
    fn = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import add_run_args, demo_prompts

    from coupling.llm import cache, drafters, models, rules_adapter
    from coupling.llm import engine as E
    from coupling.llm import feature_draft as FD
    from coupling.llm.drafts import DRAFT_HEAD_TOKENS
    from coupling.llm.int8 import TARGET_QUANTS, quantize_target
    from coupling.rules import Rule

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rule", choices=rules_adapter.RULES, default="token")
    ap.add_argument("--k", type=int, default=1, help="branches (multi-draft rules)")
    ap.add_argument("--distinct", action="store_true",
                    help="k distinct first tokens (replacement=False) instead of i.i.d. ones")
    ap.add_argument("--gamma", type=int, default=1)
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="gamma tokens only where the draft's first law peaks at this or more "
                         "(generate(draft_confidence=); the demo gates at 0.8 on the int8 target)")
    ap.add_argument("--target-quant", choices=tuple(TARGET_QUANTS), default="none")
    ap.add_argument("--head-tokens", type=int, default=None,
                    help="the feature draft's head subset (default drafts.DRAFT_HEAD_TOKENS)")
    add_run_args(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = models.load_target("bfloat16")
    head = DRAFT_HEAD_TOKENS if args.head_tokens is None else args.head_tokens
    draft = FD.load_feature_draft(target, head_tokens=head, int8=True)
    quantize_target(target, args.target_quant)
    tok, cfg, prompts = demo_prompts(args.prompts)
    kw = dict(max_new_tokens=args.max_new_tokens, cfg=cfg, eos_token_id=tok.eos_token_id,
              rule=args.rule, gamma=args.gamma, k=args.k, replacement=not args.distinct,
              draft_confidence=args.draft_confidence)
    E.generate(target, FD.FeatureDrafter(draft), prompts[0], seed=0, **kw)     # warm up

    acc: collections.Counter = collections.Counter()
    wrapped = (
            (E, "verify", "verify (target call, laws p, rule)"),
            (cache.CachedLM, "_call", "  target calls (prefills included)"),
            (E, "probs", "  laws p (sampling.probs)"),
            (rules_adapter, "decide", "  rule (rules_adapter.decide)"),
            (rules_adapter, "support", "    union support of p and q"),
            (Rule, "verify_block", "    the rule's numpy core (Rule.verify_block)"),
            (cache.CachedLM, "forward_tree", "  tree call (mask, target call)"),
            (cache.CachedLM, "select_branch", "  select_branch (cache copy)"),
            (cache.CachedLM, "sync", "cache sync"),
            (E, "prefill", "prefill"),
            (drafters, "prefill", "prefill"),
            (FD.FeatureDrafter, "propose", "draft (FeatureDrafter.propose)"),
            (FD.FeatureDrafter, "_feed", "  forward (features + head)"),
            (FD.FeatureDraft, "features", "    features"),
            (FD.FeatureDraft, "head_logits", "    head"),
            (FD.FeatureDraft, "law", "  law q"),
            (drafters, "sample_chain", "  sampling"))
    for owner, name, label in wrapped:
        timed(owner, name, label, acc)
    tot = [0, 0.0, 0, 0.0, 0.0]
    for i, p in enumerate(prompts):
        r = E.generate(target, FD.FeatureDrafter(draft), p, seed=i, **kw)
        for j, v in enumerate((len(r.tokens), r.seconds, r.target_calls, r.target_seconds,
                               r.draft_seconds)):
            tot[j] += v
    n = tot[2]
    gate = "" if args.draft_confidence is None else f" gated at {args.draft_confidence}"
    print(f"rule {args.rule}, k {args.k}{' distinct' if args.distinct else ''}, "
          f"gamma {args.gamma}{gate}, "
          f"feature draft (int8, {head}-token head), "
          f"target bf16{', ' if args.target_quant != 'none' else ''}"
          f"{TARGET_QUANTS[args.target_quant]}, "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens, {args.threads} thread(s)")
    print(f"{n} target calls, block efficiency {tot[0] / n:.3f}; per call: "
          f"step {1000 * tot[1] / n:.2f} ms = target {1000 * tot[3] / n:.2f} + draft forward "
          f"{1000 * tot[4] / n:.2f} + everything else {1000 * (tot[1] - tot[3] - tot[4]) / n:.2f}")
    call = acc[wrapped[1][2]]
    for _, _, label in wrapped:
        sec = acc[label]
        print(f"  {label:40s} {1000 * sec / n:7.3f} ms  ({100 * sec / call:5.1f}% of the calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
