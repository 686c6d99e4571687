"""``coupling demo``: speculative sampling on a real LLM, every rule side by side.

On a fixed set of chat prompts (``coupling/data/prompts.json``), the SmolLM2-135M-Instruct
target generates with

* plain autoregressive sampling (one target call per token; same cache code as the engine),
* Hugging Face ``generate(assistant_model=draft, do_sample=True)`` with the very same draft,
* the engine with lossless verification rules of :data:`coupling.rules.RULES`, each method a
  ``(rule, k, replacement, drafter)`` spec (:class:`Method`; a method that fails its warm-up
  is skipped with the reason printed),

all with the same sampling settings and per-prompt seeds, methods interleaved prompt by prompt
and their order rotated from prompt to prompt (so machine-load drift hits every method alike).
The table reports block efficiency (tokens per target verification call), the block
efficiency the coupling analysis predicts from the (p, q) pairs seen along the run
(:mod:`coupling.llm.predict` says exactly what is predicted), for multi-draft rules the block
efficiency the LP-optimal verifier predicts on the same laws, acceptance rate (accepted /
drafted tokens), target calls, tokens/s and the speedup over autoregressive sampling measured
in the same run, with a paired bootstrap interval over the prompts (:func:`speedup_interval`).

Modules: :mod:`.settings` (methods, prompts, command line, automatic settings), :mod:`.run`
(loading and timing), :mod:`.report` (the printed table), :mod:`.plot` (the figure),
:mod:`.cli` (``main``).
"""

from .cli import main
from .plot import plot
from .report import format_table, render, speedup_interval, verification_price
from .run import load_models, run, run_method
from .settings import (
    FULL,
    INT8_DRAFT_CONFIDENCE,
    QUICK,
    Method,
    auto_settings,
    build_parser,
    check_args,
    load_prompts,
    resolve_auto,
)

__all__ = ["FULL", "INT8_DRAFT_CONFIDENCE", "QUICK", "Method", "auto_settings", "build_parser",
           "check_args", "format_table", "load_models", "load_prompts", "main", "plot", "render",
           "resolve_auto", "run", "run_method", "speedup_interval", "verification_price"]
