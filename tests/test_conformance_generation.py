"""Loop mode: a whole generation loop that drafts by itself, checked on the law of its text;
the bugs that live between drafting and verification fail it, the engine's own logit
processing is honoured, and an exception is a failure with its pair and loop."""

from __future__ import annotations

import numpy as np
import pytest

from coupling.conformance import GenerationRaised, check_generation
from coupling.conformance.generation import speculative_generate


def _law(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def reseeded(target, draft, context, max_new_tokens, rng):
    """The research-repo bug: the verification generator reseeded before every step, so
    one uniform serves every position (the drafts still come from ``rng``)."""
    out = list(context)
    while len(out) - len(context) < max_new_tokens:
        q = _law(draft(tuple(out)))
        x = int(rng.choice(q.size, p=q))
        p = _law(target(tuple(out)))
        u = np.random.default_rng(1234).random()
        if u * q[x] < p[x]:
            out += [x, int(rng.choice(p.size, p=_law(target(tuple(out + [x])))))]
        else:
            r = np.maximum(p - q, 0.0)
            out.append(int(rng.choice(r.size, p=r / r.sum())))
    return out[len(context):]


def bonus_from_draft(target, draft, context, max_new_tokens, rng):
    """The bonus token sampled outside the verifier from the draft's law."""
    out = list(context)
    while len(out) - len(context) < max_new_tokens:
        q = _law(draft(tuple(out)))
        x = int(rng.choice(q.size, p=q))
        p = _law(target(tuple(out)))
        if rng.random() * q[x] < p[x]:
            out += [x, int(rng.choice(q.size, p=_law(draft(tuple(out + [x])))))]
        else:
            r = np.maximum(p - q, 0.0)
            out.append(int(rng.choice(r.size, p=r / r.sum())))
    return out[len(context):]


def test_a_correct_loop_passes_and_the_loop_bugs_fail():
    ok = check_generation(speculative_generate, draws=4000)
    assert ok.ok and ok.mode == "loop" and "its own drafting" in ok.table()
    for bug in (reseeded, bonus_from_draft):
        report = check_generation(bug, draws=4000)
        assert not report.ok and report.tv > 0.02, bug.__name__


def test_the_engines_own_processing_sets_the_reference():
    """A loop that samples both models at temperature 0.5 is lossless for the processed
    target, and lossy against the raw one."""
    def cooled(target, draft, context, n, rng):
        return speculative_generate(lambda c: target(c) / 0.5, lambda c: draft(c) / 0.5,
                                    context, n, rng)

    assert check_generation(cooled, draws=4000, processing=lambda z: z / 0.5).ok
    assert not check_generation(cooled, draws=4000).ok


def test_an_exception_is_a_failure_with_its_pair_and_loop():
    def crashes_on_token_zero(target, draft, context, n, rng):
        out = speculative_generate(target, draft, context, n, rng)
        if out[0] == 0:
            raise RuntimeError()
        return out

    with pytest.raises(GenerationRaised, match="pair 'dirichlet', loop") as info:
        check_generation(crashes_on_token_zero, draws=500)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(ValueError, match="at least max_new_tokens=4"):
        check_generation(lambda t, d, c, n, rng: [0], draws=10)
    with pytest.raises(TypeError, match="processing"):
        check_generation(speculative_generate, processing=3)
