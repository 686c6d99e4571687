"""Drafts with another tokenizer (coupling.vocab): tokenizers, exact losslessness of SLEM, SLRS,
TLI and block verification on both proposals, the LP optimum, sampled generations, and a
negative control that fails exactly and statistically."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from coupling import TabularLM, target_law
from coupling.vocab import (
    Intersection,
    Retokenized,
    Tokenizer,
    call_law,
    conditionals,
    generate,
    optimum,
    shared_pieces,
    stream_law,
    to_transformers,
    tokens_per_call,
    toy_tokenizers,
)

TARGET_TOK, DRAFT_TOK = toy_tokenizers()
TEXT = st.text(alphabet="abc", max_size=12)


def pair(seed: int, concentration: float = 0.6):
    return (TabularLM(TARGET_TOK.size, order=1, seed=2 * seed, concentration=concentration),
            TabularLM(DRAFT_TOK.size, order=1, seed=2 * seed + 1, concentration=concentration))


def proposal(kind: str, draft, gamma: int):
    cls = Retokenized if kind == "retokenized" else Intersection
    return cls(draft, DRAFT_TOK, TARGET_TOK, gamma)


def tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


# ------------------------------------------------------------------------------ tokenizers
@given(TEXT)
def test_encoding_round_trips(text):
    for tok in (TARGET_TOK, DRAFT_TOK):
        assert tok.decode(tok.encode(text)) == text


@given(TEXT, TEXT, st.integers(1, 4))
def test_final_tokens_survive_every_continuation(text, more, n):
    for tok in (TARGET_TOK, DRAFT_TOK):
        head = tok.final(text, n)
        if head is not None:
            assert tok.encode(text + more)[:n] == head


def test_greedy_longest_match_and_shared_pieces():
    assert TARGET_TOK.encode("abcab") == (3, 2, 3)           # ab c ab
    assert DRAFT_TOK.encode("abcab") == (0, 1, 3, 1)         # a b ca b
    assert shared_pieces(TARGET_TOK, DRAFT_TOK) == {0: 0, 1: 1, 2: 2}


@pytest.mark.parametrize("pieces,match", [
    (("a", "ab"), "add the pieces"), (("a", "a"), "repeat"), ((), "at least one"),
    (("a", ""), "non-empty"), ("ab", "tuple of strings")])
def test_bad_tokenizers_are_refused(pieces, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Tokenizer(pieces)


def test_bad_proposals_are_refused():
    _, draft = pair(0)
    with pytest.raises(ValueError, match="gamma"):
        Retokenized(draft, DRAFT_TOK, TARGET_TOK, 0)
    with pytest.raises(TypeError, match="draft_tok"):
        Intersection(draft, ("a", "b"), TARGET_TOK, 2)
    with pytest.raises(ValueError, match="share no piece"):
        Intersection(draft, Tokenizer(("x", "y", "z", "xy")), TARGET_TOK, 2)


def test_to_transformers_refuses_what_it_cannot_build():
    with pytest.raises(TypeError, match="coupling.vocab.Tokenizer"):
        to_transformers(("a", "b"))
    with pytest.raises(ValueError, match="at most two characters"):
        to_transformers(Tokenizer(("a", "b", "abb")))


def test_unknown_character_is_named():
    with pytest.raises(ValueError, match="'d'"):
        TARGET_TOK.encode("abd")


# ------------------------------------------------------------------------------ exact laws
CASES = [("strict", "retokenized"), ("token", "retokenized"), ("block", "retokenized"),
         ("token", "intersection"), ("block", "intersection")]


@pytest.mark.parametrize("rule,kind", CASES)
def test_every_method_is_exactly_lossless(rule, kind):
    for seed in range(2):
        target, draft = pair(seed)
        law = stream_law(rule, target, proposal(kind, draft, 2), length=4)
        assert tv(law, target_law(target, 4)) < 1e-12


@pytest.mark.parametrize("kind", ["retokenized", "intersection"])
def test_block_attains_the_lp_and_no_rule_beats_it(kind):
    target, draft = pair(3, concentration=0.4)
    drafting = proposal(kind, draft, 2)
    best = optimum(target, drafting)
    got = {r: tokens_per_call(r, target, drafting) for r in ("strict", "token", "block")}
    assert abs(got["block"] - best) < 1e-7
    assert got["strict"] <= got["token"] + 1e-12 <= best + 1e-7


def test_candidate_laws_are_laws_and_one_draft_token_can_cross_two_target_tokens():
    target, draft = pair(1)
    psi = proposal("retokenized", draft, 2).candidates(())
    assert abs(sum(psi.values()) - 1) < 1e-12 and all(len(x) == 2 for x in psi)
    # the draft's "ca" splits as "c" | "a..." in the target: (c, a) and (c, ab) are proposed
    assert {(2, 0), (2, 3)} <= set(psi)
    tli = proposal("intersection", draft, 2).candidates(())
    assert set(np.unique(np.array(list(tli)))) <= {0, 1, 2}    # the shared pieces only


def test_conditionals_divide_the_candidate_law_by_its_prefixes():
    psi = {(0, 1): 0.2, (0, 2): 0.2, (1, 1): 0.6}
    assert np.allclose(conditionals(psi, (0, 2), 3), [[0.4, 0.6, 0.0], [0.0, 0.5, 0.5]])


def stale(drafting):
    """The control: divide by the candidate law of the first call at every later call (a
    cached proposal law, an engine's mistake)."""
    first = drafting.candidates(())
    return lambda c, x, psi: conditionals(first, x, TARGET_TOK.size)


def test_negative_control_fails_exactly():
    target, draft = pair(0)
    drafting = proposal("retokenized", draft, 2)
    law = stream_law("token", target, drafting, length=4, divide_by=stale(drafting))
    assert tv(law, target_law(target, 4)) > 1e-3


def test_call_law_sums_to_one_and_names_an_unknown_rule():
    target, draft = pair(0)
    drafting = proposal("intersection", draft, 2)
    assert abs(sum(call_law("token", target, drafting, (3, 2)).values()) - 1) < 1e-12
    with pytest.raises(ValueError, match="unknown rule"):
        call_law("no such rule", target, drafting)


# ------------------------------------------------------------------------------ sampled
def sampled_pvalue(rule, kind, n, seed, divide_by=None):
    """Chi-square p-value of n sampled 3-token generations against the target's law."""
    target, draft = pair(0)
    drafting = proposal(kind, draft, 2)
    rng = np.random.default_rng(seed)
    V = TARGET_TOK.size
    counts = np.zeros(V**3)
    divisor = divide_by(drafting) if divide_by else None
    for _ in range(n):
        s = generate(rule, target, drafting, 3, rng, divide_by=divisor)
        counts[np.ravel_multi_index(s, (V,) * 3)] += 1
    expected = target_law(target, 3) * n
    keep = expected > 0
    if counts[~keep].any():
        return 0.0
    return float(stats.chisquare(counts[keep], expected[keep]).pvalue)


@pytest.mark.parametrize("rule,kind", [("token", "retokenized"), ("token", "intersection")])
def test_sampled_generations_follow_the_target(rule, kind):
    # false-positive rate 1e-3 per test; fixed seed
    assert sampled_pvalue(rule, kind, 3000, seed=7) > 1e-3


def test_sampled_negative_control_fails():
    assert sampled_pvalue("token", "retokenized", 3000, seed=7, divide_by=stale) < 1e-6
