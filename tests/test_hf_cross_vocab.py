"""``coupling.hf.generate`` with an assistant of another tokenizer (``tokenizers=``): tiny
Llamas over the toy tokenizers of :mod:`coupling.vocab` (target ``a b c ab bc``, assistant
``a b c ca``), as Hugging Face tokenizers.

Lossless: the first two generated tokens have plain ``generate(do_sample=True)``'s exact law
(chi-square at level 1e-3 per case, fixed seeds), for rules that read the draft law and rules
that do not, with the shared pieces drafted (TLI) or the assistant's own tokens re-encoded
(SLEM); drafts drawn from ``q**3`` while ``q`` is reported, and re-encoded drafts verified as
if drawn from the uniform law, must fail.
Right: at every step the law the assistant drafted from is its law after the row's text
re-encoded (plus the pieces drafted before), on ragged batches whose re-encoding drops and
refeeds cached tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import coupling.hf
import coupling.hf.drafting as drafting
import coupling.hf.vocab as vocab
from coupling import Tree
from coupling.hf.vocab import shared_token_ids
from coupling.torch_backend import gumbel_noise
from coupling.vocab import shared_pieces, to_transformers, toy_tokenizers
from tests.hf_helpers import (  # noqa: F401 (one_thread: an autouse fixture)
    fit_pvalue,
    left_pad,
    one_thread,
    tiny_llama,
    two_token_law,
)

TARGET_TOK, DRAFT_TOK = toy_tokenizers()
PROMPT = [3, 2]                       # "abc": the assistant reads it as a, b, c
PROMPTS = [[3, 2], [0, 4, 1, 2], [2]]  # "abc", "abcbc", "c" (left-padded with 0)
SAMPLING = dict(temperature=0.9, top_k=4, repetition_penalty=1.2)
N = 4000
ALPHA = 1e-3
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def setup():
    target = tiny_llama(0, vocab=TARGET_TOK.size, init=0.5)
    assistant = tiny_llama(1, vocab=DRAFT_TOK.size, init=0.5)
    tokenizers = (to_transformers(TARGET_TOK), to_transformers(DRAFT_TOK))
    return target, assistant, tokenizers, two_token_law(target, PROMPT, **SAMPLING)


def run(setup, ids, **kwargs):
    target, assistant, tokenizers, _ = setup
    if isinstance(ids, list):
        ids, kwargs["attention_mask"] = left_pad(ids)
    kwargs.setdefault("attention_mask", torch.ones_like(ids))
    kwargs.setdefault("do_sample", True)
    return target.generate(ids, assistant_model=assistant, custom_generate=coupling.hf.generate,
                           tokenizers=tokenizers, **kwargs)


def first_two(setup, **method) -> torch.Tensor:
    out = run(setup, torch.tensor([PROMPT] * N), max_new_tokens=2, seed=5, **SAMPLING, **method)
    return out[:, len(PROMPT):]


def test_shared_pieces_are_the_packages():
    tokenizers = to_transformers(TARGET_TOK), to_transformers(DRAFT_TOK)
    d, t = shared_token_ids(*tokenizers)
    assert dict(zip(d.tolist(), t.tolist(), strict=True)) == shared_pieces(TARGET_TOK, DRAFT_TOK)


@pytest.mark.parametrize("rule, proposal", [
    ("token", "intersection"), ("block", "intersection"), ("strict", "intersection"),
    ("gumbel", "intersection"), ("traversal", "intersection"),
    ("strict", "retokenized"), ("token", "retokenized"), ("block", "retokenized")])
def test_output_has_plain_sampling_law(setup, rule, proposal):
    pairs = first_two(setup, rule=rule, gamma=2, proposal=proposal)
    assert fit_pvalue(pairs, setup[3]) > ALPHA


def test_re_encoded_drafts_verified_against_a_law_they_were_not_drawn_from_fail(setup,
                                                                               monkeypatch):
    """The point masses are what makes re-encoded drafts lossless: reported as uniform draws,
    token verification accepts them far too often."""
    honest = vocab.retokenized_chain

    def uniform(*args):
        drafts, q = honest(*args)
        return drafts, torch.full_like(q, 1.0 / q.shape[-1])

    monkeypatch.setattr(coupling.hf.decode, "retokenized_chain", uniform)
    pairs = first_two(setup, rule="token", gamma=2, proposal="retokenized")
    assert fit_pvalue(pairs, setup[3]) < ALPHA


def test_re_encoded_candidates_continue_the_text():
    """The candidate is the drafted text's target tokens after the row's, its last dropped;
    padded by its last token (or the row's) where short."""
    ttok, dtok = to_transformers(TARGET_TOK), to_transformers(DRAFT_TOK)
    retok = vocab.Retokenizer((ttok, dtok), TARGET_TOK.size, DRAFT_TOK.size,
                              [[0], [3, 2]], torch.device("cpu"), "retokenized")
    ca, b = DRAFT_TOK.encode("ca")[0], DRAFT_TOK.encode("b")[0]
    # "a" + "bcab": "ab" merges with the row's "a", so the text is no continuation: padded
    assert retok.candidate(0, [b, ca, b], 3) == [0, 0, 0]
    # "abc" + "abcab" -> ab c | ab c ab: the candidate "ab c", the last "ab" dropped
    assert retok.candidate(1, [0, b, ca, b], 3) == [3, 2, 2]


def test_negative_control_q_not_the_drafting_law_fails(setup, monkeypatch):
    honest = drafting.sample_rows
    monkeypatch.setattr(drafting, "sample_rows", lambda w, u: honest(w**3, u))
    assert fit_pvalue(first_two(setup, rule="token", gamma=2), setup[3]) < ALPHA


@torch.no_grad()
def assistant_law(assistant, tokenizers, context: list[int], drafted: list[int]) -> np.ndarray:
    """The assistant's law over target ids after the text of ``context`` and the drafted
    shared pieces ``drafted`` (target ids), computed afresh, restricted and renormalised."""
    ttok, dtok = tokenizers
    ids = dtok(ttok.decode(context)).input_ids + [DRAFT_TOK.pieces.index(TARGET_TOK.pieces[x])
                                                 for x in drafted]
    q = torch.softmax(assistant(torch.tensor([ids])).logits[0, -1].double(), -1).numpy()
    out = np.zeros(TARGET_TOK.size)
    for j, i in shared_pieces(TARGET_TOK, DRAFT_TOK).items():
        out[i] = q[j]
    return out / out.sum()


def test_the_assistant_drafts_from_its_law_after_the_re_encoded_text(setup, monkeypatch):
    """A ragged batch, 12 tokens, gamma 3: every draft law equals the assistant's law computed
    afresh (so the cache kept, dropped and refed the right tokens)."""
    target, assistant, tokenizers, _ = setup
    seen = []
    honest = drafting.draft_tree

    def record(*args, **kwargs):
        chains = honest(*args, **kwargs)
        ext, cur, rows = args[4], args[5], args[6]
        seen.append((ext.clone(), cur.clone(), rows.clone(), chains.drafts.clone(),
                     chains.q.clone()))
        return chains

    monkeypatch.setattr(drafting, "draft_tree", record)
    monkeypatch.setattr(coupling.hf.decode, "draft_tree", record)
    pad = [4 - len(p) for p in PROMPTS]            # left padding
    run(setup, PROMPTS, max_new_tokens=12, seed=[1, 2, 3], rule="token", gamma=3)
    assert len(seen) >= 4
    checked = 0
    for ext, cur, rows, drafts, q in seen:
        for r in range(ext.shape[0]):                  # rows that stopped have left
            context = ext[r, pad[rows[r]]:cur[r]].tolist()
            for i in range(drafts.shape[2]):
                want = assistant_law(assistant, tokenizers, context, drafts[r, 0, :i].tolist())
                got = q[r, 0, i].double().numpy()
                assert np.abs(got - want).max() < 1e-5, (r, i)
                checked += 1
    assert checked >= 12


def test_the_hub_folder_takes_transformers_names(setup):
    """``custom_generate/`` takes ``tokenizer=`` and ``assistant_tokenizer=``: the same tokens
    as the callable with ``tokenizers=``."""
    target, assistant, tokenizers, _ = setup
    ids, mask = left_pad([[3, 2], [0, 4, 1, 2]])
    kw = dict(attention_mask=mask, max_new_tokens=8, seed=[7, 8], rule="block", gamma=2)
    hub = target.generate(ids, custom_generate=str(ROOT), trust_remote_code=True,
                          assistant_model=assistant, do_sample=True, tokenizer=tokenizers[0],
                          assistant_tokenizer=tokenizers[1], **kw)
    assert torch.equal(hub, run(setup, ids, **kw))
    kw.update(assistant_model=assistant, do_sample=True)
    with pytest.raises(ValueError, match="together"):
        target.generate(ids, custom_generate=str(ROOT), trust_remote_code=True,
                        tokenizer=tokenizers[0], **kw)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_drafts=2), ValueError, "one chain per row"),
    (dict(tree=Tree.from_branching([2])), ValueError, "one chain per row"),
    (dict(tokenizers=("a", "b")), TypeError, r"\(tokenizer, assistant_tokenizer\)"),
    (dict(proposal="strings"), ValueError, "choose one of"),
    (dict(tokenizers=None, proposal="retokenized"), ValueError, "another tokenizer"),
])
def test_refusals(setup, kwargs, error, match):
    target, assistant, tokenizers, _ = setup
    kw = dict(assistant_model=assistant, custom_generate=coupling.hf.generate, do_sample=True,
              max_new_tokens=2, rule="rrs", tokenizers=tokenizers)
    ids = torch.tensor([PROMPT])
    with pytest.raises(error, match=match):
        target.generate(ids, attention_mask=torch.ones_like(ids), **{**kw, **kwargs})


