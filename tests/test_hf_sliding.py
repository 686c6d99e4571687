"""``coupling.hf.generate`` on models with sliding-window layers (Gemma 3): exact within the
window, refused past it."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import coupling.hf
from tests.hf_helpers import left_pad, one_thread  # noqa: F401 (one_thread: an autouse fixture)

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]


def tiny_gemma(seed: int, window: int) -> Gemma3ForCausalLM:
    """Two layers, the first sliding (``window`` tokens), the second global."""
    cfg = Gemma3TextConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=8, max_position_embeddings=128, sliding_window=window,
                           layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
                           bos_token_id=None, eos_token_id=None, initializer_range=0.5)
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(cfg).eval()


def run(window: int, **kwargs):
    ids, mask = left_pad(PROMPTS)
    return tiny_gemma(0, window).generate(
        ids, attention_mask=mask, assistant_model=tiny_gemma(1, window), do_sample=True,
        custom_generate=coupling.hf.generate, max_new_tokens=20, seed=[1, 2, 3], gamma=3,
        **kwargs)


@pytest.mark.parametrize("rule", ["block", "rrs"])
def test_within_the_window_a_sliding_layer_is_a_full_one(rule):
    kw = dict(rule=rule, num_drafts=2 if rule == "rrs" else 1)
    assert torch.equal(run(40, **kw), run(4096, **kw))


def test_past_the_window_it_is_refused():
    with pytest.raises(ValueError, match="20-token sliding window"):
        run(20, rule="block")
