"""Every input ``coupling.hf.generate`` cannot run exactly gets a clear error."""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor
from transformers.generation.streamers import BaseStreamer

import coupling.hf
from coupling import Tree
from tests.hf_helpers import (  # noqa: F401 (one_thread: an autouse fixture)
    PAD,
    one_thread,
    speculative,
    tiny_llama,
)

PROMPT = [[3, 4, 5]]


class Silent(BaseStreamer):
    def put(self, value):
        pass

    def end(self):
        pass


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1)


def run(models, draft=None, prompts=PROMPT, **kwargs):
    target, default_draft = models
    kwargs.setdefault("max_new_tokens", 4)
    return speculative(target, default_draft if draft is None else draft, prompts, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rule="nope"), r"rule=: unknown rule 'nope'; known rules: token, block"),
    (dict(rule="rss"), r"unknown rule 'rss' \(did you mean 'rrs'\?\)"),
    (dict(rule="token_no_residual"), "unknown rule 'token_no_residual'; known rules"),
    (dict(rule="typical"), "rule='typical' is not a lossless verification rule"),
    (dict(rule=3), "rule=: unknown rule 3"),
    (dict(gamma=0), "gamma must be a positive integer"),
    (dict(gamma=-2), "gamma must be a positive integer"),
    (dict(gamma=1.5), "gamma must be a positive integer"),
    (dict(gamma=True), "gamma must be a positive integer"),
    (dict(num_drafts=0), "num_drafts must be a positive integer"),
    (dict(num_drafts=True), "num_drafts must be a positive integer"),
    (dict(rule="token", num_drafts=2), r"token takes one draft \(k = 1\)"),
    (dict(rule="block", num_drafts=2), r"block takes one draft \(k = 1\)"),
    (dict(rule="gumbel", num_drafts=2), r"gumbel takes one draft \(k = 1\)"),
    (dict(rule="kseq", num_drafts=2, replacement=False), "i.i.d. drafts"),
    (dict(rule="rrs", num_drafts=300), "exceeds MAX_DRAFTS"),
    (dict(rule="rrs", num_drafts=2, replacement="no"), "replacement must be True"),
    (dict(seed=-1), r"seed=-1 must lie in \[0, 2\*\*63\)"),
    (dict(seed=[1, 2]), r"one int per row \(shape \[1\]\)"),
    (dict(seed=[-4]), "seeds must be non-negative"),
    (dict(seed=1.5), "seed must be an int"),
    (dict(seed=True), "seed must be an int"),
    (dict(rule="rrs", tree=Tree.from_branching([2]), num_drafts=2), "leave num_drafts out"),
    (dict(rule="block", tree=Tree.from_branching([2, 2])), "Tree.from_chains"),
    (dict(rule="rrs", tree=Tree.named("medusa", size=4)), "drafter-invariant"),
    (dict(rule="gumbel", tree=Tree.from_branching([2, 2])), "keyed noise"),
    (dict(rule="rrs", tree=Tree.from_branching([2, 150])), "at most 256"),
])
def test_bad_method_parameters(models, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run(models, **kwargs)


def test_a_tree_that_is_no_tree(models):
    with pytest.raises(TypeError, match="coupling.Tree"):
        run(models, rule="rrs", tree=[2, 2])


@pytest.mark.parametrize("rule, k", [("rrs", 2), ("kseq", 2), ("optimal", 2), ("gumbel", 1),
                                     ("rrs", 1)])
def test_greedy_with_a_sampling_rule(models, rule, k):
    with pytest.raises(ValueError, match="do_sample=False asks for greedy decoding"):
        run(models, do_sample=False, rule=rule, num_drafts=k)


def test_a_draft_with_another_vocabulary(models):
    with pytest.raises(ValueError, match="the draft's vocabulary has 12 tokens and the target's "
                                         "16: pass tokenizers="):
        run(models, draft=tiny_llama(1, vocab=12))


def test_no_draft(models):
    target, _ = models
    with pytest.raises(ValueError, match="pass assistant_model=draft"):
        target.generate(torch.tensor(PROMPT), custom_generate=coupling.hf.generate,
                        do_sample=True, max_new_tokens=3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(use_cache=False), "needs a KV cache for the target"),
    (dict(cache_implementation="static"), "the target's cache is a StaticCache"),
])
def test_a_model_without_a_dynamic_cache(models, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run(models, **kwargs)


def test_a_draft_whose_forward_takes_no_cache(models):
    _, draft = models

    class NoCache(torch.nn.Module):
        config, device = draft.config, draft.device

        def forward(self, input_ids, attention_mask=None):  # pragma: no cover - never called
            raise AssertionError

    with pytest.raises(ValueError, match="NoCache.forward takes no cache argument"):
        run(models, draft=NoCache())


@pytest.mark.parametrize("kwargs, match", [
    (dict(prefix_allowed_tokens_fn=lambda b, ids: [1, 2, 3]),
     "PrefixConstrainedLogitsProcessor cannot be applied identically"),
    (dict(guidance_scale=1.5),
     "UnbatchedClassifierFreeGuidanceLogitsProcessor cannot be applied identically"),
    (dict(logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(
        1.2, prompt_ignore_length=torch.tensor([0, 1]))])),
     r"prompt_ignore_length has shape \(2,\), not one entry per batch row \(1\)"),
])
def test_processors_that_cannot_be_applied_identically(models, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run(models, **kwargs)


def test_distinct_first_drafts_need_that_many_tokens(models):
    with pytest.raises(ValueError, match="3 distinct first tokens, but the draft's processed law "
                                         "has only 2"):
        run(models, rule="rrs", num_drafts=3, replacement=False, top_k=2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_beams=2), "num_beams=2"),
    (dict(output_attentions=True, return_dict_in_generate=True),
     "does not return attentions or hidden states"),
    (dict(streamer=Silent()), "stream with batch size 1"),
])
def test_unsupported_generate_options(models, kwargs, match):
    with pytest.raises(ValueError, match=match):
        run(models, prompts=[[3, 4, 5], [6, 7]], **kwargs)


def test_right_padding(models):
    target, draft = models
    ids = torch.tensor([[3, 4, 5], [6, 7, PAD]])
    with pytest.raises(ValueError, match="padding_side='left'"):
        target.generate(ids, attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
                        assistant_model=draft, custom_generate=coupling.hf.generate,
                        do_sample=True, max_new_tokens=3)


def test_called_outside_generate(models):
    target, draft = models
    with pytest.raises(TypeError, match="custom_generate=coupling.hf.generate"):
        coupling.hf.generate(target, torch.tensor(PROMPT), assistant_model=draft)
