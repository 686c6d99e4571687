"""``generate(custom_generate=coupling.hf.generate)`` on SmolLM2-135M with the trained draft.

float32: a verification call scores several tokens at once, and in bfloat16 its logits differ
from a one-token call's in the last bits, which would make exact token-for-token comparisons
depend on the CPU's kernels.
"""

from __future__ import annotations

import pytest
import torch

import coupling.hf
from coupling.llm import drafts, models
from tests.hf_helpers import fit_pvalue, one_thread, two_token_law  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    target = models.load_target("float32")
    return target, drafts.load_draft(target), models.load_tokenizer()


def test_smollm2_two_token_law_is_plain_sampling(smollm2):
    """96 rows of one prompt in one call, top-k = 2: the first two tokens take 4 values,
    whose exact law under plain ``generate`` is enumerated; chi-square at level 1e-3 (fixed
    seed), and no sample outside the support."""
    target, draft, tok = smollm2
    prompt = tok("The three primary colours are")["input_ids"]
    law = two_token_law(target, prompt, top_k=2)
    assert sum(v > 0.01 for v in law.values()) >= 3  # some spread, not one likely pair
    ids = torch.tensor([prompt] * 96)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                          custom_generate=coupling.hf.generate, do_sample=True, top_k=2,
                          max_new_tokens=2, rule="block", gamma=2, seed=0)
    assert fit_pvalue(out[:, len(prompt):], law) > 1e-3


def test_smollm2_padded_batch_rows_equal_batch_size_one(smollm2):
    """Two chat prompts of different lengths, left-padded, the demo's sampling settings and a
    repetition penalty: each row equals its batch-size-1 run, and the trained draft's tokens
    are accepted (more than one token per target call)."""
    target, draft, tok = smollm2
    prompts = [models.chat_prompt(tok, t) for t in ("Name a colour.",
                                                    "Write one sentence about the sea.")]
    tok.padding_side = "left"
    batch = tok.pad({"input_ids": prompts}, return_tensors="pt")
    kw = dict(assistant_model=draft, custom_generate=coupling.hf.generate, do_sample=True,
              temperature=0.7, top_k=50, top_p=0.95, repetition_penalty=1.1, max_new_tokens=20,
              rule="block", gamma=2, return_dict_in_generate=True)
    out = target.generate(**batch, seed=[3, 4], **kw)
    assert (out.mean_acceptance_length > 1.0).all()
    width = batch["input_ids"].shape[1]
    for b, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        one = target.generate(ids, attention_mask=torch.ones_like(ids), seed=[3 + b], **kw)
        row = out.sequences[b, width:].tolist()
        assert one.sequences[0, len(prompt):].tolist() == row[: one.sequences.shape[1]
                                                               - len(prompt)]
        assert one.num_accepted_tokens.item() == out.num_accepted_tokens[b].item()


def test_the_readme_hugging_face_example_runs_as_written(capsys):
    """The README's Hugging Face section, executed as written: both rows of the padded batch
    continue their own prompt and stop at the token budget or an end of text."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("## Inside Hugging Face `generate`"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", 10)]
    names: dict = {}
    exec(compile(code, "README.md", "exec"), names)
    out, batch = names["out"], names["batch"]
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 64
    printed = capsys.readouterr().out
    assert "The capital of France is" in printed and "def fibonacci(n):" in printed
