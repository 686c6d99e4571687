"""Shared by tests/test_hf*.py: tiny random Llama models and the exact two-token law."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import LlamaConfig, LlamaForCausalLM

import coupling.hf

PAD = 0


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: these models are tiny, and several OpenMP threads on a shared 2-core
    machine spin against each other (a 7500 x 16 product: 0.3 ms on one thread, 14 ms on two
    under load)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_llama(seed: int, vocab: int = 16, *, init: float = 0.3, layers: int = 1,
               eos: int | None = None) -> LlamaForCausalLM:
    """A 1-layer Llama with random weights large enough (``init``) for peaked,
    context-dependent laws; float32, eval mode."""
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=128, initializer_range=init, bos_token_id=None,
                      eos_token_id=eos, pad_token_id=PAD)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def speculative(target, draft, ids, **kwargs):
    """``target.generate`` with ``coupling.hf.generate`` and ``draft``; ``ids`` a list of
    prompts (left-padded with ``PAD``) or a tensor."""
    if isinstance(ids, list):
        ids, kwargs["attention_mask"] = left_pad(ids)
    kwargs.setdefault("do_sample", True)
    return target.generate(ids, assistant_model=draft, custom_generate=coupling.hf.generate,
                           **kwargs)


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded with ``PAD``, and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@torch.no_grad()
def two_token_law(model, prompt: list[int], **sampling) -> dict[tuple[int, int], float]:
    """Plain ``generate(do_sample=True)``'s exact law of the first two tokens after ``prompt``,
    ``{(y1, y2): probability}`` over the pairs of positive probability: the softmax of the
    processed scores ``generate`` itself returns, after the prompt and after the prompt
    followed by each ``y1``."""
    kw = dict(max_new_tokens=1, return_dict_in_generate=True, output_scores=True, do_sample=True,
              **sampling)
    ids = torch.tensor([prompt])
    p1 = torch.softmax(model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                       .scores[0][0].double(), -1)
    first = torch.nonzero(p1 > 0).squeeze(1)
    ids2 = torch.cat([ids.repeat(first.numel(), 1), first.unsqueeze(1)], 1)
    p2 = torch.softmax(model.generate(ids2, attention_mask=torch.ones_like(ids2), **kw)
                       .scores[0].double(), -1)
    joint = p1[first].unsqueeze(1) * p2
    return {(int(first[i]), int(y2)): float(joint[i, y2])
            for i, y2 in torch.nonzero(joint > 0).tolist()}


def fit_pvalue(generated: torch.Tensor, law: dict[tuple[int, int], float]) -> float:
    """Chi-square goodness of fit of the first two generated tokens of every row to ``law``
    (cells of expected count < 5 pooled). A pair of probability 0 must never be generated:
    one returns 0."""
    pairs = [tuple(r) for r in generated[:, :2].tolist()]
    if any(pr not in law for pr in pairs):
        return 0.0
    cells = sorted(law)
    index = {pr: i for i, pr in enumerate(cells)}
    c = np.bincount([index[pr] for pr in pairs], minlength=len(cells)).astype(float)
    e = np.array([law[pr] for pr in cells]) * len(pairs)
    big = e >= 5
    co, eo = list(c[big]), list(e[big])
    if e[~big].sum() > 0:
        co.append(c[~big].sum())
        eo.append(e[~big].sum())
    return float(stats.chisquare(co, eo).pvalue)

