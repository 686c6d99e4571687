"""Every public entry point, fed the same matrix of bad inputs, raises ValueError or TypeError
whose message names the argument: never a silent number, never a crash from deep inside numpy,
a solver or torch. A function added later joins the tables below and is covered by
construction."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import coupling
from coupling import NEGATIVE_CONTROLS, RULES, TabularLM
from coupling.check import draw_drafts

GOOD_P = np.array([0.5, 0.3, 0.2])
GOOD_Q = np.array([0.2, 0.2, 0.6])

#: bad probability vectors: (label, value)
BAD_LAWS = [
    ("nan", np.array([0.5, np.nan, 0.5])),
    ("inf", np.array([0.5, np.inf, 0.5])),
    ("negative", np.array([0.6, -0.1, 0.5])),
    ("sum off by 1e-3", np.array([0.5, 0.3, 0.201])),
    ("2-d", np.array([[0.5, 0.5], [0.5, 0.5]])),
    ("empty", np.array([])),
    ("bool", np.array([True, False, False])),
    ("strings", np.array(["0.5", "0.5"])),
    ("complex", np.array([0.5 + 0j, 0.5 + 0j])),
    ("None", None),
    ("wrong vocabulary", np.array([0.5, 0.5])),
]

#: bad counts (k, gamma, length): (label, value)
BAD_COUNTS = [("zero", 0), ("negative", -2), ("non-integer", 1.5), ("bool", True),
              ("string", "2"), ("None", None), ("complex", 1j)]


def _raises_naming(fn, *names: str) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        fn()
    msg = str(info.value)
    assert any(n in msg for n in names), f"the message does not name {names}: {msg!r}"


# ---------------------------------------------------------------------------------- laws
def _rule_call(rule, method: str):
    if method == "sample":
        return lambda p, q: rule.sample(p, q, [2], np.random.default_rng(0))
    return lambda p, q: getattr(rule, method)(p, q, 1)


def _rule_count(rule, method: str):
    if method == "supports":
        return lambda n: rule.supports(n)
    return lambda n: rule.acceptance(GOOD_P, GOOD_Q, n)


LAW_FUNCTIONS = {
    "as_distribution": lambda p, q: coupling.as_distribution(p, name="p"),
    "check_pair": lambda p, q: coupling.check_pair(p, q),
    "tv": lambda p, q: coupling.tv(p, q),
    "tuple_law": lambda p, q: coupling.tuple_law(q, 2),
    "solve_coupling": lambda p, q: coupling.solve_coupling(p, q, 2),
    "solve_coupling/highs": lambda p, q: coupling.solve_coupling(p, q, 2, solver="highs"),
    "solve_transport": lambda p, q: coupling.solve_transport(p, q, np.ones((3, 3))),
    "optimal_acceptance": lambda p, q: coupling.optimal_acceptance(p, q, 2),
    "check_rule": lambda p, q: coupling.check_rule(RULES["rrs"], p, q, 2),
    "check_sampler": lambda p, q: coupling.check_sampler(RULES["token"], p, q, n=10),
    "draw_drafts": lambda p, q: draw_drafts(q, 2, True, np.random.default_rng(0)),
    "TabularLM.constant": lambda p, q: TabularLM.constant(p),
    **{f"{name}.{method}": _rule_call(rule, method)
       for name, rule in RULES.items() if rule.unit == "token"
       for method in ("acceptance", "joint", "sample")},
}


@pytest.mark.parametrize("fn", list(LAW_FUNCTIONS), ids=list(LAW_FUNCTIONS))
@pytest.mark.parametrize("label,bad", BAD_LAWS, ids=[b[0] for b in BAD_LAWS])
@pytest.mark.parametrize("slot", ["p", "q"])
def test_bad_laws_name_the_argument(fn, label, bad, slot):
    f = LAW_FUNCTIONS[fn]
    if slot == "p":
        if fn in ("tuple_law", "draw_drafts"):
            pytest.skip("reads q only")
        if label == "wrong vocabulary" and fn in ("as_distribution", "TabularLM.constant"):
            pytest.skip("one law: no vocabulary to compare")
        args = (bad, GOOD_Q)
    else:
        if fn in ("as_distribution", "TabularLM.constant"):
            pytest.skip("reads p only")
        if label == "wrong vocabulary" and fn in ("tuple_law", "draw_drafts"):
            pytest.skip("one law: no vocabulary to compare")
        args = (GOOD_P, bad)
    names = {"solve_transport": ("a", "b", "vocabulary", "cost")}.get(fn, (slot, "vocabulary",
                                                                             "table"))
    _raises_naming(lambda: f(*args), *names, "probabilit")


# -------------------------------------------------------------------------------- counts
def _lm() -> TabularLM:
    return TabularLM(2, order=1, seed=0)


COUNT_FUNCTIONS = {
    "tuple_law k": (lambda n: coupling.tuple_law(GOOD_Q, n), "k"),
    "solve_coupling k": (lambda n: coupling.solve_coupling(GOOD_P, GOOD_Q, n), "k"),
    "optimal_acceptance k": (lambda n: coupling.optimal_acceptance(GOOD_P, GOOD_Q, n), "k"),
    "check_rule k": (lambda n: coupling.check_rule(RULES["rrs"], GOOD_P, GOOD_Q, n), "k"),
    "check_sampler n": (lambda n: coupling.check_sampler(RULES["token"], GOOD_P, GOOD_Q, n=n),
                        "n"),
    "draw_drafts k": (lambda n: draw_drafts(GOOD_Q, n, True, np.random.default_rng(0)), "k"),
    "TabularLM vocab_size": (lambda n: TabularLM(n), "vocab_size"),
    "block_efficiency gamma": (lambda n: coupling.block_efficiency("block", _lm(), _lm(), n),
                               "gamma"),
    "block_efficiency k": (lambda n: coupling.block_efficiency("rrs", _lm(), _lm(), 2, k=n), "k"),
    "stream_law length": (lambda n: coupling.stream_law("token", _lm(), _lm(), 2, n), "length"),
    "target_law length": (lambda n: coupling.target_law(_lm(), n), "length"),
    "sample_stream gamma": (lambda n: coupling.sample_stream("token", _lm(), _lm(), n, 3,
                                                              np.random.default_rng(0)), "gamma"),
    "optimal_block_efficiency gamma": (lambda n: coupling.optimal_block_efficiency(_lm(), _lm(),
                                                                                   n), "gamma"),
    "verifier_lp gamma": (lambda n: coupling.verifier_lp(_lm(), _lm(), n), "gamma"),
    "tree_verifier_lp gamma": (lambda n: coupling.tree_verifier_lp(_lm(), _lm(), n, 2),
                               "gamma"),
    "tree_verifier_lp k": (lambda n: coupling.tree_verifier_lp(_lm(), _lm(), 2, n), "k"),
    "block_efficiency traversal k": (lambda n: coupling.block_efficiency(
        "traversal", _lm(), _lm(), 2, k=n), "k"),
    **{f"{name}.{method} k": (_rule_count(rule, method), "k")
       for name, rule in RULES.items() for method in ("acceptance", "supports")
       if rule.unit == "token" or method == "supports"},
}


@pytest.mark.parametrize("fn", list(COUNT_FUNCTIONS), ids=list(COUNT_FUNCTIONS))
@pytest.mark.parametrize("label,bad", BAD_COUNTS, ids=[b[0] for b in BAD_COUNTS])
def test_bad_counts_name_the_argument(fn, label, bad):
    f, name = COUNT_FUNCTIONS[fn]
    _raises_naming(lambda: f(bad), name)


@pytest.mark.parametrize("fn", ["tuple_law k", "solve_coupling k", "check_rule k",
                                "block_efficiency gamma", "target_law length",
                                "optimal_block_efficiency gamma", "verifier_lp gamma",
                                "tree_verifier_lp gamma", "tree_verifier_lp k",
                                "block_efficiency traversal k"])
def test_huge_counts_are_refused_before_any_work(fn):
    """A count far past what an exact enumeration can visit is a ValueError that says so,
    not a formatting error on a 300000-digit integer or an hour of work."""
    f, name = COUNT_FUNCTIONS[fn]
    _raises_naming(lambda: f(10**6), name, "enumerat", "too large", "limit", "large")


# ---------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("name", list(RULES) + list(NEGATIVE_CONTROLS))
@pytest.mark.parametrize("arg,bad", [("replacement", "no"), ("replacement", None),
                                     ("replacement", 1.0)])
def test_rules_refuse_a_replacement_that_is_not_a_bool(name, arg, bad):
    rule = {**RULES, **NEGATIVE_CONTROLS}[name]
    _raises_naming(lambda: rule.supports(2, bad), "replacement")


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.unit == "token"])
@pytest.mark.parametrize("label,drafts,what", [
    ("None", None, "drafts"), ("out of range", [7], "drafts"), ("negative", [-1], "drafts"),
    ("non-integer", [0.5], "drafts"), ("q = 0", [1], "q = 0"), ("2-d", [[0]], "drafts"),
    ("empty", [], "drafts"),
])
def test_rules_refuse_bad_drafts(name, label, drafts, what):
    rule = RULES[name]
    q = np.array([0.5, 0.0, 0.5])
    _raises_naming(lambda: rule.sample(GOOD_P, q, drafts, np.random.default_rng(0)), what)


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.unit == "token"])
@pytest.mark.parametrize("rng", [None, 0, np.random.RandomState(0)])
def test_rules_refuse_a_legacy_or_missing_generator(name, rng):
    _raises_naming(lambda: RULES[name].sample(GOOD_P, GOOD_Q, [0], rng), "rng")


@pytest.mark.parametrize("name", [n for n, r in RULES.items() if r.unit == "token"])
def test_rules_refuse_uniforms_of_the_wrong_count_or_range(name):
    rule = RULES[name]
    n = rule.n_uniforms(1, 3)
    _raises_naming(lambda: rule.verify(GOOD_P, GOOD_Q, [0], np.full(n + 1, 0.5)), "u")
    _raises_naming(lambda: rule.verify(GOOD_P, GOOD_Q, [0], np.full(n, 1.5)), "u")


def test_block_unit_rules_refuse_single_step_calls():
    _raises_naming(lambda: RULES["block"].acceptance(GOOD_P, GOOD_Q), "block", "single-step")


@pytest.mark.parametrize("name", list(RULES))
def test_unknown_rule_names_list_the_known_ones(name):
    _raises_naming(lambda: coupling.block_efficiency(name + "x", _lm(), _lm(), 2), "known rules")


# ----------------------------------------------------------------------- models and LPs
MODEL_PAIR_FUNCTIONS = {
    "block_efficiency": lambda t, d: coupling.block_efficiency("block", t, d, 2),
    "stream_law": lambda t, d: coupling.stream_law("token", t, d, 2, 2),
    "optimal_block_efficiency": lambda t, d: coupling.optimal_block_efficiency(t, d, 2),
    "optimal_expected_accepted": lambda t, d: coupling.optimal_expected_accepted(t, d, 2),
    "full_information_accepted": lambda t, d: coupling.full_information_accepted(t, d, 2),
    "verifier_lp": lambda t, d: coupling.verifier_lp(t, d, 2),
    "full_information_tree_accepted": lambda t, d: coupling.full_information_tree_accepted(
        t, d, 2, 2),
    "block_efficiency gbv": lambda t, d: coupling.block_efficiency("gbv", t, d, 2, k=2),
    "accepted_length_law": lambda t, d: coupling.accepted_length_law("token", t, d, 2),
    "sample_stream": lambda t, d: coupling.sample_stream("token", t, d, 2, 2,
                                                         np.random.default_rng(0)),
}


@pytest.mark.parametrize("fn", list(MODEL_PAIR_FUNCTIONS))
def test_every_model_pair_function_compares_vocabularies(fn):
    t, d = TabularLM(2, seed=0), TabularLM(3, seed=1)
    _raises_naming(lambda: MODEL_PAIR_FUNCTIONS[fn](t, d), "vocabulary")
    _raises_naming(lambda: MODEL_PAIR_FUNCTIONS[fn](d, t), "vocabulary")


@pytest.mark.parametrize("fn", list(MODEL_PAIR_FUNCTIONS))
@pytest.mark.parametrize("label,bad", [("not callable", 3), ("returns logits",
                                        lambda ctx: np.array([2.0, -1.0]))])
def test_every_model_pair_function_validates_the_models(fn, label, bad):
    _raises_naming(lambda: MODEL_PAIR_FUNCTIONS[fn](bad, TabularLM(2, seed=1)), "target")
    _raises_naming(lambda: MODEL_PAIR_FUNCTIONS[fn](TabularLM(2, seed=1), bad), "draft")


@pytest.mark.parametrize("context", [(0.5,), (True,), (5,), ("a",), 3])
def test_contexts_must_be_token_ids_of_the_vocabulary(context):
    _raises_naming(lambda: coupling.block_efficiency("token", _lm(), _lm(), 2, context=context),
                   "context")


@pytest.mark.parametrize("bad", [np.array([[np.nan, 1.0], [1.0, 1.0]]),
                                 np.array([[1.0, 2.0]]), np.array([[1 + 1j, 0], [0, 0]]),
                                 np.array([["a", "b"], ["c", "d"]])])
def test_solve_transport_validates_its_cost(bad):
    _raises_naming(lambda: coupling.solve_transport([0.5, 0.5], [0.5, 0.5], bad), "cost")


@pytest.mark.parametrize("solver", ["POT", "simplex", None, 3])
def test_solvers_are_named(solver):
    _raises_naming(lambda: coupling.solve_coupling(GOOD_P, GOOD_Q, solver=solver), "solver")
    _raises_naming(lambda: coupling.optimal_block_efficiency(_lm(), _lm(), 2, solver=solver),
                   "solver")


# ---------------------------------------------------------------------------- harness
@pytest.mark.parametrize("kwargs,name", [
    ({"alpha": 0.0}, "alpha"), ({"alpha": 1.0}, "alpha"), ({"alpha": float("nan")}, "alpha"),
    ({"min_expected": float("nan")}, "min_expected"), ({"min_expected": 1e9}, "min_expected"),
    ({"min_expected": 0}, "min_expected"), ({"min_expected": -1}, "min_expected"),
    ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"n": 0}, "n"),
])
def test_the_statistical_harness_validates_every_parameter(kwargs, name):
    _raises_naming(lambda: coupling.check_sampler(RULES["token"], GOOD_P, GOOD_Q, **kwargs),
                   name)


def test_a_pooled_test_of_one_cell_is_refused():
    """With few samples every cell is expected below min_expected: pooled into one cell the
    chi-square tests nothing, and a broken rule would pass."""
    _raises_naming(lambda: coupling.check_sampler(NEGATIVE_CONTROLS["token_no_residual"],
                                                  GOOD_P, GOOD_Q, n=20, min_expected=15),
                   "min_expected")


# --------------------------------------------------------------------------- torch twins
def _tree(V: int = 3):
    p = torch.full((1, 1, 3, V), 1.0 / V, dtype=torch.float64)
    q = torch.full((1, 1, 2, V), 1.0 / V, dtype=torch.float64)
    return torch.zeros(1, 1, 2, dtype=torch.int64), p, q


TWIN_BAD = {
    "seeds None": (lambda d, p, q: dict(drafts=d, p=p, q=q, seeds=None, positions=0), "seeds"),
    "seeds float": (lambda d, p, q: dict(drafts=d, p=p, q=q, seeds=0.5, positions=0), "seeds"),
    "positions negative": (lambda d, p, q: dict(drafts=d, p=p, q=q, seeds=0, positions=-1),
                           "positions"),
    "drafts float": (lambda d, p, q: dict(drafts=d.double(), p=p, q=q, seeds=0, positions=0),
                     "drafts"),
    "drafts out of range": (lambda d, p, q: dict(drafts=d + 7, p=p, q=q, seeds=0, positions=0),
                            "drafts"),
    "p nan": (lambda d, p, q: dict(drafts=d, p=p * float("nan"), q=q, seeds=0, positions=0),
              "p"),
    "q negative": (lambda d, p, q: dict(drafts=d, p=p, q=-q, seeds=0, positions=0), "q"),
    "p logits": (lambda d, p, q: dict(drafts=d, p=p * 3, q=q, seeds=0, positions=0), "p"),
    "p wrong shape": (lambda d, p, q: dict(drafts=d, p=p[:, :, :2], q=q, seeds=0, positions=0),
                      "p"),
    "q wrong vocabulary": (lambda d, p, q: dict(drafts=d, p=p, q=q[..., :2] * 1.5, seeds=0,
                                                positions=0), "q"),
    "numpy arrays": (lambda d, p, q: dict(drafts=d.numpy(), p=p.numpy(), q=q.numpy(), seeds=0,
                                          positions=0), "tensor"),
}


@pytest.mark.parametrize("name", [n for n in RULES if n != "gumbel"])
@pytest.mark.parametrize("case", list(TWIN_BAD))
def test_torch_twins_refuse_bad_inputs(name, case):
    build, what = TWIN_BAD[case]
    kwargs = build(*_tree())
    _raises_naming(lambda: coupling.verify(name, **kwargs), what)


def test_the_dispatcher_names_the_known_rules():
    _raises_naming(lambda: coupling.verify("tokn", *_tree(), seeds=0, positions=0),
                   "known rules")


# ------------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("args", [
    ["--target", "0.5,0.5", "--draft", "0.5,0.6"],
    ["--target", "0.5,nan", "--draft", "0.5,0.5"],
    ["--target", "0.5,0.5", "--draft", "0.2,0.3,0.5"],
    ["--target", "0.5,0.5", "--draft", "0.5,0.5", "--drafts", "1000000"],
    ["--target", "0.5,0.5", "--draft", "0.5,0.5", "--drafts", "0"],
    ["--target", "0.5,0.5", "--draft", "0.5,0.5", "--gamma", "-1"],
])
def test_the_cli_reports_bad_input_as_an_error_line(args):
    proc = subprocess.run([sys.executable, "-m", "coupling", "analyze", *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "error" in proc.stderr and "Traceback" not in proc.stderr
