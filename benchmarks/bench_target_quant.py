#!/usr/bin/env python
"""What a target call costs as it scores more tokens, for the bf16 target (the baseline), a
float32 copy and the weight-only int8 target (``models.quantize_target_int8``, on torch's
``_weight_int8pack_mm`` and on :mod:`coupling.llm.int8_kernel`'s AVX2 kernel), and how far
each one's laws are from the float32 target's.

Speculative decoding sells a call that scores gamma + 1 tokens for about the price of a
one-token call. Whether a CPU grants that depends on its matrix kernels: on one without
native bf16 (AVX2 only) a bf16 call on 3 tokens costs about twice a 1-token call, which caps
every rule below plain sampling (``docs/RESULTS.md``, stops 15 and 16).

Part 1, costs: each target holds a context of 100 random tokens and is fed n = 1..5 new
tokens, cropped away again; the targets alternate round by round (``--rounds``), each
row a median of ``--repeats`` calls, and the ratio t(n) / t(1) is taken within the row.

Part 2, laws: the float32 target samples ``--tokens`` tokens after a demo prompt; on that
text, the mean and max total variation between each target's next-token laws (the demo's
sampling settings) and the float32 target's.

``--dynamic`` adds two float32 targets whose projections run fbgemm's dynamic int8 kernel
(weights per channel, activations quantized per call with one scale per tensor): as they are,
and after SmoothQuant (Xiao et al. 2023, arXiv 2211.10438) moves the activations' outlier
channels into the weights, ``x W^T = (x / s)(W diag(s))^T`` with
``s_j = max|x_j|^a / max|W_{:,j}|^(1-a)`` (``--smooth-alpha``), the ``1 / s`` folded into the
RMSNorm before q/k/v and gate/up, into v_proj's rows before o_proj (one ``s`` per key-value
head, shared by its query heads) and into up_proj's rows before down_proj; ``max|x_j|`` from
target-generated text after demo prompts 5-8 (disjoint from the text the TV is measured on).
The LM head stays float32 in both.

Where the AVX2 kernel builds, the ``w8a16`` target runs too: the same int8 weights, each
product's input rows rounded to int16 on their own scales and summed in integers
(``models.quantize_target_int8(t, "int16")``, ``coupling demo``'s default on an AVX2 CPU).

Usage::

    python benchmarks/bench_target_quant.py --threads 1
    python benchmarks/bench_target_quant.py --threads 1 --dynamic --rounds 1   # + dynamic int8
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


def dynamic_int8(model):
    """fbgemm dynamic int8 for every projection (per-channel weights); the head stays float32."""
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {name: per_channel_dynamic_qconfig for name, mod in model.named_modules()
            if isinstance(mod, torch.nn.Linear) and name != "lm_head"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # quantize_dynamic's deprecation notice
        return quantize_dynamic(model, spec, dtype=torch.qint8)


def smooth_quant(model, calib, alpha: float):
    """SmoothQuant's rescaling of a Llama (in place, the function unchanged up to rounding):
    each projection's input channel j divided by ``s_j``, its weight column multiplied by it."""
    import torch

    amax: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(mod, inp, out):
            a = inp[0].detach().abs().reshape(-1, inp[0].shape[-1]).amax(0).float()
            amax[name] = torch.maximum(amax[name], a) if name in amax else a
        return hook

    hooks = [mod.register_forward_hook(record(n)) for n, mod in model.named_modules()
             if isinstance(mod, torch.nn.Linear)]
    with torch.no_grad():
        for ids in calib:
            model(ids)
    for h in hooks:
        h.remove()

    def smoothing(x, w):                         # s from the inputs' and weights' maxima
        return x.clamp_min(1e-5) ** alpha / w.clamp_min(1e-5) ** (1 - alpha)

    def scales(x, *weights):                     # [in]: one s for projections sharing x
        return smoothing(x, torch.stack([wt.abs().amax(0) for wt in weights]).amax(0))

    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            at, mlp, pre = layer.self_attn, layer.mlp, f"model.layers.{i}."
            s = scales(amax[pre + "self_attn.q_proj"], at.q_proj.weight, at.k_proj.weight,
                       at.v_proj.weight)
            layer.input_layernorm.weight.div_(s)
            for lin in (at.q_proj, at.k_proj, at.v_proj):
                lin.weight.mul_(s)
            s = scales(amax[pre + "mlp.gate_proj"], mlp.gate_proj.weight, mlp.up_proj.weight)
            layer.post_attention_layernorm.weight.div_(s)
            for lin in (mlp.gate_proj, mlp.up_proj):
                lin.weight.mul_(s)
            s = scales(amax[pre + "mlp.down_proj"], mlp.down_proj.weight)
            mlp.up_proj.weight.div_(s[:, None])  # down's input is silu(gate) * up: linear in up
            mlp.down_proj.weight.mul_(s)
            # o_proj's input channel (head h, dim d) is a mix of v rows (kv head h // group, d)
            x = amax[pre + "self_attn.o_proj"].reshape(-1, group, hd).amax(1)
            w = at.o_proj.weight.abs().amax(0).reshape(-1, group, hd).amax(1)
            s = smoothing(x, w)                                                # [kv heads, hd]
            at.v_proj.weight.div_(s.reshape(-1)[:, None])
            at.o_proj.weight.mul_(s[:, None, :].expand(-1, group, -1).reshape(-1))
    return model


def main(argv: list[str] | None = None) -> int:
    import torch
    from ab_common import int8_target

    from coupling.llm import demo, int8_kernel, models
    from coupling.llm import engine as E
    from coupling.llm.sampling import SamplingConfig, probs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--dynamic", action="store_true",
                    help="also the float32 target with dynamic int8 linears (fbgemm: weights "
                         "and activations int8), as it is and after SmoothQuant; the "
                         "quantization this project does not use")
    ap.add_argument("--smooth-alpha", type=float, default=0.65)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    tok = models.load_tokenizer()
    cfg = SamplingConfig(0.7, 50, 0.95)
    targets = {"bf16": models.load_target("bfloat16"), "float32": models.load_target("float32"),
               "bf16 + int8 weights": int8_target("torch")}
    avx2 = int8_target("avx2")
    if avx2.lm_head.kernel == "avx2":
        targets["  the same, AVX2 kernel"] = avx2
        targets["  w8a16, AVX2 kernel"] = int8_target("avx2", "int16")
    else:
        print(f"no AVX2 int8 kernel here: {int8_kernel.status()}")
    if args.dynamic:
        calib = []
        for i, text in enumerate(demo.load_prompts()[4:8]):
            p = models.chat_prompt(tok, text)
            r = E.autoregressive(targets["float32"], p, max_new_tokens=64, cfg=cfg, seed=i)
            calib.append(torch.tensor([p + r.tokens]))     # prompt and answer, as served
        targets["float32, dynamic int8"] = dynamic_int8(models.load_target("float32"))
        targets[f"  + SmoothQuant a={args.smooth_alpha:g}"] = dynamic_int8(
            smooth_quant(models.load_target("float32"), calib, args.smooth_alpha))
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
