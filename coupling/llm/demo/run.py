"""One ``coupling demo`` run: load the models, time every method prompt by prompt, summarise.

Methods are interleaved prompt by prompt and their order rotated from prompt to prompt (so
machine-load drift hits every method alike), with the same sampling settings and per-prompt
seeds for all. :func:`run` returns the JSON-able result that :mod:`.report` prints.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import load
from .report import speedup_interval
from .settings import (
    FULL,
    PREDICTED,
    QUICK,
    Method,
    check_args,
    load_prompts,
    plan_methods,
    resolve_auto,
    tree_methods,
)


@dataclass
class Models:
    """What a run needs loaded: the target, both drafts, the tokenizer, and their sizes."""

    target: object
    draft: object
    fdraft: object | None
    tok: object
    target_params: int
    draft_params: int
    fdraft_params: int | None
    load_seconds: float


@dataclass
class Totals:
    """One method's totals over the prompts it ran."""

    tokens: int = 0
    seconds: float = 0.0
    target_calls: int = 0
    target_s: float = 0.0
    draft_calls: int = 0
    draft_s: float = 0.0
    steps: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)     # (prompt index, tokens, seconds)

    def add(self, i: int, r) -> None:
        self.tokens += len(r.tokens)
        self.seconds += r.seconds
        self.target_calls += r.target_calls
        self.target_s += r.target_seconds
        self.draft_calls += r.draft_calls
        self.draft_s += r.draft_seconds
        self.steps += r.steps
        self.per_prompt.append((i, len(r.tokens), r.seconds))


def select_methods(args: argparse.Namespace) -> list[Method]:
    """The methods ``--methods`` / ``--quick`` name, autoregressive sampling always first."""
    wanted = (args.methods.split(",") if args.methods else
              (QUICK if args.quick else [m.label for m in FULL]))
    by_label = {m.label: m for m in FULL}
    extras = tree_methods(args) if getattr(args, "tree", None) is not None else []
    extras += plan_methods(args) if getattr(args, "plan", None) is not None else []
    for extra in extras:
        by_label[extra.label] = extra
        if extra.label not in wanted:
            wanted = [*wanted, extra.label]
    unknown = [w for w in wanted if w not in by_label]
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {sorted(by_label)}")
    methods = [by_label[w] for w in wanted]
    if "autoregressive" not in wanted:
        methods.insert(0, by_label["autoregressive"])  # the speedup baseline always runs
    return methods


def run_size(args: argparse.Namespace) -> tuple[int, int]:
    """(prompts, new tokens per prompt) of the run."""
    n_prompts = args.prompts if args.prompts is not None else (3 if args.quick else 8)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else \
        (48 if args.quick else 96)
    return n_prompts, max_new


def load_models(args: argparse.Namespace, feature: bool = True) -> Models:
    """The target, the token-level draft and (``feature``) the feature draft, quantised as
    ``args`` says; the target is quantised last, after the drafts took what they share."""
    from .. import drafts, models
    from ..int8 import quantize_target

    t0 = time.perf_counter()
    target = models.load_target(args.dtype, args.device)
    draft = drafts.load_draft(target, head_tokens=args.draft_head,
                              logit_scale=args.draft_logit_scale)
    draft_params = drafts.param_count(draft, exclude_shared=True)
    int8 = args.draft_quant == "int8"
    if int8:
        drafts.quantize_draft_int8(draft)      # HF assisted runs this very module too
    fdraft = fdraft_params = None
    if feature:
        from ..feature_draft import load_feature_draft

        fdraft = load_feature_draft(target, head_tokens=args.draft_head,
                                    logit_scale=args.draft_logit_scale)
        fdraft_params = sum(v.numel() for v in fdraft.own_state_dict().values())
        if int8:
            fdraft.quantize_int8()
    target_params = drafts.param_count(target)
    quantize_target(target, args.target_quant)
    tok = models.load_tokenizer()
    return Models(target, draft, fdraft, tok, target_params, draft_params, fdraft_params,
                  time.perf_counter() - t0)


def run_method(mdl: Models, m: Method, prompt: list[int], seed: int, n: int,
               args: argparse.Namespace, cfg, tree: bool, predict: bool = True):
    """One generation of ``n`` tokens after ``prompt`` by method ``m``, as the demo times it
    (``predict``: with the coupling analysis after every step, its time not counted)."""
    from .. import engine as E

    target, eos = mdl.target, mdl.tok.eos_token_id
    if m.kind == "ar":
        return E.autoregressive(target, prompt, max_new_tokens=n, cfg=cfg, seed=seed,
                                eos_token_id=eos)
    if m.kind == "hf":
        return E.hf_assisted(target, mdl.draft, prompt, max_new_tokens=n, cfg=cfg,
                             gamma=args.gamma, seed=seed, eos_token_id=eos,
                             confidence=args.draft_confidence)
    return E.generate(target, drafter_for(mdl, m), prompt, max_new_tokens=n, rule=m.rule,
                      gamma=args.gamma, k=m.k, cfg=cfg, seed=seed, eos_token_id=eos,
                      replacement=m.replacement, predict=predict,
                      draft_confidence=None if m.tree else args.draft_confidence,
                      tree_attention=tree if m.k > 1 else None, tree=m.topology())


