"""The feature draft's lean layer (:mod:`coupling.llm.feature_draft`): its cache and its
stacked int8 projections, against the Hugging Face body."""

from __future__ import annotations

import pytest
import torch

from coupling.llm import feature_draft as FD
from tests.llm_helpers import V, tiny_pair


@pytest.fixture(scope="module")
def pair():
    yield from tiny_pair()


def test_pair_cache_lean_layer_matches_the_hugging_face_body(pair):
    """The drafter's lean layer on a PairCache (appends of several pairs, crop, k-row
    expansion, row selection) reproduces the Hugging Face body run on the whole sequence."""
    target, _ = pair
    torch.manual_seed(3)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
        ids = torch.randint(0, V, (1, 12))
        f = torch.randn(1, 12, 16)
        ref = draft.features(ids, f)                                   # no cache: HF body
        c = FD.PairCache(capacity=4)                                   # forces regrowth
        parts = [draft.features(ids[:, a:b], f[:, a:b], c) for a, b in ((0, 5), (5, 6), (6, 9))]
        torch.testing.assert_close(torch.cat(parts, 1), ref[:, :9], atol=1e-5, rtol=1e-5)
        c.crop(-2)                                                     # back to 7 pairs
        c.batch_repeat_interleave(3)
        out = draft.features(ids[:, 7:8].expand(3, -1), f[:, 7:8].expand(3, -1, -1), c)
        torch.testing.assert_close(out, ref[:, 7:8].expand(3, -1, -1), atol=1e-5, rtol=1e-5)
        c.batch_select_indices(torch.tensor([2]))
        out = draft.features(ids[:, 8:12], f[:, 8:12], c)
        torch.testing.assert_close(out, ref[:, 8:12], atol=1e-5, rtol=1e-5)
        assert c.get_seq_length() == 12
    with pytest.raises(ValueError, match="negative"):
        c.crop(2)


def test_lean_layer_stacked_int8_projections_are_bit_identical(pair):
    """FeatureDraft.quantize_int8 stacks q/k/v and gate/up into one int8 matrix each for the
    lean path (per-row scales: the stacked rows quantize as they do apart); the features are
    those of the seven separate int8 projections, bit for bit."""
    target, _ = pair
    torch.manual_seed(5)
    draft = FD.FeatureDraft(target).eval()
    with torch.no_grad():
        draft.fc.weight.normal_(0, 0.3)
    draft.quantize_int8()
    assert draft.fused is not None and draft.fused_sizes == [
        m.out_features for m in (draft.body.layers[0].self_attn.q_proj,
                                 draft.body.layers[0].self_attn.k_proj,
                                 draft.body.layers[0].self_attn.v_proj)]
    ids, f = torch.randint(0, V, (1, 9)), torch.randn(1, 9, 16)
    outs = []
    for fused in (draft.fused, None):
        draft.fused = fused
        c = FD.PairCache()
        with torch.no_grad():
            outs.append(torch.cat([draft.features(ids[:, :6], f[:, :6], c)]
                                  + [draft.features(ids[:, i:i + 1], f[:, i:i + 1], c)
                                     for i in range(6, 9)], 1))
    assert torch.equal(outs[0], outs[1])


