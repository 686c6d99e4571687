"""``generate(custom_generate=coupling.hf.generate)`` on tiny random Llama models: batches,
seeds, greedy decoding, processors, stopping, streaming, the output dict, the Hub folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

import coupling.hf
from coupling import Tree
from coupling.torch_backend import gumbel_noise
from tests.hf_helpers import (  # noqa: F401 (one_thread: an autouse fixture)
    PAD,
    left_pad,
    one_thread,
    speculative,
    tiny_llama,
)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[3, 4, 5, 6, 7], [9, 10], [11, 12, 13]]
SAMPLING = dict(temperature=1.2, top_k=10, top_p=0.95)
METHODS = [
    dict(rule="token", gamma=3),
    dict(rule="block", gamma=3),
    dict(rule="kseq", num_drafts=2, gamma=2),
    dict(rule="rrs", num_drafts=3, gamma=2, replacement=False),
    dict(rule="optimal", num_drafts=2, gamma=2),
    dict(rule="gumbel", gamma=3),
    dict(rule="rrs", tree=Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])),
]


def method_id(m: dict) -> str:
    return "-".join(f"{v.size}-node-tree" if isinstance(v, Tree) else str(v) for v in m.values())


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1)


def generated(out: torch.Tensor, prompts: list[list[int]] | int) -> list[list[int]]:
    """Each row's generated tokens (after the padded prompt)."""
    width = prompts if isinstance(prompts, int) else max(len(p) for p in prompts)
    return out[:, width:].tolist()


@pytest.mark.parametrize("method", METHODS, ids=method_id)
def test_rows_of_a_padded_batch_equal_batch_size_one(models, method):
    """Left-padded rows of different lengths accept different numbers of drafts per step; each
    row's tokens and statistics equal those of the row alone under its seed (the repetition
    penalty ignores each row's padding, as plain ``generate`` has it do)."""
    target, draft = models
    seeds = [5, 6, 7]
    kw = dict(max_new_tokens=12, repetition_penalty=1.2, return_dict_in_generate=True)
    out = speculative(target, draft, PROMPTS, seed=seeds, **kw, **SAMPLING, **method)
    assert len(set(out.num_accepted_tokens.tolist())) > 1
    for b, prompt in enumerate(PROMPTS):
        one = speculative(target, draft, [prompt], seed=[seeds[b]], **kw, **SAMPLING, **method)
        assert generated(one.sequences, [prompt])[0] == generated(out.sequences, PROMPTS)[b]
        assert one.num_steps.item() == out.num_steps[b].item()
        assert one.num_accepted_tokens.item() == out.num_accepted_tokens[b].item()


def test_an_int_seed_gives_each_row_its_own_seed(models):
    """``seed=s`` is ``seed=row_seeds(s, B)``; identical prompts then continue differently,
    and a row does not depend on the rows after it."""
    target, draft = models
    kw = dict(max_new_tokens=8, rule="block", gamma=2, **SAMPLING)
    out = speculative(target, draft, [[3, 4, 5]] * 3, seed=9, **kw)
    assert out.tolist() == speculative(target, draft, [[3, 4, 5]] * 3,
                                       seed=coupling.hf.row_seeds(9, 3), **kw).tolist()
    assert len({tuple(r) for r in out.tolist()}) == 3
    assert speculative(target, draft, [[3, 4, 5]] * 2, seed=9, **kw).tolist() == out[:2].tolist()


def test_seeded_runs_repeat_and_seed_none_follows_torch_manual_seed(models):
    target, draft = models
    kw = dict(max_new_tokens=10, rule="kseq", num_drafts=2, gamma=2, **SAMPLING)
    a = speculative(target, draft, PROMPTS, seed=1, **kw)
    assert torch.equal(a, speculative(target, draft, PROMPTS, seed=1, **kw))
    assert not torch.equal(a, speculative(target, draft, PROMPTS, seed=2, **kw))
    torch.manual_seed(4)
    b = speculative(target, draft, PROMPTS, **kw)
    torch.manual_seed(4)
    assert torch.equal(b, speculative(target, draft, PROMPTS, **kw))


