"""Loading real models (:mod:`coupling.llm.models`): the grouped-head attention every target
runs, and early exits; on tiny random Llama models."""

from __future__ import annotations

import pytest
import torch

from coupling.llm import engine as E
from coupling.llm import models
from tests.llm_helpers import tiny_llama


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_sdpa_is_bit_identical_to_sdpa_and_skips_the_kv_copy(dtype, monkeypatch):
    """models.GROUPED_SDPA gives the very logits of transformers' sdpa for every call the
    engine makes (prefill, 1 token, a 3-token verification, a tree row, a batch of branches),
    and its masked multi-token calls never expand the KV cache to every query head."""
    from transformers.integrations import sdpa_attention

    copies = 0
    repeat_kv = sdpa_attention.repeat_kv

    def counting_repeat_kv(x, n_rep):
        nonlocal copies
        copies += n_rep > 1
        return repeat_kv(x, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting_repeat_kv)
    plain, grouped = tiny_llama(5).to(dtype), models.use_grouped_sdpa(tiny_llama(5).to(dtype))
    assert plain.config._attn_implementation == "sdpa"
    assert grouped.config._attn_implementation == models.GROUPED_SDPA
    assert E.supports_tree(grouped)
    outs, kv_copies = [], []
    for model in (plain, grouped):
        copies = 0
        lm = E.CachedLM(model)
        E.prefill(lm, [1, 2, 3, 4, 5])
        got = [lm.forward(torch.tensor([[5]])), lm.forward(torch.tensor([[6, 7, 8]]))]
        flat, rows = lm.forward_tree([9], torch.tensor([[1, 2], [3, 4]]))
        got.append(flat[rows])
        lm.select_branch(1)
        lm.expand(2)
        got.append(lm.forward(torch.tensor([[1, 2, 3], [4, 5, 6]])))
        with torch.no_grad():
            got.append(model(torch.tensor([[3, 1, 4, 1, 5, 9]])).logits)      # no cache
        outs.append(got)
        kv_copies.append(copies)
    for a, b in zip(*outs, strict=True):
        assert a.dtype == dtype and torch.equal(a, b)
    assert kv_copies[0] > 0 and kv_copies[1] == 0
    assert models.use_grouped_sdpa(grouped) is grouped     # idempotent


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_sdpa_mask_is_sdpas_boolean_mask_made_additive_once(dtype):
    """The mask GROUPED_SDPA's layers get: 0 where transformers' sdpa mask says True, -inf where
    it says False (what the attention kernel made of the boolean mask in every layer), in the
    model's dtype; a mask sdpa skips stays None."""
    from transformers.masking_utils import sdpa_mask

    kw = dict(batch_size=1, q_length=3, kv_length=7, q_offset=4)
    want = sdpa_mask(**kw)
    got = models._additive_sdpa_mask(**kw, dtype=dtype)
    assert want.dtype == torch.bool and got.dtype == dtype and got.shape == want.shape
    assert torch.equal(got == 0, want) and torch.isneginf(got[~want]).all()
    assert models._additive_sdpa_mask(batch_size=1, q_length=3, kv_length=3,
                                      dtype=dtype) is None      # causal, no cache: skipped


def test_early_exit_is_the_first_layers_then_norm_and_head():
    """models.early_exit: the first L layers, the final norm, the head; every tensor shared."""
    target = tiny_llama(4, layers=3)
    ee = models.early_exit(target, 2)
    assert ee.model.layers[1] is target.model.layers[1] and ee.lm_head is target.lm_head
    assert all(p.device.type != "meta" for p in ee.parameters())
    assert all(b.device.type != "meta" for b in ee.buffers())
    ids = torch.tensor([[1, 4, 2, 7, 3]])
    with torch.no_grad():
        h = target(ids, output_hidden_states=True).hidden_states[2]   # after layer 2
        want = target.lm_head(target.model.norm(h))
        torch.testing.assert_close(ee(ids).logits, want)
    with pytest.raises(ValueError, match="n_layers"):
        models.early_exit(target, 3)
