"""Real-LLM speculative decoding: models, drafts, the engine, and ``coupling demo``.

Modules, by concern: :mod:`.models` (loading the targets offline, tokenizer, attention),
:mod:`.int8` (weight-only int8 layers), :mod:`.drafts`, :mod:`.heads`, :mod:`.feature_draft`
and :mod:`.calibrate` (the drafts), :mod:`.sampling` (the sampling laws in torch),
:mod:`.cache` (KV caches that know their tokens), :mod:`.drafters` (what proposes the
branches), :mod:`.engine`, :mod:`.rules_adapter` and :mod:`.predict` (speculative generation),
:mod:`.accel` (compiled CPU paths behind one seam) and :mod:`.demo`.

Heavy imports (torch, transformers) happen inside the submodules, so ``import coupling.llm``
is cheap.
"""

__all__ = ["accel", "cache", "calibrate", "demo", "drafters", "drafts", "engine",
           "feature_draft", "heads", "int8", "models", "predict", "rules_adapter", "sampling"]
