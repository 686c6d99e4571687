#!/usr/bin/env python
"""What a target call costs as it scores more tokens, for the bf16 target (the baseline), a
float32 copy and the weight-only int8 target (``int8.quantize_target_int8``, on torch's
``_weight_int8pack_mm``), and how far each one's laws are from the float32 target's.

Speculative decoding sells a call that scores gamma + 1 tokens for about the price of a
one-token call. Whether a CPU grants that depends on its matrix kernels: on one without native
bf16 products a bf16 call on 3 tokens costs up to twice a 1-token call, which caps every rule
below plain sampling; the int8 target is the way out there (``coupling demo --target-quant
int8``, docs/llm-demo.md).

Part 1, costs: each target holds a context of 100 random tokens and is fed n = 1..5 new
tokens, cropped away again; the targets alternate round by round (``--rounds``), each row a
median of ``--repeats`` calls, and the ratio t(n) / t(1) is taken within the row.

Part 2, laws: the float32 target samples ``--tokens`` tokens after a demo prompt; on that
text, the mean and max total variation between each target's next-token laws (the demo's
sampling settings) and the float32 target's.

Usage::

    python benchmarks/bench_target_quant.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def call_ms(model, n: int, repeats: int, seed: int) -> float:
    """Median of ``repeats`` calls of ``model`` on n new tokens at context 100."""
    from ab_common import TargetStep

    step = TargetStep(new=n, seed=seed, model=model)
    return statistics.median(step.time_ms() for _ in range(repeats))


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import int8_target

    from coupling.llm import demo, models
    from coupling.llm import engine as E
    from coupling.llm.sampling import SamplingConfig, probs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=150)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    tok = models.load_tokenizer()
    cfg = SamplingConfig(0.7, 50, 0.95)
    targets = {"bf16": models.load_target("bfloat16"), "float32": models.load_target("float32"),
               "bf16 + int8 weights": int8_target()}
    sizes = (1, 2, 3, 4, 5)
    print(f"target call, ms (median of {args.repeats}, context 100, {args.threads} thread(s))")
    print(f"{'round':<6}{'target':<24}" + "".join(f"{f'n={n}':>9}" for n in sizes)
          + f"{'t3/t1':>8}{'t5/t1':>8}")
    for r in range(args.rounds):
        for name, model in targets.items():
            ms = [call_ms(model, n, args.repeats, seed=100 * r + n) for n in sizes]
            print(f"{r:<6}{name:<24}" + "".join(f"{m:9.1f}" for m in ms)
                  + f"{ms[2] / ms[0]:8.2f}{ms[4] / ms[0]:8.2f}", flush=True)

    prompt = models.chat_prompt(tok, demo.load_prompts()[0])
    ref_model = targets["float32"]
    text = E.autoregressive(ref_model, prompt, max_new_tokens=args.tokens, cfg=cfg, seed=1)
    seq = torch.tensor([prompt + text.tokens])

    def laws(model):
        with torch.no_grad():
            return probs(model(seq).logits[0, len(prompt) - 1:].float(), cfg).double()

    ref = laws(ref_model)
    print(f"\nnext-token laws on {len(text.tokens)} generated positions (temperature 0.7, "
          "top-k 50, top-p 0.95): TV to the float32 target")
    for name, model in targets.items():
        if model is ref_model:
            continue
        tv = 0.5 * (laws(model) - ref).abs().sum(-1)
        print(f"  {name:<24} mean {tv.mean().item():.4f}  max {tv.max().item():.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
