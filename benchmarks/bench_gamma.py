#!/usr/bin/env python
"""Same-process A/B of the draft length gamma: token and block verification with the shipped
feature draft at gamma = 1, 2, 3, 4, with autoregressive sampling of the same target measured
in the same process as the baseline.

Why: a verification call scores gamma + 1 tokens, and what that costs against a one-token
call depends on the CPU's matrix kernels (``bench_target_quant.py``); the block efficiency
grows with gamma by less each time (1 + a + a^2 + ... for a per-position acceptance a). The
best gamma is where the two meet, and it moves from machine to machine; Leviathan et al.
(2023, section 3.4) choose it from a and the price ratio, this script measures it.

For each demo prompt (``coupling/data/prompts.json``, 96 new tokens, the demo's sampling
settings, seed = prompt index): plain autoregressive sampling, then every (gamma, rule), their
order rotated from prompt to prompt. The feature draft runs as the demo runs it (int8,
the head subset ``drafts.DRAFT_HEAD_TOKENS``, its calibrated logit scale); ``--target-quant
int8`` quantizes the target after the draft took its shared tensors, as ``coupling demo
--target-quant int8`` does.

``--rules`` also takes multi-draft rules as ``rule:k`` (``rrs:2``: k i.i.d. branches) or
``rule:k:distinct`` (``optimal:2:distinct``: k distinct first tokens, ``replacement=False``),
verified as one row with tree attention as the demo runs them, so the single- and multi-draft
rules can be compared at one gamma in one process. ``--predict on`` runs the engine as ``coupling
demo`` does, with the coupling analysis after every step (its time is excluded from the timing,
but it runs between the calls); ``both`` runs each method both ways.

Usage::

    python benchmarks/bench_gamma.py --target-quant int8
    python benchmarks/bench_gamma.py --gammas 1,2 --rules token --prompts 4
    python benchmarks/bench_gamma.py --target-quant int8 --threads 2 --gammas 1 \
        --rules block,rrs:2,optimal:2:distinct,rrs:4
    python benchmarks/bench_gamma.py --target-quant int8 --threads 2 --gammas 2@0.8 \
        --rules block --dtypes bfloat16,float32
    python benchmarks/bench_gamma.py --target-quant none,int8 --threads 2 --gammas 2,2@0.8 \
        --rules block --seeds 0,1000,2000,3000

``--dtypes bfloat16,float32`` runs every method, autoregressive sampling included, with the
target's (and its draft's) activations in each dtype. ``--target-quant none,int8`` does the
same for two targets, each method's ratio against the first target's plain sampling, and each
target's plain sampling timed in the same process.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import add_run_args, demo_prompts, rule_spec, seeded_passes

    from coupling.llm import engine as E
    from coupling.llm import models
    from coupling.llm.drafts import DRAFT_HEAD_TOKENS
    from coupling.llm.feature_draft import FeatureDrafter, load_feature_draft
    from coupling.llm.int8 import quantize_target, target_quants

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gammas", type=str, default="1,2,3,4",
                    help="comma-separated draft lengths; gamma@c drafts gamma tokens only where "
                         "the draft's first law peaks at c or more, else one "
                         "(generate(draft_confidence=c))")
    ap.add_argument("--rules", type=str, default="token,block",
                    help="comma-separated rules; rule:k for k i.i.d. branches, rule:k:distinct "
                         "for k distinct first tokens (multi-draft rules)")
    ap.add_argument("--predict", choices=("off", "on", "both"), default="off",
                    help="run the engine with the demo's per-step analysis (predict=True)")
    ap.add_argument("--target-quant", type=str, default="none",
                    help="comma-separated targets among none, int8 (int8.TARGET_QUANTS): "
                         "every method for each, ratios against the first one's plain sampling")
    ap.add_argument("--dtypes", type=str, default="bfloat16",
                    help="comma-separated activation dtypes of the target (and its draft), "
                         "e.g. bfloat16,float32: every method, autoregressive sampling "
                         "included, for each; ratios against the first dtype's")
    ap.add_argument("--seeds", type=str, default="0",
                    help="comma-separated base seeds (prompt i runs with seed base + i): one "
                         "pass over the prompts per base, a table per pass and one pooled over "
                         "all of them")
    add_run_args(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    try:
        quants = target_quants(args.target_quant)
    except ValueError as exc:
        ap.error(str(exc))
    variants = [(dt, q) for dt in args.dtypes.split(",") for q in quants]
    pairs = {}                                   # (dtype, quant) -> (target, its feature draft)
    for dt, q in variants:
        t = models.load_target(dt)
        d = load_feature_draft(t, head_tokens=DRAFT_HEAD_TOKENS, int8=True)
        pairs[dt, q] = (quantize_target(t, q), d)   # after the draft took what it shares
    target, draft = pairs[variants[0]]
    tok, cfg, prompts = demo_prompts(args.prompts)

    def method(rule: str, k: int, repl: bool, gamma: int, conf: float | None, predict: bool, v):
        t, d = pairs[v]
        return lambda p, kw: E.generate(t, FeatureDrafter(d), p, rule=rule, k=k,
                                        replacement=repl, gamma=gamma, predict=predict,
                                        draft_confidence=conf, **kw)

    def tag(v) -> str:
        dt, q = v
        return " ".join(([dt] if len({d for d, _ in variants}) > 1 else [])
                        + ([q] if len(quants) > 1 else []) + [""])

    def length(spec: str) -> tuple[int, float | None]:
        g, _, c = spec.partition("@")
        return int(g), (float(c) if c else None)

    rules = [rule_spec(r) for r in args.rules.split(",")]
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.predict]
    # one group per method: the order of all of them rotates from prompt to prompt
    groups = [[(f"{tag(v)}gamma={g}{f'@{c:g}' if c is not None else ''} {rule}"
                f"{f' k={k}' if k > 1 else ''}{'' if repl else ' distinct'}"
                f"{' predict' if pr and args.predict == 'both' else ''}",
                method(rule, k, repl, g, c, pr, v))]
              for v in variants
              for g, c in map(length, args.gammas.split(",")) for rule, k, repl in rules
              for pr in modes]
    groups += [[(f"autoregressive {tag(v)}".rstrip(),
                 lambda p, kw, t=pairs[v][0]: E.autoregressive(t, p, **kw))]
               for v in variants[1:]]
    width = max(16, *(len(name) for grp in groups for name, _ in grp))
    seeded_passes(
        target, prompts, groups, seeds=[int(s) for s in args.seeds.split(",")],
        label="method", width=width, cfg=cfg, max_new_tokens=args.max_new_tokens,
        eos_token_id=tok.eos_token_id,
        header=lambda base: (
            f"feature draft (int8, {DRAFT_HEAD_TOKENS}-token head, "
            f"s = {draft.logit_scale:g}), targets {', '.join(' '.join(v) for v in variants)} "
            f"(first: the baseline), {len(prompts)} prompts x {args.max_new_tokens} tokens, "
            f"seeds {base}..{base + len(prompts) - 1}, {args.threads} thread(s)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
