"""`coupling analyze`: the numbers it prints are the package's exact answers."""

import json
import subprocess
import sys
from fractions import Fraction

import pytest

from coupling.cli import main, parse_distribution


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "coupling", *args], capture_output=True, text=True, timeout=300
    )


def test_analyze_json_agrees_with_lp_and_rules(capsys):
    assert main(["analyze", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["tv"] == pytest.approx(0.4, abs=1e-12)
    for solver in ("pot", "highs", "cvxpy", "cut"):
        assert res["lp"][solver]["acceptance"] == pytest.approx(0.6, abs=1e-9)
    assert res["optimal_acceptance"] == pytest.approx(0.6, abs=1e-12)
    assert res["rules"]["token"]["acceptance"] == pytest.approx(0.6, abs=1e-12)
    assert res["rules"]["token"]["ratio_to_optimum"] == pytest.approx(1.0, abs=1e-12)
    g = res["rules"]["gumbel"]
    assert (1 - 0.4) / (1 + 0.4) - 1e-12 <= g["acceptance"] <= 0.6 + 1e-12


def test_analyze_multi_draft_rows(capsys):
    args = [
        "analyze",
        "--target",
        "0.5,0.3,0.2",
        "--draft",
        "0.2,0.2,0.6",
        "--drafts",
        "2",
        "--json",
    ]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["lp"]["pot"]["acceptance"] == pytest.approx(0.84, abs=1e-9)
    assert res["rules"]["optimal"]["acceptance"] == pytest.approx(0.84, abs=1e-9)
    assert "token" not in res["rules"]  # a single-draft rule has no row at k = 2
    for name in ("kseq", "rrs"):
        r = res["rules"][name]
        assert r["acceptance"] <= 0.84 + 1e-9
        assert r["bound_low"] - 1e-12 <= r["acceptance"] <= r["bound_high"] + 1e-12


def test_analyze_block_paper_example(capsys):
    """Sun et al.'s example: 10/9 (token), 11/9 (block), 12/9 (block transport) accepted tokens.

    11/9 is also the LP optimum over every lossless verifier, even one knowing both models:
    the 12/9 transport bound couples draft tokens with target tokens after the first
    disagreement, which no verifier emits.
    """
    args = ["analyze", "--target", "1/3,2/3", "--draft", "2/3,1/3", "--gamma", "2", "--json"]
    assert main(args) == 0
    b = json.loads(capsys.readouterr().out)["block"]["context_free"]
    # block efficiency counts the extra target token: accepted + 1
    assert b["token"] == pytest.approx(float(Fraction(10, 9) + 1), abs=1e-12)
    assert b["block"] == pytest.approx(float(Fraction(11, 9) + 1), abs=1e-12)
    assert b["transport_bound"] == pytest.approx(float(Fraction(12, 9) + 1), abs=1e-9)
    assert b["optimal_lossless_verifier"] == pytest.approx(float(Fraction(11, 9) + 1), abs=1e-9)
    # one draft: kseq, rrs and optimal are token verification; on two tokens so is gumbel
    for name in ("kseq", "rrs", "optimal", "gumbel"):
        assert b[name] == pytest.approx(b["token"], abs=1e-12), name


def test_lossy_rules_show_their_distortion(capsys):
    """typical and relaxed are flagged lossy with their exact distortion and the LP optimum at
    that distortion; every lossless rule reports distortion 0."""
    args = ["analyze", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "--drafts", "2",
            "--json"]
    assert main(args) == 0
    rules = json.loads(capsys.readouterr().out)["rules"]
    from coupling import RULES

    for name, r in rules.items():
        assert r["lossless"] == RULES[name].lossless
        if r["lossless"]:
            assert r["distortion"] == 0
        else:
            assert r["distortion"] == pytest.approx(
                RULES[name].distortion([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], 2), abs=1e-15)
            assert 0 < r["distortion"] and r["acceptance"] <= r["optimum_at_distortion"] + 1e-9
    assert {"typical", "relaxed"} <= {n for n, r in rules.items() if not r["lossless"]}
    proc = run_cli("analyze", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6")
    assert "LOSSY rules" in proc.stdout and "distortion" in proc.stdout


def test_analyze_table_output():
    proc = run_cli("analyze", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6")
    assert proc.returncode == 0, proc.stderr
    for word in ("pot", "highs", "cvxpy", "token", "kseq", "rrs", "optimal", "gumbel"):
        assert word in proc.stdout


@pytest.mark.parametrize(
    "target, draft, message",
    [
        ("0.5,0.5", "0.2,0.2,0.6", "vocabulary mismatch"),
        ("0.5,0.3,0.1", "0.2,0.2,0.6", "sums to"),
        ("0.5,nan,0.5", "0.2,0.2,0.6", "NaN"),
        ("0.5,x", "0.5,0.5", "comma-separated"),
        ("1.5,-0.5", "0.5,0.5", "negative"),
    ],
)
def test_bad_input_exits_nonzero_with_message(target, draft, message):
    proc = run_cli("analyze", "--target", target, "--draft", draft)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_parse_distribution_fractions():
    assert parse_distribution("1/3, 2/3", name="target").tolist() == [1 / 3, 2 / 3]


def test_analyze_reports_overflowing_input_and_solver_failures(capsys, monkeypatch):
    assert main(["analyze", "--target", "1e308,1e308", "--draft", "0.5,0.5"]) == 2
    assert "sums to inf" in capsys.readouterr().err
    from coupling import cli
    from coupling.lp.solve import SolverError

    def fail(args):
        raise SolverError("HiGHS transport LP failed: status=4")

    monkeypatch.setattr(cli, "_cmd_analyze", fail)
    assert main(["analyze", "--target", "0.5,0.5", "--draft", "0.5,0.5"]) == 3
    assert "solver error: HiGHS" in capsys.readouterr().err


def test_registered_commands_get_the_remaining_arguments(monkeypatch):
    """A command registered under the entry-point group ``coupling.commands`` is called with
    the arguments after its name, and its return value is the exit status."""
    from coupling import cli

    seen = []

    class EntryPoint:
        name, value = "echo", "tests:echo"

        def load(self):
            return lambda argv: seen.append(argv) or 7

    monkeypatch.setattr(cli, "_commands", lambda: {"echo": EntryPoint()})
    assert main(["echo", "--n", "3", "x"]) == 7
    assert seen == [["--n", "3", "x"]]
    assert "echo" in cli.build_parser().format_help()


def test_help_lists_every_installed_command():
    from importlib.metadata import entry_points

    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    for name in ["analyze", *(ep.name for ep in entry_points(group="coupling.commands"))]:
        assert name in proc.stdout
    assert "registered by" not in proc.stdout
    assert "reproduces the target's law" in proc.stdout and "side by side" in proc.stdout


@pytest.mark.parametrize("command", ["analyze", "conformance"])
def test_an_unknown_option_shows_the_commands_own_usage(command, capsys):
    """A mistyped option is the command's own error, with its usage line and exit 2."""
    argv = {"analyze": ["--target", "0.5,0.5", "--draft", "0.5,0.5", "--rule", "rrs"],
            "conformance": ["m:v", "--k-drafts", "2"]}[command]
    with pytest.raises(SystemExit) as exc:
        main([command, *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: coupling {command} ") and "unrecognized arguments" in err


def test_messages_name_the_command_line_flags(capsys):
    """A message from the library that reaches the shell names the flags, not the Python
    arguments (--drafts, not k=)."""
    assert main(["analyze", "--target", "0.5,0.5", "--draft", "0.5,0.5", "--drafts", "300"]) \
        == 2
    err = capsys.readouterr().err
    assert "--drafts 300" in err and "k=" not in err


def test_analyze_says_what_it_leaves_out(capsys):
    """Nothing vanishes silently: rules that cannot verify the chosen drafts, and a block
    section over the enumeration bound, name each rule left out and why, in the table and in
    the JSON."""
    p, q = "0.5,0.3,0.2,0,0,0,0,0", "0.2,0.2,0.2,0.1,0.1,0.1,0.05,0.05"
    assert main(["analyze", "--target", p, "--draft", q, "--drafts", "2", "--gamma", "3"]) == 0
    out = capsys.readouterr().out
    assert "skipped: greedy" in out and "--without-replacement" in out
    assert "traversal, gbv (judges a whole block" in out
    assert "8**6 draft trees, above 100000: lower --gamma or --drafts" in out
    assert main(["analyze", "--target", p, "--draft", q, "--drafts", "2", "--gamma", "3",
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["block"]["context_free"] == {} and "token" in res["block"]["skipped"]
    assert set(res["skipped"]) == {"token", "block", "gumbel", "minhash", "greedy", "spechub",
                                   "traversal", "gbv"}


def test_lossy_rules_are_measured_against_their_own_lp(capsys):
    """The "/ its LP" column of a lossy rule is its acceptance over the best at its
    distortion, so it never exceeds 1; the block section says its unit and its toy pair."""
    assert main(["analyze", "--target", "0.5,0.3,0.2", "--draft", "0.2,0.2,0.6", "--drafts", "2",
                 "--json"]) == 0
    rules = json.loads(capsys.readouterr().out)["rules"]
    for name in ("typical", "relaxed"):
        r = rules[name]
        assert r["ratio_to_optimum"] == pytest.approx(r["acceptance"] / r["optimum_at_distortion"])
        assert r["ratio_to_optimum"] <= 1 + 1e-9
    assert main(["analyze", "--target", "1/3,2/3", "--draft", "2/3,1/3", "--gamma", "2"]) == 0
    out = capsys.readouterr().out
    assert "tokens per target call, E[accepted] + 1" in out and "not your laws" in out


def test_a_closed_pipe_ends_quietly():
    """``coupling analyze ... | head -1``: no traceback when the reader leaves."""
    cmd = (f"{sys.executable} -m coupling analyze --target 0.5,0.3,0.2 --draft 0.2,0.2,0.6 "
           "--gamma 2 | head -c 10")
    done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert done.stdout == "target  = " and "Traceback" not in done.stderr, done.stderr
