"""A draft with another tokenizer on real models: Gemma 3 270M (target) and SmolLM2-135M
(draft), token-level intersection (TLI, Timor et al., arXiv:2502.05202): what it accepts, what
it would have to accept to pay, and a measured run.

The shared pieces are those of the two vocabularies with the same string, SmolLM2's space
mark read as Gemma's (:func:`coupling.hf.vocab.shared_token_ids`, the matching transformers'
assisted generation uses). On each demo prompt Gemma samples ``--tokens`` tokens
(temperature 1, its raw law); at every position the target's law ``p`` is Gemma's, and the
draft's law is SmolLM2's after the same text re-encoded by its tokenizer, restricted to the
shared pieces and renormalised. TLI's exact acceptance there is
:math:`\\alpha = \\sum_i \\min(p_i, q_i)`; tokens per call are predicted from the mean
acceptance as if every position accepted alike
(:func:`coupling.sequence.constant_acceptance_efficiency`).

The cost side: one cached decoding step of each model (bfloat16, medians of ``--steps``). A
call of gamma drafts costs about ``gamma * t_draft + t_target``, so TLI pays only if its
tokens per call exceed ``1 + gamma * t_draft / t_target``.

The measured run (``--measure``), in this process, batch 1, the same prompts and sampling:
plain ``generate(do_sample=True)`` of Gemma; :func:`coupling.hf.generate` with SmolLM2 as the
assistant (``tokenizers=``): drafting the shared pieces verified by ``token`` (TLI), and
drafting its own tokens re-encoded, verified by exact match (SLEM: ``proposal="retokenized"``,
rule ``strict``); and with Gemma's own first 15 of 18 layers as the draft (the same
vocabulary, rule ``block``). Tokens per second over all prompts, and tokens per
target call.

    .venv/bin/python benchmarks/bench_vocab_real.py [--prompts 8] [--tokens 32] [--measure]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import coupling.hf
from coupling.hf.vocab import shared_token_ids
from coupling.llm import models
from coupling.llm.demo.settings import load_prompts
from coupling.sequence import constant_acceptance_efficiency


@torch.no_grad()
def acceptances(gemma, gtok, smol, stok, prompt: str, n: int, seed: int,
                shared: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per generated position: TLI's acceptance and the target's mass on the shared pieces."""
    d_ids, t_ids = (torch.from_numpy(x) for x in shared)
    ids = torch.tensor([gtok(prompt).input_ids])
    torch.manual_seed(seed)
    out = gemma.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n)
    logits = gemma(out).logits[0, ids.shape[1] - 1:-1].double()      # [n, V_target]
    p = torch.softmax(logits, -1)
    alpha, mass = [], []
    for t in range(out.shape[1] - ids.shape[1]):
        text = gtok.decode(out[0, :ids.shape[1] + t], skip_special_tokens=True)
        sid = torch.tensor([stok(text).input_ids])
        q = torch.softmax(smol(sid).logits[0, -1].double(), -1)[d_ids]
        qi = torch.zeros_like(p[t])
        qi[t_ids] = q / q.sum()
        alpha.append(float(torch.minimum(p[t], qi).sum()))
        mass.append(float(p[t, t_ids].sum()))
    return np.array(alpha), np.array(mass)


@torch.no_grad()
def step_time(model, ids: torch.Tensor, steps: int) -> float:
    """Median seconds of one cached decoding step after ``ids``."""
    out = model(ids, use_cache=True)
    cache, nxt, times = out.past_key_values, ids[:, -1:], []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(nxt, cache=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
        cache = out.past_key_values
    return float(np.median(times))


SAMPLING = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)


@torch.no_grad()
def timed(generate, prompts: list[torch.Tensor], tokens: int, **kwargs) -> tuple[float, float]:
    """``(tokens per second, tokens per target call)`` of ``generate`` over the prompts, batch 1
    (calls counted from the speculative statistics; plain generate makes one per token)."""
    new = calls = 0
    t0 = time.perf_counter()
    for seed, ids in enumerate(prompts):
        torch.manual_seed(seed)
        out = generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                       return_dict_in_generate=True, **SAMPLING, **kwargs)
        emitted = out.sequences.shape[1] - ids.shape[1]
        new += emitted
        steps = getattr(out, "num_steps", None)
        calls += emitted if steps is None else int(steps.sum())
    return new / (time.perf_counter() - t0), new / calls


