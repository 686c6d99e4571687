"""The model pairs ``coupling record`` and ``coupling profile`` measure: the shipped ones by
name, or any two Hugging Face causal LMs sharing a tokenizer, from local folders.

* ``smollm2``: SmolLM2-135M-Instruct (bf16) with the trained 1-layer draft (4096-token head),
  the demo's pair; prompts through the chat template.
* ``gemma``: Gemma 3 270M base (bf16) with its own first ``exit_layer`` layers as the draft
  (:func:`coupling.llm.models.early_exit`); prompts as ``"Question: ...\\nAnswer:"``.
* ``target=DIR, draft=DIR``: any pair of local Hugging Face folders (no network), checked to
  share one vocabulary and tokenizer and to take tree attention
  (:func:`coupling.llm.cache.supports_tree`); ``draft=None`` with ``exit_layer`` drafts with
  the target's first layers.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .cache import TREE_ATTENTION, TREE_MODEL_TYPES, supports_tree
from .drafters import ModelDrafter

__all__ = ["Pair", "load_pair", "read_prompts", "add_pair_args", "pair_from_args", "PAIRS"]

#: the shipped pairs, by name
PAIRS = ("smollm2", "gemma")


@dataclass
class Pair:
    """A target, a drafter sharing its tokenizer, the prompts as token ids, the end-of-text
    id and the two models' names (a trace header's ``models``)."""

    target: torch.nn.Module
    drafter: ModelDrafter
    prompts: list[list[int]]
    eos_token_id: int | None
    names: dict


def read_prompts(path: str | Path | None) -> list[str]:
    """Prompts from a file: a JSON list, a JSON object with a ``prompts`` list, or one prompt
    per line of text; ``None``: the demo's prompts."""
    if path is None:
        from .demo import load_prompts

        return load_prompts()
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [line for line in text.splitlines() if line.strip()]
    data = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
        raise ValueError(f"--prompt-file {path}: give a JSON list of strings, an object with a "
                         "'prompts' list, or one prompt per line")
    return data


def _check_tree(model, what: str) -> None:
    if not supports_tree(model):
        raise ValueError(f"{what}: model type {model.config.model_type!r} with attention "
                         f"{model.config._attn_implementation!r} takes no tree attention "
                         f"(supported: {TREE_MODEL_TYPES} with {TREE_ATTENTION})")


def _local_pair(target: str, draft: str | None, exit_layer: int | None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import models

    if (draft is None) == (exit_layer is None):
        raise ValueError("with --target give one of --draft DIR or --exit-layer L")
    load = lambda p: AutoModelForCausalLM.from_pretrained(   # noqa: E731
        p, dtype=torch.bfloat16).eval()
    tmodel, tok = load(target), AutoTokenizer.from_pretrained(target)
    if draft is None:
        return tmodel, models.early_exit(tmodel, exit_layer), tok, \
            f"{target}, its first {exit_layer} layers"
    dmodel = load(draft)
    try:
        dtok = AutoTokenizer.from_pretrained(draft)
    except (OSError, ValueError):
        dtok = None                                            # a folder of weights alone
    if dtok is not None and dtok.get_vocab() != tok.get_vocab():
        raise ValueError(f"--draft {draft}: its tokenizer differs from the target's; "
                         "recording needs one vocabulary")
    if dmodel.config.vocab_size != tmodel.config.vocab_size:
        raise ValueError(f"--draft {draft}: vocabulary {dmodel.config.vocab_size}, the "
                         f"target's {tmodel.config.vocab_size}; recording needs one vocabulary")
    return tmodel, dmodel, tok, draft


def load_pair(name: str | None = "smollm2", *, target: str | None = None,
              draft: str | None = None, exit_layer: int | None = None,
              prompt_file: str | None = None, chat: bool | None = None) -> Pair:
    """A shipped pair by ``name`` (module doc), or local folders ``target``/``draft``;
    ``chat``: format prompts with the tokenizer's chat template (default: where it has one;
    the ``gemma`` pair writes ``Question: ...\\nAnswer:``)."""
    from . import drafts, models

    texts = read_prompts(prompt_file)
    if target is not None:
        tmodel, dmodel, tok, dname = _local_pair(target, draft, exit_layer)
        names = {"target": target, "draft": dname}
    elif name == "smollm2":
        tmodel, tok = models.load_target("bfloat16"), models.load_tokenizer()
        dmodel = drafts.load_draft(tmodel, head_tokens=4096)
        names = {"target": models.TARGET_NAME,
                 "draft": "the demo's 1-layer draft (4096-token head)"}
    elif name == "gemma":
        layers = 15 if exit_layer is None else exit_layer
        tmodel, tok = models.load_gemma("bfloat16")
        dmodel = models.early_exit(tmodel, layers)
        names = {"target": models.GEMMA_NAME, "draft": f"its first {layers} of "
                 f"{tmodel.config.num_hidden_layers} layers"}
        chat = False if chat is None else chat
        texts = texts if chat else [f"Question: {t}\nAnswer:" for t in texts]
    else:
        raise ValueError(f"pair {name!r}: give one of {PAIRS}, or --target DIR")
    _check_tree(tmodel, "the target")
    _check_tree(dmodel, "the draft")
    if chat is None:
        chat = getattr(tok, "chat_template", None) is not None
    prompts = [models.chat_prompt(tok, t) if chat else tok(t)["input_ids"] for t in texts]
    return Pair(tmodel, ModelDrafter(dmodel), prompts, tok.eos_token_id, names)


def add_pair_args(ap) -> None:
    """The options that name a pair and its prompts (``coupling record``, ``profile``)."""
    ap.add_argument("--pair", choices=PAIRS, default="smollm2",
                    help="a shipped pair (smollm2: the demo's; gemma: Gemma 3 270M with its "
                         "first --exit-layer layers as the draft)")
    ap.add_argument("--target", default=None,
                    help="a local Hugging Face folder to record instead of --pair")
    ap.add_argument("--draft", default=None, help="with --target: the draft's folder")
    ap.add_argument("--exit-layer", type=int, default=None,
                    help="draft with the target's first layers (gemma: 15)")
    ap.add_argument("--prompt-file", default=None,
                    help="prompts: a JSON list or one per line (the demo's 12 by default)")
    ap.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                    help="format prompts with the chat template (default: where the "
                         "tokenizer has one)")
    ap.add_argument("--threads", type=int, default=None)


def pair_from_args(args) -> Pair:
    """:func:`load_pair` from :func:`add_pair_args`' options."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return load_pair(args.pair, target=args.target, draft=args.draft,
                     exit_layer=args.exit_layer, prompt_file=args.prompt_file, chat=args.chat)
