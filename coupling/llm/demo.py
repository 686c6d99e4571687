"""``coupling demo``: speculative sampling on a real LLM, every rule side by side.

On a fixed set of chat prompts (``coupling/data/prompts.json``), the SmolLM2-135M-Instruct
target generates with

* plain autoregressive sampling (one target call per token; same cache code as the engine),
* Hugging Face ``generate(assistant_model=draft, do_sample=True)`` with the very same draft,
* the engine with each verification rule of :mod:`coupling.torch_backend` (rules the backend
  lacks are skipped with the reason printed),

all with the same sampling settings and per-prompt seeds, methods interleaved prompt by prompt
and their order rotated from prompt to prompt (so machine-load drift hits every method alike).
The table reports block efficiency (tokens per target verification call), the block
efficiency the coupling analysis predicts from the (p, q) pairs seen along the run
(:mod:`coupling.llm.predict` says exactly what is predicted), for multi-draft rules the block
efficiency the LP-optimal verifier predicts on the same laws,
acceptance rate (accepted / drafted tokens), target calls, tokens/s and the speedup over
autoregressive sampling measured in the same run, with a paired bootstrap interval over the
prompts (:func:`speedup_interval`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "data" / "prompts.json"
#: the first-law peak above which the int8 target's demo drafts a second token (auto_settings)
INT8_DRAFT_CONFIDENCE = 0.8


@dataclass(frozen=True)
class Method:
    label: str
    kind: str          # "ar" | "hf" | "engine"
    rule: str = ""
    k: int = 1
    drafter: str = "trained"
    replacement: bool = True


FULL = [
    Method("autoregressive", "ar"),
    Method("hf_assisted", "hf"),
    Method("token", "engine", "token", 1),
    Method("block", "engine", "block", 1),
    Method("kseq_k2", "engine", "kseq", 2),
    Method("kseq_k4", "engine", "kseq", 4),
    Method("rrs_k2", "engine", "rrs", 2),
    Method("rrs_k4", "engine", "rrs", 4),
    # the exact optimal *sampler* at k = 2 (an LP per call over the laws' support); at k = 4
    # that LP has U^4 draft tuples (6e7 plan entries on the demo's laws), so the optimum
    # appears as the kseq / rrs rows' "BE opt" column instead (coupling.llm.predict)
    Method("optimal_k2", "engine", "optimal", 2),
    Method("gumbel", "engine", "gumbel", 1),
    Method("token_ngram", "engine", "token", 1, drafter="ngram"),
    # feature-level (EAGLE-style) draft: reads the target's hidden states, so HF assisted
    # generation cannot run it (coupling.llm.feature_draft)
    Method("token_feature", "engine", "token", 1, drafter="feature"),
    Method("block_feature", "engine", "block", 1, drafter="feature"),
    Method("rrs_k2_feature", "engine", "rrs", 2, drafter="feature"),
    # two *distinct* first tokens (successive sampling), verified by rrs and by the exact
    # optimum for that draft law
    Method("rrs_wor_k2_feature", "engine", "rrs_wor", 2, drafter="feature"),
    Method("optimal_wor_k2_feature", "engine", "optimal_wor", 2, drafter="feature"),
    Method("gumbel_feature", "engine", "gumbel", 1, drafter="feature"),
]
QUICK = ["autoregressive", "hf_assisted", "token", "block", "kseq_k2", "gumbel",
         "block_feature"]


def load_prompts() -> list[str]:
    return json.loads(PROMPTS_FILE.read_text())["prompts"]


def check_args(args: argparse.Namespace) -> None:
    """Refuse settings the run would otherwise replace or trip over late (after the models
    load, or after the whole run): ValueError naming the option."""
    n_file = len(load_prompts())
    counts = (("--prompts", args.prompts, 1, n_file), ("--max-new-tokens", args.max_new_tokens,
              1, None), ("--gamma", args.gamma, 1, None), ("--threads", args.threads, 1, None))
    for opt, value, low, high in counts:
        if value is not None and (value < low or (high is not None and value > high)):
            span = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"{opt} {value}: must be {span}"
                             + (f" (the demo has {n_file} prompts)" if opt == "--prompts" else ""))
    if args.draft_confidence is not None and not 0.0 <= args.draft_confidence <= 1.0:
        raise ValueError(f"--draft-confidence {args.draft_confidence}: must lie in [0, 1]")
    if args.draft_head < 0:
        raise ValueError(f"--draft-head {args.draft_head}: must be >= 0 (0: the full head)")
    scale = args.draft_logit_scale
    if scale is not None and not 0.0 < scale < float("inf"):
        raise ValueError(f"--draft-logit-scale {scale}: must be a finite number > 0 (1 runs the "
                         "drafts uncalibrated; leave it out for their calibrated scales)")
    if not -2**63 <= args.seed < 2**63:
        raise ValueError(f"--seed {args.seed}: must fit in int64")
    if args.methods is not None and not [m for m in args.methods.split(",") if m.strip()]:
        raise ValueError("--methods: empty; name at least one method, or leave it out")
    for opt, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None and Path(path).is_dir():
            raise ValueError(f"{opt} {path}: is a directory; give a file name")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="coupling demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 prompts, 48 tokens, 7 methods")
    ap.add_argument("--prompts", type=int, default=None, help="number of prompts (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 96 (quick: 48)")
    ap.add_argument("--gamma", type=int, default=None,
                    help="drafted tokens per step (default 2; see auto_settings)")
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="draft gamma tokens only where the draft's first law peaks at this "
                         "or more, else one (engine.sample_chain; default with an unset "
                         "--gamma: 0.8 on the int8 target, else off)")
    ap.add_argument("--temperature", type=float, default=0.7)
    # top-k 50 bounds the support, which lets the exact LP-plan `optimal` sampler run (k = 2)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", type=str, default=None,
                    help="comma-separated subset of: " + ",".join(m.label for m in FULL))
    # models.DRAFT_HEAD_TOKENS (not imported here: the parser must not pull in torch)
    ap.add_argument("--draft-head", type=int, default=4096,
                    help="restrict the draft's LM head to its n most likely tokens (0: full head)")
    ap.add_argument("--draft-quant", choices=("int8", "none"), default="int8",
                    help="both drafts' own weights and head weight-only int8 (a draft step is "
                         "bound by reading its weights; the target always runs in --dtype)")
    ap.add_argument("--target-quant", choices=("auto", "none", "int8", "w8a16"), default="auto",
                    help="int8: weight-only int8 target (models.quantize_target_int8), run by "
                         "every method alike; for CPUs without native bf16, where a bf16 call "
                         "on a few tokens costs about twice a one-token call. w8a16: the same "
                         "int8 weights, each product's input rows rounded to int16 and summed "
                         "in integers (every method 4-5%% faster on an AVX2 CPU). "
                         "auto (default): w8a16 on a CPU whose best instruction set is AVX2, "
                         "else none")
    ap.add_argument("--draft-logit-scale", type=float, default=None,
                    help="multiply both drafts' logits by this before the sampling transforms "
                         "(default: the calibrated scale stored with each draft's weights, "
                         "scripts/calibrate_draft.py; 1 runs them uncalibrated)")
    ap.add_argument("--multi-draft-layout", choices=("tree", "batch"), default="tree",
                    help="verify k > 1 branches as one row with tree attention (one call of "
                         "1 + k * gamma tokens) or as a batch of k rows over a repeated cache")
    ap.add_argument("--device", type=str, default="cpu")
    ap.add_argument("--dtype", type=str, default="bfloat16")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--json", type=Path, default=None, help="write results as JSON here")
    ap.add_argument("--plot", type=Path, default=None, help="write a PNG figure here")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def auto_settings(device: str, target_quant: str, gamma: int | None,
                  capability: str | None = None, draft_confidence: float | None = None
                  ) -> tuple[str, int, float | None, list[str]]:
    """Resolve ``--target-quant auto``, an unset ``--gamma`` and ``--draft-confidence``.

    Returns ``(target_quant, gamma, draft_confidence, why)``, ``why`` one line per setting
    chosen here.
    ``capability`` is torch's name for the CPU's best instruction set (default: asked of
    ``torch.backends.cpu.get_cpu_capability()``). Why these choices, as measured:

    * on a CPU whose best instruction set is AVX2 (no native bf16 products), a bf16 target
      scores 3 tokens for 1.5-2.1 one-token calls, which leaves every rule slower than plain
      sampling; the weight-only int8 target, run by every method alike, scores them for
      1.0-1.1 (docs/RESULTS.md, stops 15-21), and the ``w8a16`` target (the same int8
      weights, each product's input rows rounded to int16 and summed in integers) runs every
      method 4-5% faster there, plain sampling included, with the same laws up to rounding
      (stop 28).
      Elsewhere (AVX-512, CUDA) the bf16 target verifies for about a decoding call's price
      (on the Zen 5 EPYC of stop 29, 1-5 tokens for 0.97-1.08 one-token calls). There the
      w8a16 target runs every method 1.6-1.8x faster in tokens/s, but its rules gain less
      over its own plain sampling (1.26x against bf16's 1.36x, pooled over four seeds): the
      step's own 2.1-2.2 ms is a larger share of a 13 ms call than of a 23 ms one. The demo
      compares methods on one target, so it keeps the target whose verification is free;
    * on that int8 target a second drafted token costs more than it adds on average (gamma =
      1 beat gamma = 2 in same-process runs of ``benchmarks/bench_gamma.py``, stops 17 and
      21), but not where the draft is sure of its first token: gamma = 2 gated at a first-law
      peak of 0.8 (``engine.sample_chain``'s ``confidence``) beat gamma = 1 (stop 22; the
      threshold fitted on prompts outside the demo's). Elsewhere gamma = 2, ungated.

    Explicit values are kept; an explicit ``gamma`` is not gated unless asked.
    """
    why = []
    if target_quant == "auto":
        if device.startswith("cpu"):
            if capability is None:
                import torch

                capability = torch.backends.cpu.get_cpu_capability()
            target_quant = "w8a16" if capability == "AVX2" else "none"
            why.append(f"--target-quant {target_quant}: this CPU's best instruction set is "
                       f"{capability}" + (" (no native bf16 products: an int8-weight target "
                                          "with integer sums verifies a few tokens for about "
                                          "one decoding call)" if target_quant != "none"
                                          else ""))
        else:
            target_quant = "none"
            why.append(f"--target-quant none: device {device}")
    if gamma is None:
        gamma = 2
        if target_quant in ("int8", "w8a16") and draft_confidence is None:
            draft_confidence = INT8_DRAFT_CONFIDENCE
            why.append(f"--gamma 2 --draft-confidence {draft_confidence:g}: on the int8 target "
                       "a second drafted token pays only where the draft's first law peaks "
                       f"at {draft_confidence:g} or more (benchmarks/bench_gamma.py)")
        else:
            why.append("--gamma 2")
    return target_quant, gamma, draft_confidence, why


def resolve_auto(args):
    """Fill ``args.target_quant``, ``args.gamma`` and ``args.draft_confidence`` by
    :func:`auto_settings` (once); the lines saying why go to ``args.auto``. Returns ``args``."""
    if not hasattr(args, "auto"):
        args.target_quant, args.gamma, args.draft_confidence, args.auto = auto_settings(
            args.device, args.target_quant, args.gamma,
            draft_confidence=getattr(args, "draft_confidence", None))
    return args


def run(args) -> dict:
    """Run the comparison; return the JSON-able result dict."""
    import torch
    from tqdm import tqdm

    from . import engine as E
    from . import models, rules_adapter
    from .sampling import SamplingConfig

    check_args(args)
    resolve_auto(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    n_prompts = args.prompts if args.prompts is not None else (3 if args.quick else 8)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else \
        (48 if args.quick else 96)
    wanted = (args.methods.split(",") if args.methods else (QUICK if args.quick else
                                                             [m.label for m in FULL]))
    by_label = {m.label: m for m in FULL}
    unknown = [w for w in wanted if w not in by_label]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {sorted(by_label)}")
    methods = [by_label[w] for w in wanted]
    if "autoregressive" not in wanted:
        methods.insert(0, by_label["autoregressive"])  # the speedup baseline always runs
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)

    t_load = time.perf_counter()
    target = models.load_target(args.dtype, args.device)
    draft = models.load_draft(target, head_tokens=args.draft_head,
                              logit_scale=args.draft_logit_scale)
    draft_params = models.param_count(draft, exclude_shared=True)
    int8 = args.draft_quant == "int8"
    if int8:
        models.quantize_draft_int8(draft)      # HF assisted runs this very module too
    fdraft = fdraft_params = None
    if any(m.drafter == "feature" for m in methods):
        from .feature_draft import load_feature_draft

        fdraft = load_feature_draft(target, head_tokens=args.draft_head,
                                    logit_scale=args.draft_logit_scale)
        fdraft_params = sum(v.numel() for v in fdraft.own_state_dict().values())
        if int8:
            fdraft.quantize_int8()
    target_params = models.param_count(target)
    models.quantize_target(target, args.target_quant)   # after the drafts took what they share
    tok = models.load_tokenizer()
    t_load = time.perf_counter() - t_load
    V = target.config.vocab_size
    eos = tok.eos_token_id
    tree = args.multi_draft_layout == "tree"
    if tree and not E.supports_tree(target):
        raise ValueError("--multi-draft-layout tree: this target does not take a custom "
                         "attention mask; use --multi-draft-layout batch")

    avail = rules_adapter.available()
    skipped: dict[str, str] = {}
    runnable = []
    for m in methods:
        if m.kind == "engine" and avail.get(m.rule) is not None:
            skipped[m.label] = avail[m.rule]
            print(f"[skip] {m.label}: {avail[m.rule]}")
        else:
            runnable.append(m)

    prompts = load_prompts()[:n_prompts]
    encoded = [models.chat_prompt(tok, text) for text in prompts]

    def drafter_for(m: Method):
        if m.drafter == "ngram":
            return E.NgramDrafter(V)
        if m.drafter == "feature":
            from .feature_draft import FeatureDrafter

            return FeatureDrafter(fdraft)
        return E.ModelDrafter(draft)

    def one(m: Method, prompt: list[int], seed: int, n: int):
        if m.kind == "ar":
            return E.autoregressive(target, prompt, max_new_tokens=n, cfg=cfg, seed=seed,
                                    eos_token_id=eos)
        if m.kind == "hf":
            return E.hf_assisted(target, draft, prompt, max_new_tokens=n, cfg=cfg,
                                 gamma=args.gamma, seed=seed, eos_token_id=eos,
                                 confidence=args.draft_confidence)
        return E.generate(target, drafter_for(m), prompt, max_new_tokens=n, rule=m.rule,
                          gamma=args.gamma, k=m.k, cfg=cfg, seed=seed, eos_token_id=eos,
                          replacement=m.replacement, predict=True,
                          draft_confidence=args.draft_confidence,
                          tree_attention=tree if m.k > 1 else None)

    # warm-up (first calls allocate, build kernels): not timed
    for m in runnable:
        try:
            one(m, encoded[0], 12345, 8)
        except Exception as exc:  # a backend rule that fails at run time is skipped, loudly
            skipped[m.label] = f"{type(exc).__name__}: {exc}"
            print(f"[skip] {m.label}: {skipped[m.label]}")
    runnable = [m for m in runnable if m.label not in skipped]

    acc = {m.label: dict(tokens=0, seconds=0.0, target_calls=0, steps=[], draft_s=0.0,
                         target_s=0.0, draft_calls=0, per_prompt=[]) for m in runnable}
    bar = tqdm(total=len(encoded) * len(runnable), desc="demo", disable=args.no_progress,
               file=sys.stderr)
    for i, prompt in enumerate(encoded):
        seed = args.seed + i
        # each prompt starts the cycle at another method, spread evenly over the cycle: a drift
        # of the clock within a cycle then lands on every method alike over the prompts
        shift = i * len(runnable) // len(encoded)
        for m in runnable[shift:] + runnable[:shift]:
            bar.set_postfix_str(m.label)
            try:
                r = one(m, prompt, seed, max_new)
            except ValueError as exc:
                # e.g. `optimal` with k >= 2 has no exact sampler once the support is large
                skipped[m.label] = f"failed on prompt {i}: {exc}"
                print(f"[skip] {m.label}: {skipped[m.label]}", file=sys.stderr)
                runnable.remove(m)
                del acc[m.label]
                continue
            a = acc[m.label]
            a["tokens"] += len(r.tokens)
            a["seconds"] += r.seconds
            a["target_calls"] += r.target_calls
            a["steps"] += r.steps
            a["draft_s"] += r.draft_seconds
            a["target_s"] += r.target_seconds
            a["draft_calls"] += r.draft_calls
            a["per_prompt"].append((i, len(r.tokens), r.seconds))
            bar.update(1)
    bar.close()

    ar_tps = acc["autoregressive"]["tokens"] / acc["autoregressive"]["seconds"]
    ar_runs = {i: (n, t) for i, n, t in acc["autoregressive"]["per_prompt"]}

    def spread(a: dict) -> dict:
        """Per-prompt tokens/s and the paired bootstrap interval of the speedup
        (:func:`speedup_interval`) over the prompts both this method and plain sampling ran."""
        runs = [(n, t, *ar_runs[i]) for i, n, t in a["per_prompt"] if i in ar_runs]
        return {"per_prompt_tokens_per_s": [n / t for _, n, t in a["per_prompt"]],
                "speedup_ci95": list(speedup_interval(*zip(*runs, strict=True)))}

    rules_out, baselines = {}, {}
    for m in runnable:
        a = acc[m.label]
        tps = a["tokens"] / a["seconds"]
        if m.kind in ("ar", "hf"):
            baselines[m.label] = {
                "tokens_per_s": tps, "tokens": a["tokens"], "seconds": a["seconds"],
                "target_calls": a["target_calls"],
                "tokens_per_target_call": a["tokens"] / max(a["target_calls"], 1),
                "speedup_vs_autoregressive": tps / ar_tps, **spread(a),
            }
            continue
        steps = a["steps"]
        drafted = sum(s.drafted for s in steps)
        cond = [s.conditional for s in steps if not math.isnan(s.conditional)]
        paired = [s.block_on_drafts for s in steps if not math.isnan(s.block_on_drafts)]
        rules_out[m.label] = {
            "rule": m.rule, "k": m.k, "drafter": m.drafter, "gamma": args.gamma,
            "block_efficiency": float(np.mean([s.accepted + 1 for s in steps])),
            "predicted_block_efficiency": float(np.mean([s.predicted for s in steps])),
            "optimal_predicted_block_efficiency": (
                float(np.mean([s.optimal_predicted for s in steps])) if m.k > 1 else None),
            "conditional_block_efficiency": float(np.mean(cond)) if cond else None,
            "block_on_same_drafts": float(np.mean(paired)) if paired else None,
            "acceptance_rate": sum(s.accepted for s in steps) / drafted if drafted else None,
            "mean_alpha": float(np.mean([x for s in steps for x in s.alpha])) if drafted else None,
            "target_calls": a["target_calls"], "verify_steps": len(steps),
            "tokens": a["tokens"], "seconds": a["seconds"], "tokens_per_s": tps,
            "speedup_vs_autoregressive": tps / ar_tps, **spread(a),
            "draft_calls": a["draft_calls"],
            "draft_call_ms": 1e3 * a["draft_s"] / max(a["draft_calls"], 1),
            "target_call_ms": 1e3 * a["target_s"] / max(a["target_calls"], 1),
        }
    ar = acc["autoregressive"]
    return {
        "models": {"target": models.TARGET_NAME, "draft": "1-layer distilled draft "
                   f"({models.DRAFT_WEIGHTS.name}, shares embeddings/norm/head"
                   + (f", head restricted to {args.draft_head} tokens)" if args.draft_head
                      else ")"),
                   "dtype": args.dtype, "device": args.device,
                   "target_params": target_params, "target_quant": args.target_quant,
                   "draft_own_params": draft_params, "draft_quant": args.draft_quant,
                   "draft_logit_scale": draft.coupling_logit_scale,
                   **({"feature_draft": "fc + 1 decoder layer on the target's final hidden "
                       "states (EAGLE-style; coupling/data/feature_draft_smollm2.safetensors)",
                       "feature_draft_own_params": fdraft_params,
                       "feature_draft_logit_scale": fdraft.logit_scale}
                      if fdraft is not None else {})},
        "settings": {**cfg.as_dict(), "gamma": args.gamma,
                     "draft_confidence": args.draft_confidence, "auto": args.auto,
                     "max_new_tokens": max_new,
                     "draft_head_tokens": args.draft_head,
                     "multi_draft_layout": "tree" if tree else "batch",
                     "prompts": n_prompts, "seed": args.seed, "quick": bool(args.quick),
                     "torch_threads": torch.get_num_threads(), "load_seconds": t_load,
                     "machine": platform.processor() or platform.machine(),
                     "cpu_count": os.cpu_count()},
        "baselines": baselines,
        "rules": rules_out,
        "skipped": skipped,
        "autoregressive_target_call_ms": 1e3 * ar["target_s"] / max(ar["target_calls"], 1),
    }


def speedup_interval(tokens, seconds, ar_tokens, ar_seconds, *, level: float = 0.95,
                     resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    r"""A paired bootstrap interval over prompts for a method's speedup over plain sampling.

    The speedup is a ratio of pooled rates, :math:`S = (\sum_i n_i / \sum_i t_i) /
    (\sum_i n^0_i / \sum_i t^0_i)` over prompts i (the method's tokens and seconds, then
    autoregressive sampling's on the same prompt). Prompts are resampled with replacement,
    each keeping its pair, and the interval is the central ``level`` quantile range of S over
    ``resamples`` draws (seeded). Why: prompts differ in how well the draft agrees and the
    machine's clock drifts between them, so one run's ratio moves by a few percent; the
    interval shows how far this run's own prompts move it (not run-to-run drift of the
    machine itself)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in (tokens, seconds, ar_tokens, ar_seconds)]
    n = arrays[0].size
    if any(a.ndim != 1 or a.size != n for a in arrays) or n == 0:
        raise ValueError("tokens, seconds, ar_tokens and ar_seconds must be 1-D, one entry per "
                         f"prompt, of one length >= 1; got shapes {[a.shape for a in arrays]}")
    if not all(np.isfinite(a).all() and (a >= 0).all() for a in arrays) or \
            not (arrays[1] > 0).all() or not (arrays[3] > 0).all():
        raise ValueError("tokens must be finite and >= 0, seconds finite and > 0")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level}: must lie in (0, 1)")
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) \
            or resamples < 1:
        raise ValueError(f"resamples={resamples!r}: must be an integer >= 1")
    rng = np.random.default_rng(seed)
    w = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)  # [R, n]
    tok, sec, ar_tok, ar_sec = (w @ a for a in arrays)
    speedup = (tok / sec) / (ar_tok / ar_sec)
    lo, hi = np.quantile(speedup, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def format_table(res: dict) -> str:
    w = max([16] + [len(n) + 1 for n in (*res["baselines"], *res["rules"])])
    head = (f"{'method':<{w}}{'k':>3}{'BE':>7}{'BE pred':>9}{'BE opt':>8}{'accept':>8}"
            f"{'calls':>7}{'tok/s':>8}{'speedup':>9}{'95% CI':>13}")
    lines = [head, "-" * len(head)]

    def ci(row: dict) -> str:
        lo_hi = row.get("speedup_ci95")
        return f"{'-':>13}" if lo_hi is None else f"{lo_hi[0]:>7.2f}-{lo_hi[1]:.2f}"

    for name, b in res["baselines"].items():
        lines.append(f"{name:<{w}}{'':>3}{b['tokens_per_target_call']:>7.2f}{'-':>9}{'-':>8}"
                     f"{'-':>8}{b['target_calls']:>7d}{b['tokens_per_s']:>8.1f}"
                     f"{b['speedup_vs_autoregressive']:>8.2f}x{ci(b)}")
    for name, r in res["rules"].items():
        ar = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        opt = r.get("optimal_predicted_block_efficiency")
        opt = "-" if opt is None else f"{opt:.2f}"
        lines.append(f"{name:<{w}}{r['k']:>3}{r['block_efficiency']:>7.2f}"
                     f"{r['predicted_block_efficiency']:>9.2f}{opt:>8}{ar:>8}"
                     f"{r['target_calls']:>7d}{r['tokens_per_s']:>8.1f}"
                     f"{r['speedup_vs_autoregressive']:>8.2f}x{ci(r)}")
    return "\n".join(lines)


def verification_price(res: dict) -> str | None:
    """What parallel verification cost in this run, and the speedup it leaves any rule.

    With ``c`` = the token rule's target call (gamma + 1 tokens) over the autoregressive
    one (1 token), both averaged along the run, a rule that verifies gamma drafted tokens
    per call (a multi-draft tree scores more) and emits BE tokens per call is at most
    BE / c times as fast as plain sampling, even with a free draft and no engine work.
    Speculative decoding sells a call that scores several tokens for the price of one; on a
    CPU where it does not (``c`` near gamma + 1), none of them can win, and this line says
    so. (The n-gram drafter often drafts fewer tokens, so its calls cost less.)"""
    tok, ar = res["rules"].get("token"), res.get("autoregressive_target_call_ms")
    if not tok or not ar:
        return None
    c = tok["target_call_ms"] / ar
    best = max((r["block_efficiency"] for r in res["rules"].values() if r["drafter"] != "ngram"),
               default=0.0)
    g = res["settings"]["gamma"]
    n = f"{g + 1} tokens" if res["settings"].get("draft_confidence") is None else \
        f"2 or {g + 1} tokens, gated"
    line = (f"a verification call ({n}) cost {c:.2f}x a "
            f"decoding call here: with a free draft, a rule verifying gamma drafted tokens is "
            f"at most BE / {c:.2f} times as fast as plain sampling")
    if best <= c:
        line += (f"; the best such BE of this run, {best:.2f}, does not exceed it, so none of "
                 "them can beat plain sampling on this machine")
    if c > 1.5 and res["models"].get("target_quant", "none") == "none":
        line += ("; on a CPU without native bf16, --target-quant w8a16 or int8 (int8 weights, "
                 "a target run by every method) scores a few tokens for about one decoding "
                 "call")
    return line


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(res["baselines"]) + list(res["rules"])
    sp = [res["baselines"][n]["speedup_vs_autoregressive"] for n in res["baselines"]]
    sp += [res["rules"][n]["speedup_vs_autoregressive"] for n in res["rules"]]
    a1.barh(names, sp, color=["grey"] * len(res["baselines"]) + ["C0"] * len(res["rules"]))
    a1.axvline(1.0, color="k", lw=0.8)
    a1.set_xlabel("tokens/s relative to autoregressive (same run)")
    a1.invert_yaxis()
    meas = [res["rules"][n]["block_efficiency"] for n in res["rules"]]
    pred = [res["rules"][n]["predicted_block_efficiency"] for n in res["rules"]]
    a2.scatter(pred, meas)
    for n, x, y in zip(res["rules"], pred, meas, strict=True):
        a2.annotate(n, (x, y), fontsize=7)
    lo, hi = min(pred + meas) * 0.95, max(pred + meas) * 1.05
    a2.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    a2.set_xlabel("predicted block efficiency")
    a2.set_ylabel("measured block efficiency")
    s = res["settings"]
    gated = f"@{s['draft_confidence']:g}" if s.get("draft_confidence") is not None else ""
    fig.suptitle(f"SmolLM2-135M, gamma={s['gamma']}{gated}, T={s['temperature']}, "
                 f"top-k={s['top_k']}, top-p={s['top_p']}, {s['prompts']} prompts x "
                 f"{s['max_new_tokens']} tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = _parser().parse_args(argv)
    try:
        res = run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"coupling demo: error: {exc}", file=sys.stderr)
        return 2
    s = res["settings"]
    mdl = res["models"]
    weights = "int8" if mdl["draft_quant"] == "int8" else mdl["dtype"]
    from .models import TARGET_QUANT_LABELS

    quant = TARGET_QUANT_LABELS.get(mdl["target_quant"], "")
    print(f"target: {mdl['target']} ({mdl['target_params'] / 1e6:.0f}M params, "
          f"{mdl['dtype']}{', ' if quant else ''}{quant} "
          f"on {mdl['device']}); draft: "
          f"{mdl['draft']} ({mdl['draft_own_params'] / 1e6:.1f}M own params, weights {weights}, "
          f"logit scale {mdl['draft_logit_scale']:g}"
          + (f"; feature draft {mdl['feature_draft_logit_scale']:g}"
             if "feature_draft_logit_scale" in mdl else "") + ")")
    print(f"sampling: temperature={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}; "
          f"gamma={s['gamma']}"
          + (f" where the draft's first law peaks at {s['draft_confidence']:g} or more, else 1"
             if s.get("draft_confidence") is not None else "")
          + f"; {s['prompts']} prompts x {s['max_new_tokens']} new tokens; "
          f"seed={s['seed']}; {s['torch_threads']} threads")
    for line in s.get("auto", []):
        print(f"auto: {line}")
    tok_rule = res["rules"].get("token")
    if tok_rule:
        print(f"target call {tok_rule['target_call_ms']:.1f} ms, draft call "
              f"{tok_rule['draft_call_ms']:.1f} ms (ratio "
              f"{tok_rule['draft_call_ms'] / tok_rule['target_call_ms']:.2f})")
    print(format_table(res))
    price = verification_price(res)
    if price:
        print(price)
    print("BE = tokens per target verification call (HF: per target forward call); BE pred = "
          "coupling prediction from the recorded (p, q) (coupling.llm.predict); BE opt = "
          "the LP-optimal verifier's prediction on the same laws and draft law (k > 1); accept = "
          "accepted/drafted tokens; speedup = tokens/s over autoregressive in this run; 95% CI = "
          "paired bootstrap over this run's prompts (demo.speedup_interval).")
    for name, why in res["skipped"].items():
        print(f"skipped {name}: {why}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(res, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
