#!/usr/bin/env python
"""Tokens/s of ``generate(custom_generate=coupling.hf.generate)`` against Hugging Face's own
assisted generation and plain sampling, on SmolLM2-135M with the trained draft.

All three run through ``target.generate`` on the same bfloat16 target, with the demo's
sampling settings (temperature 0.7, top-k 50, top-p 0.95), the same draft module and the same
draft length (``gamma``; HF's ``num_assistant_tokens``, constant schedule, no confidence gate),
in one process, at batch sizes 1 and 4 (the first demo prompts, chat template, left-padded
to a batch).
Passes are interleaved: in each pass every batch runs every method, the methods' order rotated
from batch to batch, so that a machine that slows down mid-run does not favour one method.
Tokens count each row's generated tokens up to its first end-of-turn token. Hugging Face's
assisted generation refuses batches of more than one row; the table says so. The draft runs
as the demo runs it for both engines (``--draft-head``: its LM head restricted to the 4096
tokens of most target mass, ``--draft-quant int8``: weight-only int8; a draft call with the
full 49152-token head costs about a quarter of a target call).

Usage::

    python benchmarks/bench_hf.py
    python benchmarks/bench_hf.py --rule rrs --num-drafts 2 --gamma 2 --passes 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SAMPLING = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.95)
METHODS = ("plain", "hf_assisted", "coupling")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rule", default="block")
    ap.add_argument("--num-drafts", type=int, default=1)
    ap.add_argument("--gamma", type=int, default=2)
    ap.add_argument("--batch-sizes", default="1,4")
    ap.add_argument("--prompts", type=int, default=4, help="demo prompts (a multiple of each "
                                                           "batch size)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--draft-head", type=int, default=4096,
                    help="restrict the draft's LM head to its n most likely tokens (0: full)")
    ap.add_argument("--draft-quant", choices=("int8", "none"), default="int8")
    ap.add_argument("--json", default=None, help="write the totals to this file")
    return ap


def left_pad(prompts: list[list[int]], pad: int):
    """A left-padded batch and its attention mask (chat prompts hold the pad id itself, so the
    mask is built from the lengths, never from the ids)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def count_tokens(sequences, width: int, eos: int) -> int:
    """Generated tokens of every row, up to and including its first ``eos``."""
    n = 0
    for row in sequences[:, width:].tolist():
        n += row.index(eos) + 1 if eos in row else len(row)
    return n


def make_runner(target, draft, args, eos: int):
    """``run(method, ids, mask, seed) -> (tokens, seconds, mean acceptance length or None)``."""
    import torch

    import coupling.hf

    draft.generation_config.num_assistant_tokens = args.gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    common = dict(max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=eos,
                  **SAMPLING)
    coupling_kw = dict(custom_generate=coupling.hf.generate, rule=args.rule,
                       num_drafts=args.num_drafts, gamma=args.gamma,
                       return_dict_in_generate=True)

    def run(method: str, ids, mask, seed: int):
        torch.manual_seed(seed)
        extra = {"plain": {}, "hf_assisted": {"assistant_model": draft},
                 "coupling": {"assistant_model": draft, "seed": seed, **coupling_kw}}[method]
        t0 = time.perf_counter()
        with torch.no_grad():
            out = target.generate(ids, attention_mask=mask, **common, **extra)
        dt = time.perf_counter() - t0
        seqs = out.sequences if method == "coupling" else out
        mean = float(out.mean_acceptance_length.mean()) if method == "coupling" else None
        return count_tokens(seqs, ids.shape[1], eos), dt, mean

    return run


def measure(run, batches: dict[int, list], passes: int) -> tuple[dict, dict]:
    """Interleaved passes; returns totals ``{(B, method): [tokens, seconds, accept_sum, n]}``
    and the refusals ``{(B, method): message}``."""
    totals: dict = {}
    refused: dict = {}
    turn = 0
    for p in range(passes):
        for B, group in batches.items():
            for i, (ids, mask) in enumerate(group):
                order = METHODS[turn % 3:] + METHODS[:turn % 3]
                turn += 1
                for method in order:
                    if (B, method) in refused:
                        continue
                    try:
                        toks, secs, mean = run(method, ids, mask, seed=1000 * p + i)
                    except ValueError as exc:  # HF assisted generation: batch size 1 only
                        refused[(B, method)] = str(exc)
                        continue
                    t = totals.setdefault((B, method), [0, 0.0, 0.0, 0])
                    t[0] += toks
                    t[1] += secs
                    if mean is not None:
                        t[2] += mean
                        t[3] += 1
            print(f"pass {p + 1}/{passes}, batch size {B} done", file=sys.stderr, flush=True)
    return totals, refused


def table(totals: dict, refused: dict, sizes: list[int]) -> list[str]:
    lines = [f"{'batch':>5}  {'method':<12} {'tokens':>6} {'seconds':>8} {'tok/s':>7} "
             f"{'x plain':>8} {'x HF assisted':>14}  tokens per target call"]
    for B in sizes:
        rate = {m: totals[B, m][0] / totals[B, m][1] for m in METHODS if (B, m) in totals}
        for m in METHODS:
            if (B, m) in refused:
                lines.append(f"{B:>5}  {m:<12} refused: {refused[B, m]}")
                continue
            tok, sec, acc, n = totals[B, m]
            vs_hf = f"{rate[m] / rate['hf_assisted']:.3f}" if "hf_assisted" in rate else "-"
            per_call = f"{acc / n:.3f}" if n else ""
            lines.append(f"{B:>5}  {m:<12} {tok:>6} {sec:>8.2f} {rate[m]:>7.2f} "
                         f"{rate[m] / rate['plain']:>8.3f} {vs_hf:>14}  {per_call}")
    return lines


def main(argv: list[str] | None = None) -> int:
    import platform

    import torch

    from coupling.llm import demo, drafts, models

    args = _parser().parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if any(args.prompts % b for b in sizes):
        raise SystemExit(f"--prompts {args.prompts} must be a multiple of every batch size")
    torch.set_num_threads(args.threads)
    target = models.load_target("bfloat16")
    draft = drafts.load_draft(target, head_tokens=args.draft_head)
    if args.draft_quant == "int8":
        draft = models.quantize_draft_int8(draft)
    tok = models.load_tokenizer()
    eos = target.generation_config.eos_token_id
    prompts = [models.chat_prompt(tok, t) for t in demo.load_prompts()[: args.prompts]]
    batches = {B: [left_pad(prompts[i:i + B], eos) for i in range(0, len(prompts), B)]
               for B in sizes}
    run = make_runner(target, draft, args, eos)
    ids, mask = batches[sizes[0]][0]
    for m in METHODS:  # warm-up: first calls allocate and load kernels
        run(m, ids[:1, :], mask[:1, :], seed=0)
    totals, refused = measure(run, batches, args.passes)
    print(f"SmolLM2-135M bfloat16 + trained draft (head {args.draft_head or 'full'}, "
          f"{args.draft_quant}); rule={args.rule} num_drafts={args.num_drafts} "
          f"gamma={args.gamma}; {args.prompts} demo prompts x {args.max_new_tokens} new tokens, "
          f"{args.passes} interleaved passes; {args.threads} torch thread(s); "
          f"{platform.processor() or platform.machine()}")
    print("\n".join(table(totals, refused, sizes)))
    print("(tokens per target call: coupling's mean acceptance length, the bonus or residual "
          "token included)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args),
                       "totals": {f"{B}/{m}": v for (B, m), v in totals.items()},
                       "refused": {f"{B}/{m}": v for (B, m), v in refused.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
