"""Shared by the LLM tests: tiny random Llama models (tests/test_engine.py and the files beside
it) and the real SmolLM2 (tests/test_llm_real.py)."""

from __future__ import annotations

import torch

from coupling.llm.sampling import SamplingConfig, probs

V = 10


def tiny_llama(seed: int, layers: int = 2, scale: float = 1.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(scale * 40.0)  # random init is near-uniform; sharpen the laws
    return m


def tiny_pair():
    """A tiny target and a tiny draft (one layer) over one vocabulary of V tokens, with torch
    on one thread while they are in use (the test modules' ``pair`` fixture)."""
    # tiny matmuls: one thread avoids OpenMP spin contention on a shared 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_llama(0), tiny_llama(1, layers=1)
    torch.set_num_threads(n)


def int8_target(seed: int = 7):
    """A tiny target and a draft built on it, then the target quantized (the demo's order)."""
    from coupling.llm.drafts import DraftSpec, build_draft
    from coupling.llm.int8 import quantize_target_int8

    target = tiny_llama(seed, layers=2)
    draft = build_draft(target, DraftSpec(1, (1,)))
    return quantize_target_int8(target), draft


@torch.no_grad()
def fresh_next_logits(model, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq])).logits[0, -1].float()


def record_first_laws(drafter) -> list[tuple[list[int], torch.Tensor]]:
    """Wrap ``drafter.propose`` so each call appends (committed text, first drafted law [V])."""
    seen: list[tuple[list[int], torch.Tensor]] = []
    propose = drafter.propose

    def recording(seq, *a, **kw):
        t, q = propose(seq, *a, **kw)
        seen.append((list(seq), q[0, 0].double()))
        return t, q

    drafter.propose = recording
    return seen


@torch.no_grad()
def fresh_feature_law(target, draft, seq: list[int], cfg: SamplingConfig) -> torch.Tensor:
    """The feature draft's law of the token after ``seq``, recomputed from scratch: target
    features f_0..f_{L-2}, then the draft on the pairs (x_i, f_{i-1}), i = 1..L-1."""
    f = target(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[-1]
    fh = draft.features(torch.tensor([seq[1:]]), f)[:, -1]
    return probs(draft.logits(fh), cfg)[0].double()
