"""Tree attention on Gemma 3 270M (sliding-window layers): a tree call's logits are those of
each node's own path recomputed from scratch, inside the window, and a call past the window is
refused rather than silently attending too far."""

from __future__ import annotations

import pytest
import torch

from coupling.llm import models
from coupling.llm.cache import CachedLM, prefill, supports_tree, tree_positions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    model, tok = models.load_gemma("float32")
    return model, tok("Question: Name a colour.\nAnswer:")["input_ids"]


def _law(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].double().softmax(-1)


def test_gemma_tree_call_matches_each_path(gemma):
    model, prompt = gemma
    assert supports_tree(model) and tree_positions(model) == model.config.sliding_window
    lm = CachedLM(model)
    prefill(lm, prompt)
    a, b, c = 651, 1234, 777
    first = lm.forward_nodes([prompt[-1]], [a, b], [-1, -1]).double().softmax(-1)
    second = lm.forward_nodes([], [c], [0]).double().softmax(-1)       # a's child, a 2nd call
    paths = [prompt, prompt + [a], prompt + [b]]
    for row, ids in zip(first, paths, strict=True):
        assert 0.5 * (row - _law(model, ids)).abs().sum() < 1e-4
    assert 0.5 * (second[0] - _law(model, prompt + [a, c])).abs().sum() < 1e-4
    lm.select_path([1])                                                  # keep b
    after = lm.forward_nodes([], [5], [-1]).double().softmax(-1)
    assert 0.5 * (after[0] - _law(model, prompt + [b, 5])).abs().sum() < 1e-4


def test_gemma_tree_call_past_the_window_is_refused(gemma):
    model, prompt = gemma
    window = model.config.sliding_window
    model.config.sliding_window = len(prompt)          # the tree's node would sit past it
    try:
        lm = CachedLM(model)
        prefill(lm, prompt)
        with pytest.raises(ValueError, match="sliding window"):
            lm.forward_nodes([prompt[-1]], [5], [-1])
    finally:
        model.config.sliding_window = window