def measure(gemma, gtok, smol, stok, prompts: list[str], tokens: int,
            gammas: tuple[int, ...]) -> None:
    """Plain Gemma, Gemma with SmolLM2 across vocabularies (two proposals), Gemma with its early
    exit (module doc), each timed alone in turn, in this process."""
    ids = [torch.tensor([gtok(p).input_ids]) for p in prompts]
    exit_draft = models.early_exit(gemma, 15)
    timed(gemma.generate, ids[:1], 4)                       # warm-up
    plain, _ = timed(gemma.generate, ids, tokens)
    print(f"plain Gemma sampling: {plain:.2f} tokens/s")
    print(f"{'draft':>22} {'gamma':>5} {'tokens/call':>12} {'tokens/s':>9} {'vs plain':>9}")
    for gamma in gammas:
        for name, draft, extra in (
                ("SmolLM2 (TLI, token)", smol, dict(rule="token", tokenizers=(gtok, stok))),
                ("SmolLM2 (SLEM, strict)", smol, dict(rule="strict", tokenizers=(gtok, stok),
                                                      proposal="retokenized")),
                ("early exit 15 (block)", exit_draft, dict(rule="block"))):
            rate, per_call = timed(gemma.generate, ids, tokens, assistant_model=draft,
                                   custom_generate=coupling.hf.generate, gamma=gamma, **extra)
            print(f"{name:>22} {gamma:>5} {per_call:>12.3f} {rate:>9.2f} {rate / plain:>8.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--measure", action="store_true",
                    help="also time the three decoders (module doc)")
    ap.add_argument("--measure-tokens", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(2)
    gemma, gtok = models.load_gemma("bfloat16")
    smol, stok = models.load_target("bfloat16"), models.load_tokenizer()
    shared = shared_token_ids(gtok, stok)
    print(f"shared pieces: {shared[0].size} of the draft's {len(stok)} and the target's "
          f"{len(gtok)}")
    alpha, mass = [], []
    for s, prompt in enumerate(load_prompts()[:args.prompts]):
        a, m = acceptances(gemma, gtok, smol, stok, prompt, args.tokens, s, shared)
        alpha.append(a)
        mass.append(m)
    alpha, mass = np.concatenate(alpha), np.concatenate(mass)
    lo, hi = np.quantile(alpha, [0.25, 0.75])
    print(f"{alpha.size} positions: TLI acceptance mean {alpha.mean():.3f} (quartiles "
          f"{lo:.3f}, {hi:.3f}); the target's mass on the shared pieces mean {mass.mean():.3f}")
    g_ids = torch.tensor([gtok(load_prompts()[0]).input_ids])
    s_ids = torch.tensor([stok(load_prompts()[0]).input_ids])
    t_target, t_draft = step_time(gemma, g_ids, args.steps), step_time(smol, s_ids, args.steps)
    c = t_draft / t_target
    print(f"one decoding step: Gemma {1e3 * t_target:.1f} ms, SmolLM2 {1e3 * t_draft:.1f} ms "
          f"(ratio {c:.2f})")
    print(f"{'gamma':>5} {'predicted tokens/call':>22} {'needed to pay':>14} "
          f"{'predicted speed-up':>19}")
    for gamma in (1, 2, 3, 4):
        tokens = constant_acceptance_efficiency(float(alpha.mean()), gamma)
        need = 1 + gamma * c
        print(f"{gamma:>5} {tokens:>22.3f} {need:>14.3f} {tokens / need:>18.2f}x")
    if args.measure:
        measure(gemma, gtok, smol, stok, load_prompts()[:args.prompts], args.measure_tokens,
                (1, 2, 3))


if __name__ == "__main__":
    main()
