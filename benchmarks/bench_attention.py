#!/usr/bin/env python
"""Same-process A/B of the target's attention: transformers' ``sdpa`` (the baseline) against
``models.GROUPED_SDPA``, which hands a masked multi-token call's grouped key/value heads to
the CPU kernel instead of first copying the KV cache to every query head. Both give the same
logits bit for bit, so block efficiencies are identical and only time moves.

Part 1, the target call: the bf16 SmolLM2 target holds a context of ``--contexts`` tokens and
is fed n = 1, 3, 5, 9 new tokens (decoding; a gamma = 2 verification; tree rows of k = 2 and
k = 4 branches), each cropped away again, the two implementations alternated call by call;
medians of ``--repeats`` calls.

Part 0, the kernel alone (``--kernel-only`` stops after it): one layer's
``scaled_dot_product_attention`` at the target's shapes (9 query heads on 3 grouped key/value
heads of dimension 64, bf16) for n = 1, 2, 3 new tokens over the context, as the engine calls it
(grouped heads; a causal mask for n > 1, none for n = 1), medians of 300 calls. Why: on the
reference AVX2-only CPU the one-token call is the slowest of the three (stop 22), so plain
sampling's decoding calls pay more attention per call than a verification call's.

Part 2, end to end: for each demo prompt (96 new tokens, the demo's settings, seed = prompt
index), autoregressive sampling, then block verification and rrs k = 2 (tree row) with the
shipped feature draft under each implementation, the groups' order rotated from prompt to
prompt (``ab_common.rotated_runs``).

Usage::

    python benchmarks/bench_attention.py                 # both parts, 8 prompts
    python benchmarks/bench_attention.py --prompts 0     # the call costs only
    python benchmarks/bench_attention.py --kernel-only   # the attention kernel alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

IMPLS = ("sdpa", "sdpa_grouped")


def kernel_costs(contexts: list[int], repeats: int = 300) -> None:
    """Part 0: the attention kernel alone at the target's shapes (module docstring)."""
    import torch

    F = torch.nn.functional
    g = torch.Generator().manual_seed(0)
    print(f"one layer's attention kernel, us (median of {repeats}): 9 query heads on 3 key/value "
          "heads, head dim 64, bf16")
    print(f"{'context':>7s} {'n = 1':>7s} {'n = 2':>7s} {'n = 3':>7s}")
    for L in contexts:
        k = torch.randn(1, 3, L, 64, generator=g).bfloat16()
        v = torch.randn(1, 3, L, 64, generator=g).bfloat16()
        row = []
        for n in (1, 2, 3):
            q = torch.randn(1, 9, n, 64, generator=g).bfloat16()
            mask = None if n == 1 else \
                torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None]
            ts = []
            for r in range(repeats + 20):
                t0 = time.perf_counter()
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125,
                                               enable_gqa=True)
                if r >= 20:
                    ts.append(time.perf_counter() - t0)
            row.append(1e6 * statistics.median(ts))
        print(f"{L:7d} " + " ".join(f"{t:7.1f}" for t in row))


def call_costs(target, contexts: list[int], sizes: list[int], repeats: int) -> None:
    import torch

    from coupling.llm import engine as E

    print(f"target call, ms (median of {repeats}); ratio grouped / sdpa")
    print(f"{'context':>7s} {'tokens':>6s} {'sdpa':>7s} {'grouped':>8s} {'ratio':>6s}")
    for L in contexts:
        lm = E.CachedLM(target)
        E.prefill(lm, [1000 + i % 5000 for i in range(L + 1)])
        times: dict[tuple[str, int], list[float]] = {}
        for r in range(repeats + 3):
            for n in sizes:
                for impl in IMPLS:
                    target.set_attn_implementation(impl)
                    t0 = time.perf_counter()
                    lm.forward(torch.tensor([[5] * n]))
                    dt = time.perf_counter() - t0
                    lm.sync(lm.tokens[0][: L + 1])          # drop the n tokens again
                    if r >= 3:
                        times.setdefault((impl, n), []).append(dt)
        for n in sizes:
            a, b = (1e3 * statistics.median(times[(impl, n)]) for impl in IMPLS)
            print(f"{L:7d} {n:6d} {a:7.2f} {b:8.2f} {b / a:5.3f}x")


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import add_run_args, demo_prompts, print_table, rotated_runs

    from coupling.llm import engine as E
    from coupling.llm import models
    from coupling.llm.feature_draft import FeatureDrafter, load_feature_draft

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=str, default="100,200,300")
    ap.add_argument("--sizes", type=str, default="1,3,5,9")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--kernel-only", action="store_true", help="part 0 only")
    add_run_args(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernel_costs([int(x) for x in args.contexts.split(",")])
    if args.kernel_only:
        return 0

    target = models.load_target("bfloat16")
    print(f"{args.threads} thread(s), bf16 SmolLM2 target")
    call_costs(target, [int(x) for x in args.contexts.split(",")],
               [int(x) for x in args.sizes.split(",")], args.repeats)
    if args.prompts == 0:
        return 0

    tok, cfg, prompts = demo_prompts(args.prompts)
    draft = load_feature_draft(target, head_tokens=models.DRAFT_HEAD_TOKENS, int8=True)

    def method(impl: str, rule: str, k: int):
        def run(p, kw):
            target.set_attn_implementation(impl)
            return E.generate(target, FeatureDrafter(draft), p, rule=rule, gamma=2, k=k, **kw)
        return run

    groups = [[(f"{rule} k={k} {impl}", method(impl, rule, k))
               for rule, k in (("block", 1), ("rrs", 2))] for impl in IMPLS]
    tot = rotated_runs(target, prompts, groups, cfg=cfg, max_new_tokens=args.max_new_tokens,
                       eos_token_id=tok.eos_token_id)
    print(f"\nfeature draft (int8, {models.DRAFT_HEAD_TOKENS}-token head, "
          f"s = {draft.logit_scale:g}), gamma = 2, "
          f"{len(prompts)} prompts x {args.max_new_tokens} tokens")
    print_table(tot, "method", 24)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
