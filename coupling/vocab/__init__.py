r"""Drafts with another tokenizer: exact lossless verification across vocabularies.

A draft model whose tokenizer differs from the target's proposes the target's tokens in one of
two ways (:mod:`coupling.vocab.drafting`): re-encoding its drafted string with the target's
tokenizer (:class:`Retokenized`), or drafting only the pieces both vocabularies hold
(:class:`Intersection`). Either way a call's proposal has an exact law over target tokens, so
the rules of :data:`coupling.RULES` verify it unchanged (:mod:`coupling.vocab.exact`): SLEM,
SLRS and TLI of Timor et al. (arXiv:2502.05202) are ``strict`` and ``token`` on these
proposals (:data:`METHODS`), and ``block`` on them is the optimum of what the verifier sees.
On real models, :func:`coupling.hf.generate` with ``tokenizers=`` runs TLI with any
single-chain rule (:mod:`coupling.hf.vocab`).

>>> from coupling import TabularLM, target_law
>>> target_tok, draft_tok = toy_tokenizers()
>>> target = TabularLM(target_tok.size, order=1, seed=0)
>>> draft = TabularLM(draft_tok.size, order=1, seed=1)
>>> slrs = Retokenized(draft, draft_tok, target_tok, gamma=2)
>>> law = stream_law("token", target, slrs, length=3)
>>> bool(abs(law - target_law(target, 3)).sum() / 2 < 1e-12)
True
"""

from .drafting import MAX_DRAFT_PATHS, Intersection, Retokenized
from .exact import (
    METHODS,
    call_law,
    conditionals,
    generate,
    optimum,
    stream_law,
    tokens_per_call,
)
from .tokenizer import Tokenizer, shared_pieces, to_transformers, toy_tokenizers

__all__ = ["Tokenizer", "shared_pieces", "toy_tokenizers", "to_transformers", "Retokenized",
           "Intersection", "MAX_DRAFT_PATHS", "METHODS", "conditionals", "call_law", "stream_law",
           "tokens_per_call", "optimum", "generate"]
