#!/usr/bin/env python
"""Fit the draft-confidence gate (``engine.generate(draft_confidence=c)``) on held-out prompts.

A second drafted token adds tokens only when the first is accepted, and then with the overlap of
the second position's laws; it always costs a draft forward, a row of the verification call and
its laws. With the gate, a block has gamma = 2 tokens where the draft's first law peaks at
``c`` or more (``max q1 >= c``), else one. This script runs token verification at gamma = 2 with
the shipped feature draft on prompts the demo never uses (``train_draft.diverse_prompts`` of
the ``diverse3`` kinds, the draft's own training kinds, with seeds of their own), records per
step

    peak = max q1,   a1 = min(1, p1(x1) / q1(x1)),   a2 = sum_y min(p2, q2)

(``a1`` the chance the drafted first token is accepted, ``a2`` the second position's overlap
given it), and prints, for a grid of thresholds, the predicted speed of the gated step against
a gamma = 1 step:

    E[1 + a1 + 1{peak >= c} a1 a2] / (step_ms + extra_ms P(peak >= c))  over  E[1 + a1] / step_ms

``step_ms`` (a gamma = 1 step) and ``extra_ms`` (what a second drafted token adds to it) come
from ``benchmarks/bench_gamma.py`` on the machine (its "target ms/call", "draft ms/step" and
"other ms/step" columns at gamma = 1 and 2). The demo's default (``demo.INT8_DRAFT_CONFIDENCE``)
was chosen from this table.

Two other uses of an unsure first law are predicted from the same steps, with

    alpha1 = sum_y min(p1, q1),   opt2 = the LP-optimal acceptance of 2 distinct first drafts
                                         (coupling.optimal.optimal_acceptance, replacement=False)

* a tree where the draft is unsure (``--tree-extra-ms``: what 2 distinct first drafts verified
  by ``optimal_wor`` add to a gamma = 1 step; a third row of the call and the multi-draft rule,
  no second draft forward): a chain of 2 where ``peak >= c``, else the tree,

      E[1{peak >= c} (1 + a1 + a1 a2) + 1{peak < c} (1 + opt2)]
          / (step_ms + extra_ms P(peak >= c) + tree_extra_ms P(peak < c))

  over ``E[1 + a1] / step_ms``;

* no draft at all where the draft is unsure: a plain decoding call of ``--plain-ms`` instead of
  a gamma = 1 step pays where ``E[1 + alpha1] / step_ms < 1 / plain_ms``, i.e. where
  ``alpha1 < step_ms / plain_ms - 1``; printed per bin of the peak.

Usage::

    python scripts/fit_draft_confidence.py --target-quant int8 --threads 2
    python scripts/fit_draft_confidence.py --prompts 4 --step-ms 35.7 --extra-ms 3.8,3.0 \
        --tree-extra-ms 3.5,4.2 --plain-ms 32.3
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def predicted_speed(peak, a1, a2, c: float, step_ms: float, extra_ms: float) -> float:
    """The gated step's predicted tokens per ms over a gamma = 1 step's (see module docstring)."""
    gate = (peak >= c).astype(float)
    gated = (1 + a1 + gate * a1 * a2).mean() / (step_ms + extra_ms * gate.mean())
    return float(gated / ((1 + a1).mean() / step_ms))


def predicted_speed_tree(peak, a1, a2, opt2, c: float, step_ms: float, extra_ms: float,
                         tree_extra_ms: float) -> float:
    """A chain of 2 where ``peak >= c``, 2 distinct first drafts elsewhere, over a gamma = 1
    step's tokens per ms (see module docstring)."""
    gate = (peak >= c).astype(float)
    tokens = (gate * (1 + a1 + a1 * a2) + (1 - gate) * (1 + opt2)).mean()
    ms = step_ms + extra_ms * gate.mean() + tree_extra_ms * (1 - gate.mean())
    return float((tokens / ms) / ((1 + a1).mean() / step_ms))


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch
    import train_draft
    from coupling.optimal import optimal_acceptance

    from coupling.llm import engine as E
    from coupling.llm import feature_draft as FD
    from coupling.llm import models
    from coupling.llm.predict import _support_pair
    from coupling.llm.sampling import SamplingConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=7, help="prompt sampling seed (demo: none)")
    ap.add_argument("--target-quant", choices=("none", "int8", "w8a16"), default="int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step-ms", type=float, default=35.7,
                    help="a gamma = 1 step, ms (stop 22, int8 target, 2 threads: 35.7)")
    ap.add_argument("--extra-ms", type=str, default="3.0,3.8",
                    help="comma-separated costs of a second drafted token, ms (stop 22: 3.0-3.8)")
    ap.add_argument("--tree-extra-ms", type=str, default="3.5,4.2",
                    help="comma-separated costs of 2 distinct first drafts (optimal_wor) over one, "
                         "ms (stop 23: a third row of the call, 2.6, and the rule, 0.9-1.6)")
    ap.add_argument("--plain-ms", type=float, default=32.3,
                    help="a plain decoding step, ms (stop 22: 31.3 ms call + sampling)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    target = models.load_target("bfloat16")
    draft = FD.load_feature_draft(target, head_tokens=models.DRAFT_HEAD_TOKENS, int8=True)
    models.quantize_target(target, args.target_quant)
    tok = models.load_tokenizer()
    cfg = SamplingConfig(0.7, 50, 0.95)                  # the demo's settings
    texts = train_draft.diverse_prompts(args.prompts, args.seed,
                                        train_draft.PROMPT_SETS["diverse3"])
    rows = []

    def on_step(rec, drafts, q, p):
        if drafts.shape[1] < 2:
            return
        x = drafts[0].tolist()
        a1 = min(1.0, float(p[0, 0, x[0]]) / float(q[0, 0, x[0]]))
        a2 = float(torch.minimum(p[0, 1], q[0, 1]).sum())
        p1, q1 = _support_pair(p[0, 0], q[0, 0])
        alpha1 = float(np.minimum(p1, q1).sum())
        opt2 = optimal_acceptance(p1, q1, 2, replacement=False) if (q1 > 0).sum() >= 2 \
            else alpha1
        rows.append((float(q[0, 0].max()), a1, a2, alpha1, opt2))

    for i, text in enumerate(texts):
        E.generate(target, FD.FeatureDrafter(draft), models.chat_prompt(tok, text), seed=100 + i,
                   max_new_tokens=args.max_new_tokens, cfg=cfg, eos_token_id=tok.eos_token_id,
                   rule="token", gamma=2, on_step=on_step)
    peak, a1, a2, alpha1, opt2 = np.array(rows).T
    print(f"{len(rows)} gamma = 2 steps on {len(texts)} held-out prompts: mean a1 {a1.mean():.3f},"
          f" mean a1 a2 {(a1 * a2).mean():.3f} (the second token's yield)")
    print("threshold  share gated  " + "  ".join(f"extra {e} ms" for e in
                                                 args.extra_ms.split(",")))
    for c in (0.0, *GRID):
        speeds = [predicted_speed(peak, a1, a2, c, args.step_ms, float(e))
                  for e in args.extra_ms.split(",")]
        print(f"{c:9.2f}  {float((peak >= c).mean()):11.2f}  "
              + "  ".join(f"{s:12.4f}" for s in speeds))
    print(f"\n2 distinct first drafts (optimal_wor) where peak < c, a chain of 2 elsewhere: mean "
          f"alpha1 {alpha1.mean():.3f}, opt2 {opt2.mean():.3f}")
    pairs = [(float(e), float(t)) for e in args.extra_ms.split(",")
             for t in args.tree_extra_ms.split(",")]
    print("threshold  " + "  ".join(f"chain {e} / tree {t} ms" for e, t in pairs))
    for c in GRID:
        speeds = [predicted_speed_tree(peak, a1, a2, opt2, c, args.step_ms, e, t)
                  for e, t in pairs]
        print(f"{c:9.2f}  " + "  ".join(f"{s:20.4f}" for s in speeds))
    edge = args.step_ms / args.plain_ms - 1
    print(f"\nno draft where unsure pays where alpha1 < {edge:.3f} (step {args.step_ms} ms, plain "
          f"call {args.plain_ms} ms):")
    print("peak bin     steps  mean alpha1")
    for lo in np.arange(0.0, 1.0, 0.1):
        m = (peak >= lo) & ((peak < lo + 0.1) if lo < 0.85 else (peak <= 1.0))
        if m.any():
            print(f"{lo:.1f}-{lo + 0.1:.1f}  {int(m.sum()):8d}  {alpha1[m].mean():11.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
