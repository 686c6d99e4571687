"""Shared by tests/test_llm.py (tiny models) and tests/test_llm_real.py (SmolLM2)."""

from __future__ import annotations

import torch

from coupling.llm.sampling import SamplingConfig, probs


def record_first_laws(drafter) -> list[tuple[list[int], torch.Tensor]]:
    """Wrap ``drafter.propose`` so each call appends (committed text, first drafted law [V])."""
    seen: list[tuple[list[int], torch.Tensor]] = []
    propose = drafter.propose

    def recording(seq, *a, **kw):
        t, q = propose(seq, *a, **kw)
        seen.append((list(seq), q[0, 0].double()))
        return t, q

    drafter.propose = recording
    return seen


@torch.no_grad()
def fresh_feature_law(target, draft, seq: list[int], cfg: SamplingConfig) -> torch.Tensor:
    """The feature draft's law of the token after ``seq``, recomputed from scratch: target
    features f_0..f_{L-2}, then the draft on the pairs (x_i, f_{i-1}), i = 1..L-1."""
    f = target(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[-1]
    fh = draft.features(torch.tensor([seq[1:]]), f)[:, -1]
    return probs(draft.logits(fh), cfg)[0].double()
