"""Speculative sampling verified by a rule of ``coupling``, as a Hub ``custom_generate`` method.

Publish this folder in a model repository and call::

    out = target.generate(input_ids, custom_generate="<repo>", trust_remote_code=True,
                          assistant_model=draft, do_sample=True, max_new_tokens=128,
                          rule="block", num_drafts=1, gamma=4, seed=0)

``<repo>`` is a Hub repository id, or a local path to the repository root that holds this
``custom_generate/`` folder (not the folder itself: transformers reads
``custom_generate/generate.py`` under the path it is given).

It runs :func:`coupling.hf.generate` (the same code as
``generate(custom_generate=coupling.hf.generate)``): ``rule`` is any lossless rule of
``coupling.RULES`` (``sorted(n for n, r in coupling.RULES.items() if r.lossless)``), and
``tree=`` a :class:`coupling.Tree`, ``tokenizer=`` and ``assistant_tokenizer=`` an assistant
with another tokenizer; every row's output has the law of plain
``generate(do_sample=True)`` with the same arguments.
"""

from transformers import GenerationMixin

from coupling.hf import generate as coupling_generate


def generate(model, *args, **kwargs):
    """``generate``'s own preparation, then the decoding loop of ``coupling.hf.generate``.

    An assistant with another tokenizer takes transformers' ``tokenizer=`` and
    ``assistant_tokenizer=`` here; they go on as ``tokenizers=`` (``generate`` hands a
    decoding callable neither)."""
    pair = kwargs.pop("tokenizer", None), kwargs.pop("assistant_tokenizer", None)
    if any(t is not None for t in pair):
        if any(t is None for t in pair):
            raise ValueError("pass tokenizer= and assistant_tokenizer= together: the target's "
                             "and the assistant's tokenizers")
        kwargs["tokenizers"] = pair
    return GenerationMixin.generate(model, *args, custom_generate=coupling_generate, **kwargs)
