"""``coupling record`` on tiny random Llama models: the tree traces it writes hold, at every
call, a superset tree drafted from the draft's laws and both laws at every node, and the
planner's evaluation of the whole superset under ``rrs`` is the engine's own exact
prediction of those calls."""

from __future__ import annotations

import numpy as np
import pytest

from coupling import Tree
from coupling.llm import engine as E
from coupling.llm.record import record
from coupling.llm.sampling import SamplingConfig
from coupling.sequence.traces import TreeTraces, call_tokens, tokens_per_call
from tests.llm_helpers import tiny_pair


@pytest.fixture(scope="module")
def pair():
    yield from tiny_pair()


def test_recorded_traces_are_the_engine_runs_laws(pair, tmp_path):
    target, draft = pair
    cfg = SamplingConfig(1.0, top_k=4)
    traces = record(target, E.ModelDrafter(draft), [[1, 2, 3], [4, 5]], width=2, depth=2,
                    max_new_tokens=12, cfg=cfg, seed=3)
    assert traces.superset == Tree.from_branching([2, 2])
    assert set(traces.context.tolist()) == {0, 1} and traces.calls >= 8
    # laws: rows sum to 1 on the recorded support, a drafted token has q > 0 at its parent
    for law in (traces.p, traces.q):
        assert np.allclose(law.sum(-1), 1.0, atol=1e-5)
    for s in range(traces.calls):
        ids = traces.idx[s]
        assert (np.diff(ids[ids >= 0]) > 0).all()
        for n, a in enumerate(traces.superset.parent):
            assert traces.q[s, a + 1, traces.drafts[s, n]] > 0
    traces.save(tmp_path / "t.npz")
    back = TreeTraces.load(tmp_path / "t.npz")
    assert back.header["sampling"] == cfg.as_dict() and back.header["vocab_size"] == 10
    values = call_tokens(back, "rrs", back.superset)
    assert ((values >= 1.0) & (values <= 3.0)).all()
    est = tokens_per_call(back, "rrs", Tree.from_branching([2, 1]))
    assert 1.0 <= est.low <= est.mean <= est.high <= 3.0


def test_the_whole_superset_is_worth_what_the_engine_predicted(pair):
    """Recorded with the same seed as an engine run of rrs on the superset itself, each
    call's value is the engine step's exact prediction."""
    target, draft = pair
    cfg = SamplingConfig(1.0, top_k=4)
    tree = Tree.from_branching([2, 2])
    traces = record(target, E.ModelDrafter(draft), [[1, 2, 3]], width=2, depth=2,
                    max_new_tokens=10, cfg=cfg, seed=5)
    run = E.generate(target, E.ModelDrafter(draft), [1, 2, 3], max_new_tokens=10, rule="rrs",
                     cfg=cfg, seed=5, tree=tree, predict=True)
    predicted = [s.predicted for s in run.steps]
    got = call_tokens(traces, "rrs", tree)
    assert len(got) == len(predicted)
    np.testing.assert_allclose(got, predicted, atol=1e-5)