def drafter_for(mdl: Models, m: Method):
    """A fresh engine drafter for method ``m``."""
    from .. import engine as E

    if m.drafter == "ngram":
        return E.NgramDrafter(mdl.target.config.vocab_size)
    if m.drafter == "feature":
        from ..feature_draft import FeatureDrafter

        return FeatureDrafter(mdl.fdraft)
    return E.ModelDrafter(mdl.draft)


def runnable(methods: list[Method], skipped: dict[str, str], warm) -> list[Method]:
    """The methods that survive a warm-up generation (``warm(m)``, untimed: first calls
    allocate and build kernels); the others go to ``skipped`` with the reason, printed."""
    out = []
    for m in methods:
        try:
            warm(m)
            out.append(m)
        except Exception as exc:  # a method that fails at run time is skipped, loudly
            skipped[m.label] = f"{type(exc).__name__}: {exc}"
            print(f"[skip] {m.label}: {skipped[m.label]}")
    return out


def timed_runs(methods: list[Method], encoded: list[list[int]], one, seed0: int,
               skipped: dict[str, str], progress: bool) -> dict[str, Totals]:
    """``one(m, prompt, seed)`` for every prompt and method, the methods' order rotated from
    prompt to prompt; a method that raises ValueError is dropped with the reason."""
    from tqdm import tqdm

    methods = list(methods)
    acc = {m.label: Totals() for m in methods}
    bar = tqdm(total=len(encoded) * len(methods), desc="demo", disable=not progress,
               file=sys.stderr)
    for i, prompt in enumerate(encoded):
        # each prompt starts the cycle at another method, spread evenly over the cycle: a drift
        # of the clock within a cycle then lands on every method alike over the prompts
        shift = i * len(methods) // len(encoded)
        for m in methods[shift:] + methods[:shift]:
            if m.label in skipped:
                continue
            bar.set_postfix_str(m.label)
            try:
                r = one(m, prompt, seed0 + i)
            except ValueError as exc:
                # e.g. `optimal` with k >= 2 has no exact sampler once the support is large
                skipped[m.label] = f"failed on prompt {i}: {exc}"
                print(f"[skip] {m.label}: {skipped[m.label]}", file=sys.stderr)
                del acc[m.label]
                continue
            acc[m.label].add(i, r)
            bar.update(1)
    bar.close()
    return acc


def baseline_row(a: Totals, ar: Totals) -> dict:
    """The result row of a baseline (autoregressive, HF assisted)."""
    return {"tokens_per_s": a.tokens / a.seconds, "tokens": a.tokens, "seconds": a.seconds,
            "target_calls": a.target_calls,
            "tokens_per_target_call": a.tokens / max(a.target_calls, 1),
            **speed(a, ar)}


def rule_row(m: Method, a: Totals, ar: Totals, gamma: int) -> dict:
    """The result row of an engine method: measured and predicted block efficiency, speed."""
    steps = a.steps
    drafted = sum(s.drafted for s in steps)
    cond = [s.conditional for s in steps if not math.isnan(s.conditional)]
    paired = [s.block_on_drafts for s in steps if not math.isnan(s.block_on_drafts)]
    topology = m.topology()
    return {
        "rule": m.rule, "k": m.k, "replacement": m.replacement, "drafter": m.drafter,
        "gamma": topology.depth if topology else gamma,
        "tree": {"spec": m.tree, "nodes": topology.size, "depth": topology.depth,
                 "children": topology.children,
                 "parent": list(topology.parent)} if topology else None,
        "predicted_tokens_per_s": PREDICTED.get(m.label),
        "block_efficiency": float(np.mean([s.accepted + 1 for s in steps])),
        "predicted_block_efficiency": float(np.mean([s.predicted for s in steps])),
        "optimal_predicted_block_efficiency": (
            float(np.mean([s.optimal_predicted for s in steps])) if m.k > 1 else None),
        "conditional_block_efficiency": float(np.mean(cond)) if cond else None,
        "block_on_same_drafts": float(np.mean(paired)) if paired else None,
        "acceptance_rate": sum(s.accepted for s in steps) / drafted if drafted else None,
        "mean_alpha": float(np.mean([x for s in steps for x in s.alpha])) if drafted else None,
        "target_calls": a.target_calls, "verify_steps": len(steps),
        "tokens": a.tokens, "seconds": a.seconds, "tokens_per_s": a.tokens / a.seconds,
        **speed(a, ar),
        "draft_calls": a.draft_calls,
        "draft_call_ms": 1e3 * a.draft_s / max(a.draft_calls, 1),
        "target_call_ms": 1e3 * a.target_s / max(a.target_calls, 1),
    }


