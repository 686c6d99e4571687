"""The loop and the table the same-process A/B benchmarks share (``bench_draft_ab.py``,
``bench_gamma.py``, ``bench_tree.py``), the synthetic laws of the verification-call timings
(``bench_decide.py``, ``bench_cut_plan.py``) and the real target's step timed in the same
process; not a benchmark itself (``run_all.py`` runs ``bench_*.py`` only).

For each prompt (seed = its index): plain autoregressive sampling, then every group of
methods, the groups' order rotated by one from prompt to prompt so that a machine that speeds
up or slows down during a prompt does not favour one group. Totals per method: tokens,
seconds, target calls, target seconds, draft seconds.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

# a method: (name, run(prompt, kw) -> GenerationResult), kw the shared generate() arguments
Method = tuple[str, Callable]


def add_run_args(ap) -> None:
    """The arguments every A/B shares: how many demo prompts, tokens each, torch threads."""
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)


def rule_spec(text: str) -> tuple[str, int, bool]:
    """``(rule, k, replacement)`` of ``rule``, ``rule:k`` (k i.i.d. branches) or
    ``rule:k:distinct`` (k distinct first tokens), checked by the engine's
    :func:`coupling.llm.rules_adapter.check_rule`."""
    from coupling.llm.rules_adapter import check_rule

    rule, _, rest = text.strip().partition(":")
    k, _, law = rest.partition(":")
    if law not in ("", "distinct") or (k and not k.isdigit()):
        raise ValueError(f"rule spec {text!r}: write rule, rule:k or rule:k:distinct")
    spec = (rule, int(k) if k else 1, law != "distinct")
    check_rule(*spec)
    return spec


def demo_prompts(n: int):
    """The tokenizer, the demo's sampling settings (T = 0.7, top-k 50, top-p 0.95) and the
    first ``n`` demo prompts as chat token ids."""
    from coupling.llm import demo, models
    from coupling.llm.sampling import SamplingConfig

    tok = models.load_tokenizer()
    prompts = [models.chat_prompt(tok, t) for t in demo.load_prompts()[:n]]
    return tok, SamplingConfig(0.7, 50, 0.95), prompts


def demo_laws(k: int, g: int, V: int, cfg, gen):
    """Synthetic laws for timing the engine's verification call: target logits N(0, 3^2) and
    draft logits the target's plus N(0, 1), through the sampling transforms ``cfg``; the k
    branches share their first position's laws (one prefix). Returns ``p [k, g+1, V]`` and
    ``q [k, g, V]`` (float32), drawn from ``gen``."""
    import torch

    from coupling.llm.sampling import probs

    lp = torch.randn(k, g + 1, V, generator=gen) * 3
    lp[:, 0] = lp[0, 0].clone()                          # one prefix: one first law
    lq = lp[:, :g] + torch.randn(k, g, V, generator=gen)
    lq[:, 0] = lq[0, 0].clone()
    return (probs(lp.reshape(-1, V), cfg).reshape(k, g + 1, V),
            probs(lq.reshape(-1, V), cfg).reshape(k, g, V))


def rotated_runs(target, prompts: Sequence[list[int]], groups: Sequence[Sequence[Method]], *,
                 cfg, max_new_tokens: int, eos_token_id: int | None,
                 seed: int = 0) -> dict[str, list[float]]:
    from coupling.llm import engine as E

    tot: dict[str, list[float]] = {}

    def add(name: str, r) -> None:
        t = tot.setdefault(name, [0, 0.0, 0, 0.0, 0.0])
        for i, v in enumerate((len(r.tokens), r.seconds, r.target_calls, r.target_seconds,
                               r.draft_seconds)):
            t[i] += v

    for i, p in enumerate(prompts):
        kw = dict(max_new_tokens=max_new_tokens, cfg=cfg, seed=seed + i,
                  eos_token_id=eos_token_id)
        add("autoregressive", E.autoregressive(target, p, **kw))
        for group in list(groups[i % len(groups):]) + list(groups[: i % len(groups)]):
            for name, run in group:
                add(name, run(p, kw))
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    return tot


def seeded_passes(target, prompts: Sequence[list[int]], groups: Sequence[Sequence[Method]], *,
                  seeds: Sequence[int], header: Callable[[int], str], label: str, width: int,
                  **run_kw) -> dict[str, list[float]]:
    """:func:`rotated_runs` once per base seed in ``seeds`` (prompt i runs with seed base + i),
    each pass printed under ``header(base)``, then, for two or more passes, their pooled
    totals (returned). One pass moves by a few percent with its sampled text (block
    efficiency 1.41-1.47 from pass to pass for one rule and draft), so comparisons that need
    2% pool passes."""
    pooled: dict[str, list[float]] = {}
    for base in seeds:
        tot = rotated_runs(target, prompts, groups, seed=base, **run_kw)
        print(header(base), flush=True)
        print_table(tot, label, width)
        for name, row in tot.items():
            before = pooled.get(name, [0] * len(row))
            pooled[name] = [a + b for a, b in zip(before, row, strict=True)]
    if len(seeds) > 1:
        print(f"\npooled over the {len(seeds)} passes (seeds {', '.join(map(str, seeds))})")
        print_table(pooled, label, width)
    return pooled


def print_table(tot: dict[str, list[float]], label: str, width: int) -> None:
    """Block efficiency, tokens/s, ratio to autoregressive, and per target call / step the
    target's time, the draft's and everything else (laws, rule, sampling, bookkeeping)."""
    n_ar, s_ar = tot["autoregressive"][:2]
    print(f"{label:{width}s} {'block eff':>9s} {'tok/s':>6s} {'vs AR':>6s} "
          f"{'target ms/call':>14s} {'draft ms/step':>13s} {'other ms/step':>13s}")
    for name, (n, s, c, ts, ds) in tot.items():
        print(f"{name:{width}s} {n / c:9.3f} {n / s:6.2f} {(n / s) / (n_ar / s_ar):5.3f}x "
              f"{1e3 * ts / c:14.1f} {1e3 * ds / c:13.2f} {1e3 * (s - ts - ds) / c:13.2f}")


def int8_target():
    """The bf16 target with weight-only int8 projections and head (``int8.quantize_target``)."""
    from coupling.llm import int8, models

    return int8.quantize_target_int8(models.load_target("bfloat16"))


class TargetStep:
    """The real target's step, timed in this process: the denominator of the verification
    calls' "% of a step", so that both sides see the same machine (on a shared CPU the same
    call moves by 1.5-4x between phases, and a step cost copied from another run would make
    percentages meaningless). :meth:`time_ms` runs one forward of ``new`` tokens for
    ``batch`` rows at context ``ctx`` (SmolLM2-135M, bf16 on a CPU as the engine runs it,
    float16 on CUDA) and rolls the cache back: ``batch = 1, new = 1`` is a decoding step,
    ``batch = B k, new = gamma + 1`` the verification call of a ``[B, k, gamma]`` tree.
    ``model``: time this causal LM instead (another dtype, an int8 target, a draft).
    """

    _models: dict = {}

    def __init__(self, device: str = "cpu", batch: int = 1, new: int = 1, ctx: int = 100,
                 seed: int = 0, model=None):
        import torch
        from transformers import DynamicCache

        from coupling.llm import models

        if model is None:
            if device not in self._models:
                dtype = "bfloat16" if device == "cpu" else "float16"
                self._models[device] = models.load_target(dtype).to(device)
            model = self._models[device]
        self.model, self.device = model, device
        V = self.model.config.vocab_size
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, V, (batch, ctx), generator=g).to(device)
        self.tokens = torch.randint(0, V, (batch, new), generator=g).to(device)
        self.cache = DynamicCache()
        with torch.no_grad():
            self.model(input_ids=ids, cache=self.cache, use_cache=True)

    def time_ms(self) -> float:
        import time

        import torch

        with torch.no_grad():
            if self.device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            self.model(input_ids=self.tokens, cache=self.cache, use_cache=True)
            if self.device != "cpu":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        self.cache.crop(-self.tokens.shape[1])
        return 1e3 * dt