def test_profile_writes_the_cost_table_plan_reads(pair, tmp_path):
    import json

    from coupling.llm.record import profile
    from coupling.planner import Cost

    target, draft = pair
    cost = profile(target, E.ModelDrafter(draft), [1, 2, 3, 4], sizes=[1, 3, 9], repeats=2,
                   rules=("rrs",), batches=(2,))
    assert set(cost["target_ms_batch"]) == set(cost["draft_ms_batch"]) == {"2"}
    assert set(cost["target_ms"]) == set(cost["draft_ms"]) == {"1", "3", "9"}
    assert min(cost["draft_ms"].values()) > 0
    over = cost["step_overhead_ms"]
    assert set(over) == {"rrs"} and set(over["rrs"]) == {"2", "3", "9", "12", "39"}
    assert min(over["rrs"].values()) > 0
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(cost))
    loaded = Cost.load(str(path))
    assert loaded.call(1) == pytest.approx(cost["target_ms"]["1"])
    # "3,3": the target on 13 tokens, the draft on the accepted text (1) and on level 1 (3)
    tree = Tree.from_spec("3,3")
    t, d = cost["target_ms"], cost["draft_ms"]
    assert loaded.step(tree, "rrs") == pytest.approx(
        float(np.interp(13, [1, 3, 9], [t["1"], t["3"], t["9"]])) + d["1"] + d["3"]
        + over["rrs"]["12"])
    assert loaded.step(tree, "traversal") == loaded.step(tree, "rrs")   # rrs's, the first
    two = loaded.at_batch(2)
    assert two.call(3) == pytest.approx(cost["target_ms_batch"]["2"]["3"])
    assert two.overhead("rrs", 12) == pytest.approx(2 * over["rrs"]["12"])
    assert loaded.at_batch(1) is loaded
    with pytest.raises(ValueError, match="--batches 4"):
        loaded.at_batch(4)
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a cost table"):
        Cost.load(str(path))


# ------------------------------------------------------------------ any pair of local folders
def _save_pair(target, draft, root, draft_words=None):
    """The tiny pair as two Hugging Face folders with a 10-word tokenizer (``w0`` .. ``w9``);
    ``draft_words``: give the draft a tokenizer of other words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    def tokenizer(words):
        tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
        tk.pre_tokenizer = pre_tokenizers.Whitespace()
        return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=words[0],
                                       eos_token=words[-1])

    words = [f"w{i}" for i in range(10)]
    for model, name, ws in ((target, "t", words), (draft, "d", draft_words or words)):
        model.save_pretrained(root / name)
        tokenizer(ws).save_pretrained(root / name)
    return str(root / "t"), str(root / "d")


def test_record_and_profile_any_local_pair(pair, tmp_path, capsys):
    import json

    from coupling.llm.pairs import read_prompts
    from coupling.llm.record import main, profile_main

    t_dir, d_dir = _save_pair(*pair, tmp_path)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\n\nw4 w5\n")
    assert read_prompts(prompts) == ["w1 w2 w3", "w4 w5"]
    out = tmp_path / "t.npz"
    args = ["--target", t_dir, "--draft", d_dir, "--prompt-file", str(prompts), "--no-chat"]
    assert main([*args, "--prompts", "2", "--tokens", "4", "--width", "2", "--depth", "2",
                 "--top-k", "4", "--out", str(out)]) == 0
    traces = TreeTraces.load(out)
    assert traces.header["models"] == {"target": t_dir, "draft": d_dir}
    assert set(traces.context.tolist()) == {0, 1}
    cost = tmp_path / "cost.json"
    assert profile_main([*args, "--sizes", "1,3", "--repeats", "1", "--context", "8",
                         "--out", str(cost)]) == 0
    data = json.loads(cost.read_text())
    assert data["models"] == traces.header["models"] and data["context_tokens"] == 8
    assert data["plain_overhead_ms"] > 0
    capsys.readouterr()


def test_record_refuses_a_draft_of_another_tokenizer(pair, tmp_path, capsys):
    from coupling.llm.pairs import load_pair, read_prompts
    from coupling.llm.record import main

    t_dir, d_dir = _save_pair(*pair, tmp_path, draft_words=[f"x{i}" for i in range(10)])
    assert main(["--target", t_dir, "--draft", d_dir, "--out", str(tmp_path / "t.npz")]) == 2
    assert "tokenizer differs" in capsys.readouterr().err
    with pytest.raises(ValueError, match="one of --draft DIR or --exit-layer"):
        load_pair(target=t_dir)
    with pytest.raises(ValueError, match="pair 'llama'"):
        load_pair("llama")
    bad = tmp_path / "bad.json"
    bad.write_text('{"prompts": [1, 2]}')
    with pytest.raises(ValueError, match="--prompt-file"):
        read_prompts(bad)