@pytest.mark.parametrize("rule", ["token", "block"])
def test_greedy_verification_is_greedy_decoding(models, rule):
    """``do_sample=False``: point-mass laws; the output is plain greedy ``generate``'s, with a
    sequence processor in the loop."""
    target, draft = models
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        plain = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=12, repetition_penalty=1.5)
        ours = speculative(target, draft, [prompt], do_sample=False, max_new_tokens=12,
                           repetition_penalty=1.5, rule=rule, gamma=3)
        assert ours.tolist() == plain.tolist()


def test_gumbel_is_drafter_invariant_plain_gumbel_sampling(models):
    """Under one seed ``gumbel`` emits ``argmax(log p_t + G(seed, t))`` at every position
    ``t``, whatever the draft: here with another model, and with the target as its own draft."""
    target, draft = models
    seed = 123
    seq = [3, 4, 5, 6]
    with torch.no_grad():
        for _ in range(10):
            logits = target(torch.tensor([seq])).logits[0, -1] / SAMPLING["temperature"]
            kth = logits.topk(SAMPLING["top_k"]).values[-1]
            p = torch.softmax(logits.masked_fill(logits < kth, -torch.inf), -1).double()
            G = gumbel_noise(torch.tensor(seed), torch.tensor(len(seq)), p.numel(),
                             dtype=torch.float64)
            seq.append(int((p.log() + G).argmax()))
    for d in (draft, target):
        out = speculative(target, d, [[3, 4, 5, 6]], seed=[seed], max_new_tokens=10,
                          rule="gumbel", gamma=3, temperature=SAMPLING["temperature"],
                          top_k=SAMPLING["top_k"])
        assert out[0].tolist() == seq


@pytest.mark.parametrize("method", [dict(rule="token"), dict(rule="block"),
                                    dict(rule="rrs", num_drafts=2)], ids=method_id)
def test_processors_see_the_drafted_prefix_on_both_sides(models, method):
    """With the target as its own draft, ``q = p`` exactly when both laws are computed from the
    same sequence, drafted prefix included; then every draft is accepted. A repetition
    penalty of 3 changes the law of each position after each drafted token, so computing
    either side without the drafts would reject some."""
    target, _ = models
    out = speculative(target, target, PROMPTS, seed=3, max_new_tokens=16, gamma=3,
                      repetition_penalty=3.0, no_repeat_ngram_size=3, return_dict_in_generate=True,
                      **SAMPLING, **method)
    assert torch.equal(out.num_accepted_tokens, out.num_steps * 3)
    assert (out.mean_acceptance_length[out.num_steps > 0] == 4.0).all()


