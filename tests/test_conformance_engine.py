"""Engine details in the conformance check: gammas drawn per step, ragged padded batches,
greedy rows beside sampled ones, laws in float32 and bfloat16, and token ids placed in a
larger id space where 0, 1 and the last id are live."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coupling.conformance import (  # noqa: E402
    VerifierRaised,
    check_verifier,
    from_rule,
    from_torch,
    torch_rule,
)
from coupling.conformance.check import as_gammas  # noqa: E402
from coupling.conformance.ids import live_ids  # noqa: E402
from coupling.conformance.padded import (  # noqa: E402
    greedy_when_any_row_is,
    padded_bonus_from_last,
    padded_token_verifier,
)


# ------------------------------------------------------------------------------ gammas
def test_a_gamma_per_step_keeps_the_exact_law():
    """Each step's gamma drawn from (1, 3): the exact law of the loop is still the target's
    for a lossless rule, and a stale bonus is caught on the mixture too."""
    report = check_verifier(from_rule("token"), gamma=(1, 3), length=4, exact=True)
    assert report.ok and report.tv < 1e-12 and report.gamma == (1, 3)
    assert as_gammas([4, 1, 4]) == (1, 4)
    for bad in (0, [], [1, 0], "12", True):
        with pytest.raises((ValueError, TypeError), match="gamma"):
            check_verifier(from_rule("token"), gamma=bad, draws=10)


def test_the_default_check_reaches_gamma_four():
    seen = set()

    def spy(drafts, p, q, rng):
        seen.add(drafts.shape[1])
        return from_rule("token")(drafts, p, q, rng)

    report = check_verifier(spy, draws=256)
    assert seen == {1, 2, 3, 4} and report.gamma == (1, 2, 3, 4) and report.length == 6


# ------------------------------------------------------------------------------ ragged batches
def test_a_padded_engine_verifier_passes_with_greedy_rows_in_float32_and_bfloat16():
    for dtype in (torch.float32, torch.bfloat16):
        fine = from_torch(padded_token_verifier, ragged=True, greedy=True, dtype=dtype)
        report = check_verifier(fine, draws=3072, seed=4)
        assert report.ok, report.table()
        assert all(r.greedy_loops > 0 and r.greedy_wrong == 0 for r in report.pairs)


def test_the_padding_is_adversarial():
    """The bonus read at the batch's last position fails; a verifier that ignores
    num_drafts accepts padding, which the adapter names."""
    bonus = check_verifier(from_torch(padded_bonus_from_last, ragged=True), draws=3072)
    assert not bonus.ok and bonus.tv > 0.1

    def no_mask(drafts, p, q, generator, *, num_drafts):
        return padded_token_verifier(drafts, p, q, generator)   # every row as if full

    with pytest.raises(VerifierRaised, match="accepted must lie in"):
        check_verifier(from_torch(no_mask, ragged=True), draws=512, id_space=None)


def test_greedy_rows_must_emit_the_argmax_and_leave_the_others_alone():
    leak = check_verifier(from_torch(greedy_when_any_row_is, ragged=True, greedy=True),
                          draws=3072)
    assert not leak.ok

    def greedy_rows_sampled(drafts, p, q, generator, *, greedy):
        return padded_token_verifier(drafts, p, q, generator)   # the flag ignored

    report = check_verifier(from_torch(greedy_rows_sampled, greedy=True), draws=3072)
    assert not report.ok and report.p_value == 0.0
    assert report.pairs[-1].greedy_wrong > 0
    assert "greedy loops strayed from the target's greedy decoding" in report.table()


def test_the_torch_adapter_runs_float32_by_default():
    assert torch_rule("token").dtype == torch.float32
    assert from_torch(padded_token_verifier, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="dtype"):
        from_torch(padded_token_verifier, dtype=torch.int64)


# ------------------------------------------------------------------------------ token ids
def test_live_ids_cover_the_special_ids_and_stay_in_range():
    ids = [live_ids(3, 16, pair=j, seed=0) for j in range(6)]
    assert all(len(set(i.tolist())) == 3 and i.min() >= 0 and i.max() < 16 for i in ids)
    assert {0, 1, 15} <= set(np.concatenate(ids).tolist())
    with pytest.raises(ValueError, match="id_space"):
        live_ids(20, 16, pair=0, seed=0)
    for bad in (0, 2.5, "16"):
        with pytest.raises((ValueError, TypeError), match="id_space"):
            check_verifier(from_rule("token"), id_space=bad, draws=10)


def test_a_verifier_that_trips_on_token_zero_fails_with_its_input():
    """One shipped sampler raised whenever it drew token 0: with ids 0 .. V - 1 every check
    hits it, in the id space the pair that holds id 0 does, and the failure names it."""
    inner = from_rule("token")

    def raises_on_zero(drafts, p, q, rng):
        out = inner(drafts, p, q, rng)
        if (np.asarray(out) == 0).any():
            raise RuntimeError()
        return out

    with pytest.raises(VerifierRaised, match="RuntimeError") as err:
        check_verifier(raises_on_zero, gamma=2, draws=512)
    assert err.value.p.shape[-1] == 16


def test_an_emitted_id_outside_the_pair_is_a_failure():
    def off_by_one(drafts, p, q, rng):
        return np.array([int(np.argmax(p[0, 0])) + 1])  # reads ids as 1-based

    with pytest.raises(VerifierRaised, match="no model gives mass"):
        check_verifier(off_by_one, gamma=1, draws=256)


# ------------------------------------------------------------------------------ torch probes
def _token_step(ratio_test):
    """A one-request torch verifier: accept the first draft iff ``ratio_test(u, p(x), q(x))``,
    else (or after it) a draw from the residual or the bonus law."""
    def fn(drafts, p, q, generator):
        x, P, Q = int(drafts[0, 0, 0]), p[0, 0].double(), q[0, 0].double()
        u = torch.rand(1, generator=generator, dtype=torch.float64)[0]
        if bool(ratio_test(u, P[0, x], Q[0, x])):
            n, law = 1, P[1] if drafts.shape[2] == 1 else None
        else:
            n, law = 0, (P[0] - Q[0]).clamp(min=0)
        law = P[1] if law is None else law
        y = torch.multinomial(law / law.sum(), 1, generator=generator)
        return torch.tensor([n]), torch.tensor([0]), y
    return fn


def test_torch_verifiers_are_probed_at_the_boundaries():
    """torch.rand and torch.multinomial return the boundary values inside the call: the
    inclusive comparison (SGLang #35771) fails at coin 0, a ratio test written as
    "reject iff u >= p / q" fails only on drafts of probability 0 under both models
    (off_support), the strict product test passes both, and keyed twins are reported as not
    probeable."""
    from coupling.conformance import probe_boundaries

    strict = from_torch(_token_step(lambda u, p, q: u * q < p))
    inclusive = from_torch(_token_step(lambda u, p, q: u * q <= p))
    nan_prone = from_torch(_token_step(lambda u, p, q: ~(u >= p / q)))
    assert probe_boundaries(strict, gamma=1, off_support=True).ok
    report = probe_boundaries(inclusive, gamma=1)
    assert report.ok is False and report.failures[0].value == 0.0
    assert probe_boundaries(nan_prone, gamma=1).ok
    off = probe_boundaries(nan_prone, gamma=1, off_support=True)
    assert off.ok is False and {f.case for f in off.failures} == {"p = q = 0"}
    assert probe_boundaries(from_torch(padded_token_verifier), off_support=True).ok
    keyed = probe_boundaries(torch_rule("token"))
    assert keyed.ok is None and "torch.randint" in keyed.reason
