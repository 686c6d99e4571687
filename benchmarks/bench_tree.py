#!/usr/bin/env python
"""Same-process A/B of multi-draft verification: k branches as one row with tree attention
(``CachedLM.forward_tree``) against a batch of k rows, with autoregressive sampling and
single-draft block verification measured in the same process as baselines.

For each demo prompt (``coupling/data/prompts.json``, 96 new tokens, the demo's sampling
settings, seed = prompt index): plain autoregressive sampling, block verification, then each
``rule:k`` with tree attention and as a batch, all with the shipped feature draft (int8, the
demo's head subset ``drafts.DRAFT_HEAD_TOKENS``, its calibrated logit scale) at gamma = 2. The
methods' order rotates from prompt to prompt. Both layouts run the same rule on the same drafts
from the same generator; their p differ only by bfloat16 rounding, so their block efficiencies
agree up to the rare decision that rounding flips, and the time per target call is what the
layout changes.

Usage::

    python benchmarks/bench_tree.py                      # rrs:2,rrs:4, 8 prompts
    python benchmarks/bench_tree.py --rules rrs:2,kseq:2 --prompts 4
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import add_run_args, demo_prompts, print_table, rotated_runs, rule_spec

    from coupling.llm import engine as E
    from coupling.llm import models
    from coupling.llm.drafts import DRAFT_HEAD_TOKENS
    from coupling.llm.feature_draft import FeatureDrafter, load_feature_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rules", type=str, default="rrs:2,rrs:4",
                    help="comma-separated multi-draft methods, rule:k or rule:k:distinct")
    ap.add_argument("--gamma", type=int, default=2)
    add_run_args(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = models.load_target("bfloat16")
    tok, cfg, prompts = demo_prompts(args.prompts)
    draft = load_feature_draft(target, head_tokens=DRAFT_HEAD_TOKENS, int8=True)
    def method(rule: str, k: int, repl: bool, tree: bool):
        return lambda p, kw: E.generate(target, FeatureDrafter(draft), p, rule=rule,
                                        gamma=args.gamma, k=k, replacement=repl,
                                        tree_attention=tree, **kw)

    groups = [[("block", method("block", 1, True, False))]]
    for spec in args.rules.split(","):
        rule, k, repl = rule_spec(spec)
        for tree in (True, False):
            groups.append([(f"{rule} k={k}{'' if repl else ' distinct'} "
                            f"{'tree' if tree else 'batch'}", method(rule, k, repl, tree))])
    tot = rotated_runs(target, prompts, groups, cfg=cfg, max_new_tokens=args.max_new_tokens,
                       eos_token_id=tok.eos_token_id)
    print(f"feature draft (int8, {DRAFT_HEAD_TOKENS}-token head, "
          f"s = {draft.logit_scale:g}), gamma = {args.gamma}, {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens, {args.threads} thread(s)")
    print_table(tot, "method", 22)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
