"""Losslessness of ``generate(custom_generate=coupling.hf.generate)`` on tiny random models.

For a fixed prompt, the law of the first two generated tokens must be plain
``generate(do_sample=True)``'s. That law is enumerated exactly (V = 8: 64 pairs) from the
processed scores ``generate`` itself returns, with temperature, top-k, top-p and a repetition
penalty (which reads the drafted prefix: the second token's law depends on the first). One
``generate`` call with N rows of the prompt and one seed gives N independent samples
(``row_seeds``); a chi-square goodness-of-fit test at level 1e-3 per case (fixed seeds, so the
outcome is deterministic) must pass for every rule, for plain sampling itself (the harness),
and must fail for a negative control whose drafts are not drawn from the q it reports.
Cells of probability 0 (cut by top-k / top-p) must receive no sample at all.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import coupling.hf.drafting as drafting
from coupling import RULES, Tree
from tests.hf_helpers import (  # noqa: F401 (one_thread: an autouse fixture)
    fit_pvalue,
    one_thread,
    speculative,
    tiny_llama,
    two_token_law,
)

V = 8
PROMPT = [1, 2, 3]
SAMPLING = dict(temperature=0.9, top_k=6, top_p=0.95, repetition_penalty=1.3)
N = 6000
ALPHA = 1e-3


@pytest.fixture(scope="module")
def models():
    target, draft = tiny_llama(0, V), tiny_llama(1, V)
    return target, draft, two_token_law(target, PROMPT, **SAMPLING)


def sample_pairs(target, draft, **method):
    out = speculative(target, draft, torch.tensor([PROMPT] * N), max_new_tokens=2, seed=11,
                      **SAMPLING, **method)
    return out[:, len(PROMPT):]


def test_the_law_has_context_and_zeros(models):
    """The case is not degenerate: the second token depends on the first, and the processors
    cut tokens (pairs of probability 0)."""
    _, _, law = models
    matrix = np.zeros((V, V))
    for (y1, y2), prob in law.items():
        matrix[y1, y2] = prob
    assert abs(matrix.sum() - 1.0) < 1e-12
    p1 = matrix.sum(1)
    cond = matrix[p1 > 0] / p1[p1 > 0, None]
    assert (abs(cond - cond[0]).sum(1) > 0.2).any()
    assert (matrix == 0).sum() >= 16


def test_plain_sampling_fits_the_exact_law(models):
    """Positive control: plain generate's own samples pass the same test."""
    target, _, law = models
    torch.manual_seed(0)
    ids = torch.tensor([PROMPT] * N)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                          max_new_tokens=2, **SAMPLING)
    assert fit_pvalue(out[:, len(PROMPT):], law) > ALPHA


def _methods() -> list[dict]:
    """Every lossless rule of the registry with one branch, and with several where it takes
    them (i.i.d. and distinct first tokens): a rule added to RULES is covered here."""
    out = []
    for name, rule in RULES.items():
        if not rule.lossless:
            continue
        out.append(dict(rule=name, gamma=2))
        for k, replacement, gamma in ((3, True, 2), (2, False, 1)):
            if rule.supports(k, replacement):
                out.append(dict(rule=name, num_drafts=k, gamma=gamma, replacement=replacement))
    return out + [dict(rule="block", gamma=1)] + TREES


#: static trees of other shapes, one model row per root-to-leaf path (i.i.d., distinct and
#: top-k children)
TREES = [dict(rule="rrs", tree=Tree.from_branching([2, 2])),
         dict(rule="kseq", tree=Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])),
         dict(rule="rrs", tree=Tree.from_branching([2, 1], children="distinct")),
         dict(rule="strict", tree=Tree.named("medusa", size=6))]


def _name(method: dict) -> str:
    return "-".join(f"{v.size}-node-{v.children}-tree" if isinstance(v, Tree) else f"{v}"
                    for v in method.values())


@pytest.mark.parametrize("method", _methods(), ids=_name)
def test_rule_output_has_plain_sampling_law(models, method):
    target, draft, law = models
    assert fit_pvalue(sample_pairs(target, draft, **method), law) > ALPHA


@pytest.mark.parametrize("method", [dict(rule="token", gamma=2), dict(rule="block", gamma=2),
                                    TREES[0]], ids=_name)
def test_negative_control_q_not_the_drafting_law_fails(models, monkeypatch, method):
    """Drafts drawn from q^3 (renormalised) while q is reported: the test must reject."""
    target, draft, law = models
    honest = drafting.sample_rows
    monkeypatch.setattr(drafting, "sample_rows", lambda w, u: honest(w**3, u))
    assert fit_pvalue(sample_pairs(target, draft, **method), law) < ALPHA
