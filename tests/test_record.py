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
    cost = profile(target, E.ModelDrafter(draft), [1, 2, 3, 4], sizes=[1, 3, 9], repeats=2)
    assert set(cost["target_ms"]) == {"1", "3", "9"} and cost["draft_ms"] > 0
    assert cost["step_overhead_ms"] > 0
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(cost))
    loaded = Cost.load(str(path))
    assert loaded.call(1) == pytest.approx(cost["target_ms"]["1"])
    assert loaded.step(Tree.from_branching([2])) == pytest.approx(
        cost["target_ms"]["3"] + cost["draft_ms"] + cost["step_overhead_ms"])
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a cost table"):
        Cost.load(str(path))