def speed(a: Totals, ar: Totals) -> dict:
    """Speedup over autoregressive sampling, per-prompt tokens/s and the paired bootstrap
    interval (:func:`speedup_interval`) over the prompts both ran."""
    ar_runs = {i: (n, t) for i, n, t in ar.per_prompt}
    runs = [(n, t, *ar_runs[i]) for i, n, t in a.per_prompt if i in ar_runs]
    return {"speedup_vs_autoregressive": (a.tokens / a.seconds) / (ar.tokens / ar.seconds),
            "per_prompt_tokens_per_s": [n / t for _, n, t in a.per_prompt],
            "speedup_ci95": list(speedup_interval(*zip(*runs, strict=True)))}


def describe_models(mdl: Models, args: argparse.Namespace) -> dict:
    """The result's ``models`` entry."""
    from ..drafts import DRAFT_WEIGHTS
    from ..models import TARGET_NAME

    head = f", head restricted to {args.draft_head} tokens)" if args.draft_head else ")"
    out = {"target": TARGET_NAME,
           "draft": f"1-layer distilled draft ({DRAFT_WEIGHTS.name}, shares embeddings/norm/head"
                    + head,
           "dtype": args.dtype, "device": args.device,
           "target_params": mdl.target_params, "target_quant": args.target_quant,
           "draft_own_params": mdl.draft_params, "draft_quant": args.draft_quant,
           "draft_logit_scale": mdl.draft.coupling_logit_scale}
    if mdl.fdraft is not None:
        out.update({"feature_draft": "fc + 1 decoder layer on the target's final hidden states "
                    "(EAGLE-style; coupling/data/feature_draft_smollm2.safetensors)",
                    "feature_draft_own_params": mdl.fdraft_params,
                    "feature_draft_logit_scale": mdl.fdraft.logit_scale})
    return out


def describe_settings(args: argparse.Namespace, cfg, mdl: Models, size: tuple[int, int],
                      tree: bool) -> dict:
    """The result's ``settings`` entry."""
    import torch

    n_prompts, max_new = size
    return {**cfg.as_dict(), "gamma": args.gamma, "draft_confidence": args.draft_confidence,
            "auto": args.auto, "max_new_tokens": max_new, "draft_head_tokens": args.draft_head,
            "multi_draft_layout": "tree" if tree else "batch", "prompts": n_prompts,
            "first_prompt": getattr(args, "first_prompt", 0),
            "seed": args.seed, "quick": bool(args.quick),
            "torch_threads": torch.get_num_threads(), "load_seconds": mdl.load_seconds,
            "machine": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()}


def run(args: argparse.Namespace) -> dict:
    """Run the comparison; return the JSON-able result dict."""
    import torch

    from .. import engine as E
    from ..models import chat_prompt
    from ..sampling import SamplingConfig

    check_args(args)
    resolve_auto(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    methods = select_methods(args)
    size = run_size(args)
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    mdl = load_models(args, feature=any(m.drafter == "feature" for m in methods))
    tree = args.multi_draft_layout == "tree"
    if tree and not E.supports_tree(mdl.target):
        raise ValueError("--multi-draft-layout tree: this target does not take a custom "
                         "attention mask; use --multi-draft-layout batch")
    first = getattr(args, "first_prompt", 0)
    encoded = [chat_prompt(mdl.tok, text) for text in load_prompts()[first:first + size[0]]]

    def one(m: Method, prompt: list[int], seed: int, n: int = size[1]):
        return run_method(mdl, m, prompt, seed, n, args, cfg, tree)

    skipped: dict[str, str] = {}
    methods = runnable(methods, skipped, lambda m: one(m, encoded[0], 12345, 8))
    before = load.snapshot()
    acc = timed_runs(methods, encoded, one, args.seed, skipped, not args.no_progress)
    other = load.other_cores(before, load.snapshot())
    reliable, why = load.verdict(other, os.cpu_count())
    ar = acc["autoregressive"]
    baselines = {m.label: baseline_row(acc[m.label], ar) for m in methods
                 if m.kind in ("ar", "hf") and m.label in acc}
    rules = {m.label: rule_row(m, acc[m.label], ar, args.gamma) for m in methods
             if m.kind == "engine" and m.label in acc}
    return {"models": describe_models(mdl, args),
            "settings": describe_settings(args, cfg, mdl, size, tree),
            "baselines": baselines, "rules": rules, "skipped": skipped,
            "autoregressive_target_call_ms": 1e3 * ar.target_s / max(ar.target_calls, 1),
            "timings_reliable": reliable, "timings_reason": why, "other_processes_cores": other}