@pytest.mark.parametrize("rule", ["token", "block"])
def test_rows_of_a_padded_batch_equal_batch_size_one(setup, rule):
    """Each row's tokens and statistics equal the row's alone under its seed, though the
    assistant's feeds are ragged and its cache drops different tokens per row."""
    kw = dict(max_new_tokens=12, seed=[5, 6, 7], rule=rule, gamma=3,
              return_dict_in_generate=True, **SAMPLING)
    out = run(setup, PROMPTS, **kw)
    assert len(set(out.num_accepted_tokens.tolist())) > 1
    for b, prompt in enumerate(PROMPTS):
        one = run(setup, [prompt], **{**kw, "seed": [kw["seed"][b]]})
        assert one.sequences[0, len(prompt):].tolist() == out.sequences[b, 4:].tolist()
        assert one.num_accepted_tokens.item() == out.num_accepted_tokens[b].item()


def test_gumbel_across_vocabularies_is_plain_gumbel_sampling(setup):
    """Under one seed ``gumbel`` emits ``argmax(log p_t + G(seed, t))`` at every position,
    whatever the draft: here an assistant in another vocabulary."""
    target, _, _, _ = setup
    seed, seq = 9, [3, 2]
    with torch.no_grad():
        for _ in range(10):
            p = torch.softmax(target(torch.tensor([seq])).logits[0, -1].double(), -1)
            G = gumbel_noise(torch.tensor(seed), torch.tensor(len(seq)), p.numel(),
                             dtype=torch.float64)
            seq.append(int((p.log() + G).argmax()))
    out = run(setup, torch.tensor([[3, 2]]), seed=[seed], max_new_tokens=10, rule="gumbel",
              gamma=3, top_k=0)
    assert out[0].tolist() == seq


@pytest.mark.parametrize("proposal", ["intersection", "retokenized"])
def test_greedy_verification_across_vocabularies_is_greedy_decoding(setup, proposal):
    target, _, _, _ = setup
    ids, mask = left_pad(PROMPTS)
    plain = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    ours = run(setup, ids, attention_mask=mask, do_sample=False, max_new_tokens=10,
               rule="block", gamma=3, proposal=proposal)
    assert torch.equal(ours, plain)
