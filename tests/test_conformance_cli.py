"""``coupling conformance MODULE:NAME``."""

from __future__ import annotations

import json

import pytest

from coupling.cli import main


def test_exact_failure_and_pass(capsys):
    small = ["--exact", "--gamma", "2", "--id-space", "0"]
    assert main(["conformance", "coupling.conformance.bugs:HF_RAW_Q", *small]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "q-zeros" in out
    assert main(["conformance", "coupling.conformance.bugs:HF_RAW_Q_FIXED", *small]) == 0
    assert "PASS" in capsys.readouterr().out


def test_json_statistical(capsys):
    code = main(["conformance", "coupling.conformance.bugs:ASCEND_BLOCK_VERIFY_FIXED",
                 "--draws", "300", "--gamma", "1", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"] and report["gamma"] == 1 and report["draws"] == 300
    assert len(report["pairs"]) == 6


def test_torch_flag(capsys):
    code = main(["conformance", "tests.test_conformance_cli:batched_token", "--torch",
                 "--draws", "300"])
    assert code == 0, capsys.readouterr().out


def test_engine_flags_reach_the_adapter(capsys):
    """--ragged, --greedy and --dtype wrap a padded engine-style verifier; a list of gammas
    is drawn from per request; --ragged without --torch is bad input."""
    ok = main(["conformance", "coupling.conformance.padded:padded_token_verifier", "--torch",
               "--ragged", "--greedy", "--dtype", "bfloat16", "--gamma", "1,3",
               "--draws", "512", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert ok == 0 and report["gamma"] == [1, 3] and report["length"] == 5
    assert all(r["greedy_loops"] > 0 for r in report["pairs"])
    assert main(["conformance", "coupling.conformance.padded:padded_bonus_from_last",
                 "--torch", "--ragged", "--draws", "512", "--no-minimize"]) == 1
    assert main(["conformance", "coupling.conformance.padded:padded_token_verifier",
                 "--ragged"]) == 2
    assert "--torch" in capsys.readouterr().err


def batched_token(drafts, p, q, generator):
    """The package's token twin as a user's batched verifier."""
    import torch

    from coupling import verify

    B = drafts.shape[0]
    return verify("token", drafts, p, q, seeds=torch.randint(0, 2**62, (B,), generator=generator),
                  positions=0)


@pytest.mark.parametrize("argv,match", [
    (["nomodule"], "MODULE:NAME"),
    (["no_such_module_xyz:f"], "cannot import"),
    (["coupling.conformance.bugs:NOPE"], "no attribute"),
    (["coupling.conformance.bugs:HF_RAW_Q", "--gamma", "0"], "gamma"),
])
def test_bad_input_exits_2(argv, match, capsys):
    assert main(["conformance", *argv]) == 2
    assert match in capsys.readouterr().err


RAISING_VERIFIER = '''
import numpy as np


def verify(drafts, p, q, rng):
    x = int(drafts[0, 0])
    if rng.random() * q[0, 0, x] < p[0, 0, x]:
        return [x]
    r = np.maximum(p[0, 0] - q[0, 0], 0)
    return [int(rng.choice(len(r), p=r))]      # the unnormalised residual: numpy refuses it
'''


def test_a_verifier_that_raises_is_a_failure_with_its_input(tmp_path, monkeypatch, capsys):
    """The user's module is imported from the current directory (no PYTHONPATH), and an
    exception inside it is a FAIL (exit 1) with its traceback and the request it was given,
    not an input error of the command (exit 2)."""
    (tmp_path / "my_verifier.py").write_text(RAISING_VERIFIER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    assert main(["conformance", "my_verifier:verify", "--gamma", "1", "--draws", "300",
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "my_verifier.py" in err and "Probabilities do not sum to 1" in err
    assert "FAIL: the verifier raised ValueError" in err and "drafts [[" in err and "p [[[" in err
    assert main(["conformance", "my_verifier:verify", "--gamma", "0"]) == 2   # still bad input
