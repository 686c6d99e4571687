"""What ``coupling demo`` prints: the table, the price of verification, the bootstrap interval."""

from __future__ import annotations

import numpy as np

LEGEND = ("BE = tokens per target verification call (HF: per target forward call); BE pred = "
          "coupling prediction from the recorded (p, q) (coupling.llm.predict); BE opt = "
          "the LP-optimal verifier's prediction on the same laws and draft law (k > 1); accept = "
          "accepted/drafted tokens; speedup = tokens/s over autoregressive in this run; 95% CI = "
          "paired bootstrap over this run's prompts (demo.speedup_interval). A <rule>_tree "
          "line (--tree) drafts a static tree, k = its nodes; its BE pred is the exact expected "
          "tokens given each drafted tree and the laws at its nodes "
          "(coupling.sequence.predict.conditional_tree_tokens).")


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
        k = r["tree"]["nodes"] if r.get("tree") else r["k"]
        lines.append(f"{name:<{w}}{k:>3}{r['block_efficiency']:>7.2f}"
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
        line += ("; on a CPU without native bf16 products, --target-quant int8 (int8 weights, "
                 "a target run by every method) scores a few tokens for about one decoding "
                 "call (docs/llm-demo.md)")
    return line


def header(res: dict) -> list[str]:
    """The lines above the table: models, sampling settings, automatic choices, call costs."""
    from ..int8 import TARGET_QUANTS

    s, mdl = res["settings"], res["models"]
    weights = "int8" if mdl["draft_quant"] == "int8" else mdl["dtype"]
    quant = TARGET_QUANTS.get(mdl["target_quant"], "")
    feature = (f"; feature draft {mdl['feature_draft_logit_scale']:g}"
               if "feature_draft_logit_scale" in mdl else "")
    gate = (f" where the draft's first law peaks at {s['draft_confidence']:g} or more, else 1"
            if s.get("draft_confidence") is not None else "")
    lines = [
        f"target: {mdl['target']} ({mdl['target_params'] / 1e6:.0f}M params, "
        f"{mdl['dtype']}{', ' if quant else ''}{quant} on {mdl['device']}); draft: "
        f"{mdl['draft']} ({mdl['draft_own_params'] / 1e6:.1f}M own params, weights {weights}, "
        f"logit scale {mdl['draft_logit_scale']:g}{feature})",
        f"sampling: temperature={s['temperature']} top_k={s['top_k']} top_p={s['top_p']}; "
        f"gamma={s['gamma']}{gate}; {s['prompts']} prompts x {s['max_new_tokens']} new tokens; "
        f"seed={s['seed']}; {s['torch_threads']} threads",
        *(f"auto: {line}" for line in s.get("auto", []))]
    trees = {r["tree"]["spec"]: r["tree"] for r in res["rules"].values() if r.get("tree")}
    for spec, t in trees.items():
        lines.append(f"tree {spec}: {t['nodes']} nodes, depth {t['depth']}, i.i.d. children, "
                     "drafted level by level and verified in one call by tree attention")
    tok = res["rules"].get("token")
    if tok:
        lines.append(f"target call {tok['target_call_ms']:.1f} ms, draft call "
                     f"{tok['draft_call_ms']:.1f} ms (ratio "
                     f"{tok['draft_call_ms'] / tok['target_call_ms']:.2f})")
    return lines


def timings_line(res: dict) -> str | None:
    """Whether the run's timings can be trusted (:mod:`.load`), loudly when they cannot."""
    if "timings_reason" not in res:
        return None
    warn = "WARNING: " if res.get("timings_reliable") is False else ""
    return f"{warn}timings: {res['timings_reason']}"


def plan_lines(res: dict) -> list[str]:
    """A plan's predicted tokens/s against the run's (``--plan``)."""
    out = []
    for name, r in res["rules"].items():
        pred = r.get("predicted_tokens_per_s")
        if pred:
            out.append(f"plan: {name} predicted {pred:.1f} tokens/s, measured "
                       f"{r['tokens_per_s']:.1f} ({100 * (r['tokens_per_s'] / pred - 1):+.1f}%)")
    return out


def render(res: dict) -> str:
    """The whole printed report of a run."""
    price = verification_price(res)
    timing = timings_line(res)
    return "\n".join([*header(res), format_table(res), *plan_lines(res),
                      *([timing] if timing else []), *([price] if price else []), LEGEND,
                      *(f"skipped {name}: {why}" for name, why in res["skipped"].items())])
