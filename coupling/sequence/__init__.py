"""Speculative decoding over whole sequences: models, exact analysis, block LPs, predictions.

:mod:`.models` (language models and validation), :mod:`.paths` (exact laws of a call and of
the generated stream, for any rule), :mod:`.lp` (the block-level LPs: what any verifier could
achieve), :mod:`.tree_lp` (the same for a draft tree of ``k`` paths), :mod:`.predict` (tokens
per call predicted from recorded laws), :mod:`.example` (Sun et al.'s motivating example).
"""

from ..lm import LanguageModel, TabularLM, TraceLM
from .example import motivating_example
from .lp import (
    VerifierLP,
    full_information_accepted,
    optimal_block_efficiency,
    optimal_expected_accepted,
    verifier_lp,
)
from .paths import (
    accepted_length_law,
    block_efficiency,
    constant_acceptance_efficiency,
    expected_accepted,
    path_law,
    propagate,
    sample_stream,
    stream_law,
    target_law,
)
from .predict import conditional_tokens, optimal_tokens, predicted_tokens
from .tree_lp import (
    TreeVerifierLP,
    full_information_tree_accepted,
    path_selection_lp,
    selection_model,
    tree_verifier_lp,
)

__all__ = [
    "LanguageModel",
    "TabularLM",
    "TraceLM",
    "path_law",
    "accepted_length_law",
    "expected_accepted",
    "block_efficiency",
    "constant_acceptance_efficiency",
    "target_law",
    "stream_law",
    "propagate",
    "sample_stream",
    "optimal_expected_accepted",
    "optimal_block_efficiency",
    "VerifierLP",
    "verifier_lp",
    "full_information_accepted",
    "TreeVerifierLP",
    "tree_verifier_lp",
    "full_information_tree_accepted",
    "path_selection_lp",
    "selection_model",
    "predicted_tokens",
    "optimal_tokens",
    "conditional_tokens",
    "motivating_example",
]
