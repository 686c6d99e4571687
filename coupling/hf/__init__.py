"""The verification rules of :mod:`coupling` inside Hugging Face ``generate``.

::

    out = target.generate(input_ids, assistant_model=draft,
                          custom_generate=coupling.hf.generate,
                          do_sample=True, temperature=0.7, top_k=50, top_p=0.95,
                          max_new_tokens=128, rule="block", num_drafts=1, gamma=4, seed=0)

:func:`generate` is a ``custom_generate`` decoding method (transformers 5.x): ``generate``
prepares the inputs, the target's cache, the logits processors and the stopping criteria,
then hands the decoding loop to it. Each step drafts ``num_drafts`` branches of ``gamma``
tokens per row with ``assistant_model``, scores every branch with one target call, and lets
``rule`` decide, through the batched torch verifiers (:func:`coupling.verify`), how many
drafted tokens each row keeps and which token follows them. ``tree=`` a
:class:`coupling.Tree` of another shape (Medusa's, EAGLE's, ``Tree.from_branching([3, 2,
1])``) drafts that tree level by level instead and scores it in the same one call, one model
row per root-to-leaf path (the rows a model without tree attention needs; a rule verifies it
node by node, :func:`coupling.rules.topology.check_tree_rule`). The Hub-style folder
``custom_generate/`` at the repository root calls the same function
(``generate(custom_generate="<repo>", trust_remote_code=True, ...)``).

Lossless. For every row, the emitted tokens have the law of plain
``generate(do_sample=True)`` with the same arguments: ``p`` and ``q`` are computed by one
function from each model's logits and the same sequence (:mod:`.processors`: the generation
config's processors and warpers, and the user's ``logits_processor``, applied identically;
processors that cannot be are refused), ``q`` is the law the drafts were drawn from
(:mod:`.drafting`), and the stopping criteria are checked after every emitted token, as
plain ``generate`` checks them. ``do_sample=False`` with ``token`` or ``block`` is greedy
decoding, token for token.

Another tokenizer. With ``tokenizers=(tokenizer, assistant_tokenizer)`` the assistant may
use another vocabulary, one chain per row: it drafts the pieces both share, its law
restricted to them and renormalised over the target's ids (Timor et al.'s TLI), or, with
``proposal="retokenized"``, its own tokens, re-encoded by the target's tokenizer (SLEM with
``strict``); its context is the row's text re-encoded at every step (:mod:`.vocab`).
Models with sliding-window layers run while a row's cache fits in the window (there they
attend as full layers do) and are refused past it.

Batches. Rows accept different numbers of tokens per step: the caches hold them as a padded
``DynamicCache`` whose rejected columns are masked like left padding (:mod:`.ragged`); rows
that stop leave the batch. Every random choice of a row is keyed by ``(seed of the row,
absolute position)`` (:mod:`coupling.keyed`), so a row's output does not depend on
the other rows of its batch (:func:`row_seeds`). With ``return_dict_in_generate=True`` the
output is a :class:`SpeculativeDecoderOnlyOutput` with per-row acceptance statistics.
"""

from .decode import generate
from .options import GREEDY_RULES, Options, check_options, row_seeds
from .output import SpeculativeDecoderOnlyOutput
from .processors import CONTEXT_FREE, ROW_WISE, Laws, check_processors
from .vocab import Retokenizer, shared_token_ids

__all__ = [
    "generate",
    "row_seeds",
    "SpeculativeDecoderOnlyOutput",
    "Options",
    "check_options",
    "GREEDY_RULES",
    "Laws",
    "check_processors",
    "CONTEXT_FREE",
    "ROW_WISE",
    "Retokenizer",
    "shared_token_ids",
]
