"""Real-LLM speculative decoding: models (target, trained draft, n-gram), engine, demo.

Heavy imports (torch, transformers) happen inside the submodules, so ``import coupling.llm``
is cheap.
"""

__all__ = ["models", "engine", "sampling", "predict", "rules_adapter", "demo"]
