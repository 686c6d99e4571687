"""coupling.conformance: protocol, exact mode, model pairs, adapters, report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coupling import RULES, TabularLM, stream_law
from coupling.conformance import (
    PAIR_NAMES,
    check_verifier,
    from_rule,
    from_torch,
    model_pairs,
    torch_rule,
)
from coupling.conformance.loop import Laws, enumerate_trees, exact_law, sample_tree
from coupling.rules import get_rule
from coupling.testing import assert_sampler_matches_law


# ------------------------------------------------------------------------------ model pairs
def test_model_pairs_have_the_advertised_features():
    pairs = {p.name: p for p in model_pairs(3, seed=0)}
    assert tuple(pairs) == PAIR_NAMES
    ctxs = [(), (0,), (1, 2), (2, 2, 1)]
    for c in ctxs:
        assert pairs["peaked"].target(c).max() >= 0.97
        assert pairs["flat"].target(c).min() > 0.05
    assert all((pairs["q-zeros"].draft(c) == 0).sum() == 1 for c in ctxs)
    assert any((pairs["p-zeros"].target(c) == 0).any() for c in ctxs)
    assert pairs["same"].target is pairs["same"].draft
    # context-dependent: the law after one token depends on which token
    t = pairs["dirichlet"].target
    assert not np.allclose(t((0,)), t((1,)))
    # the same seed gives the same models, another seed other models
    again = model_pairs(3, seed=0)[0].target((1,))
    assert np.array_equal(again, t((1,)))
    assert not np.array_equal(model_pairs(3, seed=1)[0].target((1,)), t((1,)))


def test_without_replacement_keeps_k_tokens_in_every_draft_row():
    pair = {p.name: p for p in model_pairs(3, k=3, replacement=False)}["q-zeros"]
    assert (pair.draft(()) > 0).all()


# ------------------------------------------------------------------------------ draft trees
@pytest.mark.parametrize("k,replacement", [(1, True), (2, True), (2, False), (3, False)])
def test_enumerated_trees_are_a_law_and_match_sampling(k, replacement):
    draft = Laws(model_pairs(3, k=k, replacement=replacement)[0].draft, "draft")
    trees = list(enumerate_trees((1,), draft, k, 2, replacement))
    total = sum(pr for _, pr in trees)
    assert abs(total - 1) < 1e-12
    if not replacement:
        assert all(len(set(d[:, 0].tolist())) == k for d, _ in trees)
    rng = np.random.default_rng(0)
    index = {d.tobytes(): i for i, (d, _) in enumerate(trees)}
    counts = np.zeros(len(trees))
    for _ in range(4000):
        counts[index[sample_tree((1,), draft, k, 2, replacement, rng).tobytes()]] += 1
    expected = np.array([pr for _, pr in trees]) * 4000
    assert 0.5 * np.abs(counts - expected).sum() / 4000 < 0.06


# ------------------------------------------------------------------------------ exact mode
EXACT = [("token", 1, True), ("kseq", 1, True), ("kseq", 2, True), ("rrs", 2, True),
         ("rrs", 2, False), ("rrs", 3, False), ("optimal", 2, True), ("optimal", 2, False),
         ("gumbel", 1, True), ("minhash", 1, True)]


@pytest.mark.parametrize("rule,k,replacement", EXACT)
def test_every_rule_is_exactly_lossless_along_trees(rule, k, replacement):
    report = check_verifier(from_rule(rule, replacement=replacement), k=k,
                            replacement=replacement, exact=True, gamma=2)
    assert report.ok, report.table()
    assert report.tv < 1e-12 and report.mode == "exact" and report.p_value is None


# rules that judge the drafted block as a whole, called on the whole tree
WHOLE = [("block", 1, True), ("traversal", 2, True), ("gbv", 2, True)]


@pytest.mark.parametrize("rule,k,replacement", WHOLE)
def test_whole_block_rules_are_exactly_lossless(rule, k, replacement):
    report = check_verifier(from_rule(rule, replacement=replacement), k=k,
                            replacement=replacement, exact=True, gamma=2, id_space=None)
    assert report.ok and report.tv < 1e-12, report.table()


def test_whole_block_negative_control_fails_exactly():
    bad = from_rule(get_rule("block_plain_residual", controls=True))
    assert not check_verifier(bad, exact=True, gamma=2, id_space=None).ok


@pytest.mark.parametrize("rule", ["block", "traversal"])
def test_whole_block_rule_samples_its_exact_law(rule):
    rng = np.random.default_rng(4)
    k = RULES[rule].max_drafts or 2
    drafts = np.array([[0, 1], [2, 1]])[:k]
    p, q = rng.dirichlet(np.ones(3), size=(k, 3)), rng.dirichlet(np.ones(3), size=(k, 2))
    p[:, 0] = p[0, 0]                 # the branches share the root's laws
    q[:, 0] = q[0, 0]
    verify = from_rule(rule)
    assert abs(sum(verify.law(drafts, p, q).values()) - 1) < 1e-12
    assert_sampler_matches_law(verify, drafts, p, q, n=20_000, seed=2)


def test_exact_law_of_token_matches_the_package_stream_law():
    pair = model_pairs(3, seed=2)[0]
    law = exact_law(from_rule("token").law, Laws(pair.target, "t"), Laws(pair.draft, "d"),
                    length=3, gammas=(2,), k=1, replacement=True)
    assert np.abs(law - stream_law("token", pair.target, pair.draft, 2, 3)).max() < 1e-14


def test_rule_walk_samples_its_exact_law():
    verify = from_rule("rrs")
    rng = np.random.default_rng(1)  # the laws
    drafts = np.array([[0, 1], [0, 2]])
    p = rng.dirichlet(np.ones(3), size=(2, 3))
    p[1, 0] = p[0, 0]  # the branches share their first law
    q = rng.dirichlet(np.ones(3), size=(2, 2))
    q[1, 0] = q[0, 0]
    p[1, 1] = p[0, 1]
    q[1, 1] = q[0, 1]  # and their second (same first token)
    assert abs(sum(verify.law(drafts, p, q).values()) - 1) < 1e-12
    assert_sampler_matches_law(verify, drafts, p, q, n=20_000, seed=1)


# ------------------------------------------------------------------------------ statistical
def test_check_is_reproducible_and_reports_what_it_ran():
    a = check_verifier(from_rule("token"), draws=500, seed=3, gamma=2)
    b = check_verifier(from_rule("token"), draws=500, seed=3, gamma=2)
    assert a.pairs == b.pairs and a.p_value == b.p_value
    assert [r.name for r in a.pairs] == list(PAIR_NAMES)
    assert a.length == 4 and a.draws == 500 and a.mode == "statistical"
    assert all(r.tokens_per_call >= 1 for r in a.pairs)
    assert a.pairs[-1].tokens_per_call == 3.0  # draft = target: everything accepted
    d = a.to_dict()
    assert json.loads(json.dumps(d))["pairs"][0]["name"] == "dirichlet"
    text = str(a)
    assert "PASS" in text and "dirichlet" in text


def test_a_pass_reads_its_tv_against_the_noise_of_a_lossless_sampler():
    """Over many strings a lossless verifier's plug-in TV sits at its sampling-noise floor,
    above the detectable TV; the report says so, and the floor tracks the estimate pair by
    pair (fixed seed)."""
    a = check_verifier(from_rule("token"), gamma=3, draws=3000, seed=1)
    assert a.ok
    for r in a.pairs:
        assert 0.5 * r.noise_tv <= r.tv <= 1.5 * r.noise_tv + 0.01, r.name
    worst = max(a.pairs, key=lambda r: r.tv)
    assert worst.tv > a.detectable_tv / 2
    assert f"sampling noise here: about {worst.noise_tv:.3g}" in str(a)


def test_own_pairs_and_a_context_free_blind_spot():
    """A verifier that takes the bonus from the last drafted position's law (an off-by-one)
    is exact on context-free models, which is what per-position tests use, and caught on
    context-dependent ones."""

    class StaleBonus:
        name = "bonus from p[gamma - 1]"

        def law(self, drafts, p, q):
            return from_rule("token").law(drafts, np.concatenate([p[:, :-1], p[:, -2:-1]], 1),
                                          q)

        def __call__(self, drafts, p, q, rng):
            return from_rule("token")(drafts, np.concatenate([p[:, :-1], p[:, -2:-1]], 1), q,
                                      rng)

    flat = [("constant", TabularLM.constant([0.5, 0.3, 0.2]), TabularLM.constant([0.2, 0.3, 0.5]))]
    assert check_verifier(StaleBonus(), exact=True, pairs=flat, gamma=2).ok
    report = check_verifier(StaleBonus(), exact=True, gamma=2)
    assert not report.ok and report.tv > 0.01


def test_protocol_violations_are_errors():
    def emits_undrafted(drafts, p, q, rng):
        return np.array([(drafts[0, 0] + 1) % 3, 0])

    def too_long(drafts, p, q, rng):
        return np.zeros(drafts.shape[1] + 2, dtype=np.int64)

    def floats(drafts, p, q, rng):
        return np.array([0.0])

    for bad in (emits_undrafted, too_long, floats):
        with pytest.raises(ValueError, match="verify"):
            check_verifier(bad, draws=10, gamma=2, id_space=None)


@pytest.mark.parametrize("kwargs,match", [
    ({"gamma": 0}, "gamma"), ({"draws": 0}, "draws"), ({"alpha": 0.0}, "alpha"),
    ({"replacement": "no"}, "replacement"), ({"length": 30}, "strings"),
    ({"k": 4, "replacement": False}, "vocab_size"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_verifier(from_rule("token"), **{"gamma": 2, **kwargs})


def test_exact_mode_needs_a_law():
    with pytest.raises(TypeError, match="law"):
        check_verifier(lambda d, p, q, rng: d[0, :1], exact=True, gamma=2)


def test_progress_is_reported():
    seen = []
    check_verifier(from_rule("token"), draws=300, gamma=2,
                   progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (1800, 1800)


# ------------------------------------------------------------------------------ torch
@pytest.mark.parametrize("rule,k", [("token", 1), ("block", 1), ("rrs", 2), ("kseq", 2)])
def test_package_torch_twins_pass_through_the_adapter(rule, k):
    report = check_verifier(torch_rule(rule), k=k, draws=3000, seed=7, gamma=2)
    assert report.ok, report.table()


def test_torch_adapter_catches_a_broken_batched_verifier():
    import torch

    def accept_everything(drafts, p, q, generator):
        B, _, g = drafts.shape
        bonus = torch.multinomial(p[:, 0, g], 1, generator=generator).squeeze(1)
        return (torch.full((B,), g), torch.zeros(B, dtype=torch.int64), bonus)

    report = check_verifier(from_torch(accept_everything), draws=1000, gamma=2)
    assert not report.ok


def test_torch_adapter_validates_its_output():
    import torch

    def bad(drafts, p, q, generator):
        B = drafts.shape[0]
        return torch.full((B,), 9), torch.zeros(B, dtype=torch.int64), torch.zeros(B)

    from coupling.conformance import VerifierRaised

    with pytest.raises(VerifierRaised, match="next_token must be an integer tensor") as err:
        check_verifier(from_torch(bad), draws=10, gamma=2)
    assert isinstance(err.value.__cause__, ValueError)   # its output was malformed: a failure


@pytest.mark.slow
def test_transformers_speculative_sampling_is_lossless():
    pytest.importorskip("transformers")
    from coupling.conformance import hf_speculative_sampling

    report = check_verifier(hf_speculative_sampling(), draws=3000, seed=11, gamma=2)
    assert report.ok, report.table()
    lossy = check_verifier(hf_speculative_sampling(assistant_ensemble_weight=0.9), draws=2000,
                           gamma=2)
    assert not lossy.ok  # DIVERSE's ensemble verification is documented as biased


def test_user_pairs_must_share_a_vocabulary():
    pairs = [(TabularLM.constant([0.5, 0.5]), TabularLM.constant([0.2, 0.3, 0.5]))]
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        check_verifier(from_rule("token"), pairs=pairs, draws=10, gamma=2)
    with pytest.raises(TypeError, match="pairs"):
        check_verifier(from_rule("token"), pairs=[object()], gamma=2)


def test_rules_decide_alike_without_their_per_call_checks():
    """from_rule calls the rules with validate=False (the checker's laws are checked where it
    builds them): the same arrays reach the core, so every single-step rule decides exactly
    as with its checks, draw for draw."""
    from coupling import RULES

    rng = np.random.default_rng(0)
    for name, rule in RULES.items():
        if rule.unit != "token":
            continue
        k = 1 if rule.max_drafts == 1 else 2
        replacement = rule.supports(k, True)
        for t in range(60):
            p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4))
            d = rule.draw_drafts(q, k, replacement, rng)        # the rule's own draft law
            kw = dict(replacement=replacement)
            checked = rule.sample(p, q, d, np.random.default_rng(t), **kw)
            assert rule.sample(p, q, d, np.random.default_rng(t), validate=False,
                               **kw) == checked, name