def test_a_user_processor_is_applied_to_both_models(models):
    """A row-wise processor of the user's own: banned tokens never appear, and with the target
    as its own draft every draft is accepted."""

    class Ban(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores.index_fill(1, torch.tensor([5, 7, 8]), -torch.inf)

    target, draft = models
    for d, full in ((draft, False), (target, True)):
        out = speculative(target, d, PROMPTS, seed=2, max_new_tokens=16, rule="block", gamma=3,
                          logits_processor=LogitsProcessorList([Ban()]),
                          return_dict_in_generate=True, **SAMPLING)
        new = out.sequences[:, 5:]
        assert not torch.isin(new, torch.tensor([5, 7, 8])).any()
        assert torch.equal(out.num_accepted_tokens, out.num_steps * 3) == full


def test_statistics_and_scores(models):
    target, draft = models
    out = speculative(target, draft, PROMPTS, seed=8, max_new_tokens=14, rule="rrs",
                      num_drafts=2, gamma=3, return_dict_in_generate=True, output_scores=True,
                      output_logits=True, **SAMPLING)
    assert isinstance(out, coupling.hf.SpeculativeDecoderOnlyOutput)
    assert out.sequences.shape == (3, 5 + 14) and out.cache is None
    assert torch.equal(out.num_accepted_tokens, out.num_accepted_tokens_per_pos.sum(1))
    assert torch.equal(out.num_draft_tokens, out.num_steps * 2 * 3)
    assert torch.allclose(out.mean_acceptance_length,
                          1 + out.num_accepted_tokens.double() / out.num_steps)
    per_pos = out.num_accepted_tokens_per_pos
    assert (per_pos[:, :-1] >= per_pos[:, 1:]).all() and (per_pos[:, 0] <= out.num_steps).all()
    # every row emits >= 1 token per step, and steps stop once 14 tokens are out
    assert ((out.num_steps <= 14) & (out.num_steps + out.num_accepted_tokens >= 14)).all()
    assert len(out.scores) == len(out.logits) == 14
    plain = target.generate(torch.tensor([PROMPTS[0]]), do_sample=True, max_new_tokens=1,
                            return_dict_in_generate=True, output_scores=True,
                            output_logits=True, **SAMPLING)
    assert torch.allclose(out.scores[0][0], plain.scores[0][0], atol=1e-5)
    assert torch.allclose(out.logits[0][0], plain.logits[0][0], atol=1e-5)


def test_a_tree_of_chains_is_the_chain_loop_and_tree_statistics(models):
    """tree=Tree.from_chains(k, gamma) runs the chain loop, token for token; a tree of another
    shape counts its nodes as drafted tokens and its depth as positions, and emits at most
    depth + 1 tokens per step."""
    target, draft = models
    kw = dict(seed=[4, 5, 6], max_new_tokens=14, return_dict_in_generate=True, **SAMPLING)
    chains = speculative(target, draft, PROMPTS, rule="rrs", num_drafts=2, gamma=3, **kw)
    same = speculative(target, draft, PROMPTS, rule="rrs", tree=Tree.from_chains(2, 3), **kw)
    assert torch.equal(chains.sequences, same.sequences)
    assert torch.equal(chains.num_accepted_tokens, same.num_accepted_tokens)
    tree = Tree.named("eagle", size=10, children="iid")
    out = speculative(target, draft, PROMPTS, rule="rrs", tree=tree, **kw)
    assert out.num_accepted_tokens_per_pos.shape == (3, tree.depth)
    assert torch.equal(out.num_draft_tokens, out.num_steps * tree.size)
    assert torch.equal(out.num_accepted_tokens, out.num_accepted_tokens_per_pos.sum(1))
    assert (out.num_accepted_tokens <= out.num_steps * tree.depth).all()
    assert out.num_accepted_tokens_per_pos[:, 1].sum() > 0      # some step went two deep


class StopAfter(StoppingCriteria):
    """Stops a row once its last token is ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


@pytest.mark.parametrize("how", ["eos", "criteria"])
def test_rows_stop_at_the_first_stop_token_mid_block(models, how):
    """A step emits several tokens; each is checked as plain ``generate`` checks it, so a row
    ends right after its first stop token, the tokens before it are those of the run without
    the stop, and the row is padded after it."""
    target, draft = models
    kw = dict(seed=[1, 2, 3], max_new_tokens=20, rule="block", gamma=4, **SAMPLING)
    free = generated(speculative(target, draft, PROMPTS, **kw), PROMPTS)
    stop = max((t for row in free for t in row), key=lambda t: sum(t in row for row in free))
    extra = (dict(eos_token_id=stop, pad_token_id=PAD) if how == "eos"
             else dict(stopping_criteria=[StopAfter(stop)]))
    cut = generated(speculative(target, draft, PROMPTS, **kw, **extra), PROMPTS)
    stopped = 0
    for row_free, row_cut in zip(free, cut, strict=True):
        n = row_free.index(stop) + 1 if stop in row_free else len(row_free)
        stopped += n < len(row_free)
        assert row_cut[:n] == row_free[:n]
        assert all(t == PAD for t in row_cut[n:])
    assert stopped >= 1


def test_one_token_prompts(models):
    """A row whose prompt is one real token (nothing to prefill), alone and in a batch."""
    target, draft = models
    kw = dict(max_new_tokens=6, rule="block", gamma=2, **SAMPLING)
    alone = speculative(target, draft, [[5]], seed=[1], **kw)
    batch = speculative(target, draft, [[5], [6, 7, 8]], seed=[1, 2], **kw)
    assert alone.shape == (1, 7)
    assert generated(batch, [[5], [6, 7, 8]])[0] == alone[0, 1:].tolist()


def test_max_new_tokens_is_exact(models):
    target, draft = models
    for n in (1, 2, 7):
        out = speculative(target, draft, PROMPTS, seed=0, max_new_tokens=n, rule="block",
                          gamma=4, **SAMPLING)
        assert out.shape == (3, 5 + n)


class Recorder(BaseStreamer):
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("method", [dict(rule="block", gamma=3),
                                    dict(rule="kseq", num_drafts=2, gamma=2)], ids=method_id)
def test_streamer_gets_the_prompt_then_each_steps_tokens(models, method):
    target, draft = models
    rec = Recorder()
    out = speculative(target, draft, [PROMPTS[0]], seed=[4], max_new_tokens=13, streamer=rec,
                      return_dict_in_generate=True, **SAMPLING, **method)
    assert rec.puts[0] == PROMPTS[0] and rec.ended == 1
    assert sum(rec.puts[1:], []) == out.sequences[0, 5:].tolist()
    assert len(rec.puts) - 1 == out.num_steps.item()
    assert all(1 <= len(p) <= method["gamma"] + 1 for p in rec.puts[1:])


def test_the_hub_folder_runs_the_same_method(models):
    """``custom_generate/`` at the repository root, loaded as a local Hub repository: the same
    tokens as the callable, and the streamer and the draft reach the loop through it."""
    target, draft = models
    kw = dict(assistant_model=draft, do_sample=True, max_new_tokens=10, rule="kseq",
              num_drafts=2, gamma=2, **SAMPLING)
    ids, mask = left_pad(PROMPTS)
    hub = target.generate(ids, attention_mask=mask, custom_generate=str(ROOT),
                          trust_remote_code=True, seed=[5, 6, 7], **kw)
    assert torch.equal(hub, target.generate(ids, attention_mask=mask, seed=[5, 6, 7],
                                            custom_generate=coupling.hf.generate, **kw))
    rec = Recorder()
    one = target.generate(torch.tensor([PROMPTS[1]]), custom_generate=str(ROOT),
                          trust_remote_code=True, seed=[6], streamer=rec, **kw)
    assert one[0].tolist() == PROMPTS[1] + generated(hub, PROMPTS)[1]
    assert sum(rec.puts[1:], []) == one[0, 2:].tolist()


# ----------------------------------------------------------------------------- shared noise
SHARED_NOISE_RULES = [name for name, r in coupling.rules.RULES.items() if r.shared_noise]


@pytest.mark.parametrize("name", SHARED_NOISE_RULES)
def test_shared_noise_rules_draft_by_their_own_noise(name):
    """``coupling.hf`` drafts a shared-noise rule (``rule.shared_noise``) by that rule's keyed
    noise: the drafts are its twin's ``draft_branches`` bit for bit, and two different draft
    models agree on a branch as often as the Gumbel coupling's collision probability says
    (binomial, 5 sigma; each column of ``gls`` is a standard Gumbel vector). The control:
    drafting by keyed inverse-CDF uniforms, what ``gls`` got before it read the flag, agrees
    0.2 of the time on these laws and fails the same test."""
    from coupling.hf.drafting import draw
    from coupling.hf.options import check_options
    from coupling.torch_backend import sample_rows, uniforms

    rule = coupling.rules.RULES[name]
    k = 1 if rule.max_drafts == 1 else 3
    opts = check_options(name, k, 2, True, True)
    B = 4000
    q1, q2 = (torch.tensor(w, dtype=torch.float64) for w in ([.4, .3, .2, .1], [.1, .2, .3, .4]))
    seeds, starts = torch.arange(B), 7 * torch.arange(B)
    x1, x2 = (draw(q.expand(B * k, 4), 1, opts, None, seeds, starts) for q in (q1, q2))
    want = rule.torch.draft_branches(q1.expand(B, k, 4), seeds, starts + 1).reshape(-1)
    assert torch.equal(x1, want)
    collision = coupling.rules.RULES["gumbel"].acceptance(q1.numpy(), q2.numpy())
    band = 5 * (collision * (1 - collision) / (B * k)) ** 0.5

    def agree(a, b):
        return float((a == b).double().mean())

    assert abs(agree(x1, x2) - collision) < band
    u = uniforms(seeds, starts, k).reshape(-1)
    control = agree(sample_rows(q1.expand(B * k, 4), u),
                    sample_rows(q2.expand(B * k, 4), u))
    assert abs(control - collision) > band
