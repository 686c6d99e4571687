"""The museum of verification bugs (:mod:`coupling.conformance.museum`): every exhibit gets
the verdict it must (the bugs flagged with their exact distortion, the fixes and the
published non-bugs passing), every sampler follows its exact law, and HSD's exhibit is the
exact counterexample of ``proofs/hsd_lossy.py``."""

from __future__ import annotations

import numpy as np
import pytest

from coupling.conformance import check_verifier, probe_boundaries
from coupling.conformance.museum import HsdSinglePath, bf16, known_bugs
from coupling.conformance.probes import VALUES, BoundaryGenerator
from coupling.testing import assert_sampler_matches_law

EXHIBITS = known_bugs()


def test_the_museum_holds_ten_bugs_and_their_controls():
    keys = [e.key for e in EXHIBITS]
    assert len(set(keys)) == len(keys)
    assert sum(e.lossy for e in EXHIBITS) >= 10
    assert {"exact_match", "hsd_single_path", "reseeded_generator",
            "inclusive_zero_coin"} <= set(keys)


@pytest.mark.parametrize("exhibit", EXHIBITS, ids=lambda e: e.key)
def test_every_exhibit_gets_its_verdict_exactly(exhibit):
    """Exact mode flags each bug its law shows; a bug of probability 0 (SGLang's inclusive
    comparison) has the target's law and is caught by the boundary probes instead, which
    never flag a lossless exhibit."""
    report = check_verifier(exhibit.verifier, exact=True, gamma=2, id_space=None)
    probes = probe_boundaries(exhibit.verifier)
    if exhibit.lossy and exhibit.caught_by == "exact":
        assert not report.ok and report.tv > 1e-4, report.table()
    else:
        assert report.ok and report.tv < 1e-12, report.table()
    if exhibit.caught_by == "probe":
        assert probes.ok is False and probes.failures[0].value in (0.0, VALUES[1]), probes
    if not exhibit.lossy:
        assert probes.ok, probes


def test_probes_name_the_failing_input_and_refuse_other_randomness():
    from coupling.conformance.museum import InclusiveZeroCoin

    report = probe_boundaries(InclusiveZeroCoin())
    text = str(report)
    assert "FAIL" in text and "pair 'p-zeros'" in text and "target probability 0" in text
    f = report.failures[0]
    assert f.token in f.emitted and f.drafts[0][0] == f.token

    def integers_verifier(drafts, p, q, rng):
        return np.array([rng.integers(0, p.shape[-1])])

    skipped = probe_boundaries(integers_verifier)
    assert skipped.ok is None and "rng.integers" in skipped.reason
    gen = BoundaryGenerator(0.0)
    assert isinstance(gen, np.random.Generator) and gen.choice(3, p=[0.0, 0.5, 0.5]) == 1
    assert BoundaryGenerator(VALUES[-1]).choice(3, p=[0.5, 0.5, 0.0]) == 1


@pytest.mark.parametrize("exhibit", [e for e in EXHIBITS if hasattr(e.verifier, "path_law")],
                         ids=lambda e: e.key)
def test_every_sampler_follows_its_exact_law(exhibit):
    rng = np.random.default_rng(3)
    V, g = 3, 3
    p = rng.dirichlet(np.full(V, 0.7), size=(1, g + 1))
    p[0, 2] = [0.6, 0.4, 0.0]                     # a filtered row (min-p shows there)
    q = rng.dirichlet(np.full(V, 0.7), size=(1, g))
    drafts = np.array([[int(np.argmax(q[0, 0])), int(np.argmax(p[0, 1])), 1]])
    law = exhibit.verifier.law(drafts, p, q)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert_sampler_matches_law(exhibit.verifier, drafts, p, q, n=30_000, seed=4)


def test_hsd_exhibit_is_the_proofs_counterexample():
    """p = (1/5, 4/5), q = (4/5, 1/5) at every position, gamma = 2: the first two tokens are
    3/25 in TV from the target's; with gamma = 1 it is lossless."""
    p, q = np.array([0.2, 0.8]), np.array([0.8, 0.2])
    pair = (lambda c: p, lambda c: q)
    two = check_verifier(HsdSinglePath(), exact=True, gamma=2, length=2, pairs=[pair])
    assert two.tv == pytest.approx(0.12, abs=1e-12)
    one = check_verifier(HsdSinglePath(), exact=True, gamma=1, length=2, pairs=[pair])
    assert one.ok


def test_bf16_rounding_is_round_to_nearest_even():
    import torch

    law = np.random.default_rng(0).dirichlet(np.ones(50)).astype(np.float32)
    ref = torch.tensor(law).to(torch.bfloat16).double().numpy()
    np.testing.assert_allclose(bf16(law), ref / ref.sum(), rtol=0, atol=1e-15)
