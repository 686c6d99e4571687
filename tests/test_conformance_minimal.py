"""The smallest failing case of a lossy verifier: found smallest first, reproducible from its
script, and absent for a lossless one."""

from __future__ import annotations

import json

import numpy as np

from coupling.cli import main
from coupling.conformance import check_verifier, known_bugs, minimal_counterexample, model_pairs
from coupling.conformance.verifiers import from_rule


def test_the_smallest_case_comes_first_and_its_script_reproduces_it():
    """HF_RAW_Q loses only where q has zeros: the search skips every other pair and stops at
    the smallest q-zeros case; the script, run as printed, fails the same way."""
    from coupling.conformance.bugs import HF_RAW_Q

    ce = minimal_counterexample(HF_RAW_Q, vocab_size=3, gamma=2, exact=True, id_space=None)
    assert (ce.vocab_size, ce.gamma, ce.pair) == (2, 1, "q-zeros")
    assert ce.pair_index == [p.name for p in model_pairs(2)].index("q-zeros")
    assert ce.report.tv > 1e-3 and len(ce.strings) == 3
    observed, expected = np.array([s[1:] for s in ce.strings]).T
    assert 0.5 * np.abs(observed - expected).sum() <= ce.report.tv + 1e-12
    names: dict = {}
    exec(ce.script.replace("print(", "report = ("), names)        # noqa: S102
    assert not names["report"].ok and names["report"].tv == ce.report.tv
    assert "from coupling.conformance.bugs import HF_RAW_Q as verify" in ce.script
    assert "q-zeros" in str(ce) and "reproduce:" in str(ce)


def test_statistical_search_reports_counts_and_a_lossless_rule_has_none():
    bug = next(e.verifier for e in known_bugs() if e.key == "argmax_verifier")
    ce = minimal_counterexample(bug, vocab_size=3, gamma=2, draws=2000)
    assert (ce.vocab_size, ce.gamma) == (2, 1) and not ce.exact
    assert all(o == int(o) for _, o, _ in ce.strings)            # counts over the loops
    assert sum(o for _, o, _ in ce.strings) <= ce.report.pairs[0].draws
    assert minimal_counterexample(from_rule("token"), vocab_size=3, gamma=2,
                                  exact=True) is None


def test_the_cli_prints_the_smallest_case_on_a_failure(capsys):
    assert main(["conformance", "coupling.conformance.bugs:HF_RAW_Q", "--exact", "--gamma",
                 "2", "--id-space", "0", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["counterexample"]["pair"] == "q-zeros"
    assert "load('coupling.conformance.bugs:HF_RAW_Q')" in out["counterexample"]["script"]
    assert main(["conformance", "coupling.conformance.bugs:HF_RAW_Q", "--exact", "--gamma",
                 "2", "--no-minimize"]) == 1
    assert "smallest failing case" not in capsys.readouterr().out
    assert check_verifier(from_rule("token"), exact=True, gamma=2).ok
