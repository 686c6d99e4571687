r"""``relaxed`` -- **LOSSY**: relaxed acceptance, the target's top-k candidates within a
probability margin of the best (TensorRT-LLM's multi-token-prediction "relaxed acceptance").

Its output law is not the target's: :meth:`~coupling.rules.base.Rule.output_law` gives the
exact law and :meth:`~coupling.rules.base.Rule.distortion` its total-variation distance to
``p``, which :func:`coupling.check_rule` and ``coupling analyze`` report next to the
acceptance it buys.

Rule (one position, ``k`` drafts; an accept-set rule, :mod:`coupling.rules.acceptset`)
------------------------------------------------------------------------------------
The target's ``topk`` candidates (largest ``p``; ties: lowest id; tokens of zero probability
are never candidates): the top-1 is always acceptable, and candidate ``x`` is acceptable iff
:math:`p(x) \ge p_{\max} - \delta`. ``p`` are probabilities (the engine feeds
``softmax(logits)`` into its kernel), so ``delta`` is a probability margin. The acceptable
draft of highest ``p`` is output; if none, the target's token:

* ``fallback="greedy"`` (the engine's "golden token", the top-1);
* ``fallback="sample"`` (a draw from ``p``: a sampling engine's own token).

Defaults ``topk = 10``, ``delta = 0.6``: TensorRT-LLM's documented DeepSeek-R1 setting
(``relaxed_topk: 10``, ``relaxed_delta: 0.6``). Its API defaults ``topk = 1``, ``delta = 0``
reduce the rule to greedy exact match (the output is always ``argmax p``). Sources: the
kernel ``mtpRelaxedAcceptanceKernel`` and the ``MTPDecodingConfig`` reference (code and
documentation; no paper). The engine applies it during a model's "thinking" phase only; that
gating, and its chain of one draft per position, are engine-level and not modelled: here the
``k`` drafts are drawn from ``q`` and lifted to blocks and trees by the package's walk.

Claims: the exact output law, distortion and acceptance are derived here
(:mod:`coupling.rules.acceptset`) and verified exactly against the enumerated joint. With the
greedy fallback the output stays in the top-``topk`` tokens, so the distortion is at least
``1 - p(top-k)``: a flat law is collapsed onto a few tokens.
"""

from __future__ import annotations

import numpy as np

from ...dist import validate_count
from ..acceptset import AcceptSetRule, choice, non_negative

__all__ = ["Relaxed", "RULE", "TOPK", "DELTA"]

TOPK = 10
DELTA = 0.6
FALLBACKS = ("greedy", "sample")


class Relaxed(AcceptSetRule):
    """Relaxed acceptance (lossy): accept top-``topk`` drafts within ``delta`` of the best.

    Parameters
    ----------
    topk : int
        How many of the target's most likely tokens are candidates.
    delta : float
        Probability margin below the top-1 probability.
    fallback : {"greedy", "sample"}
        What is emitted when no draft is acceptable (module doc).
    """

    name = "relaxed"
    twin = "coupling.rules.relaxed.torch"
    title = "relaxed acceptance: top-k within a margin (LOSSY)"
    reference = "TensorRT-LLM MTP relaxed acceptance (mtpRelaxedAcceptanceKernel)"
    bound_text = "= its exact acceptance (LOSSY: may exceed the lossless optimum)"

    def __init__(self, topk: int = TOPK, delta: float = DELTA, fallback: str = "greedy"):
        self.topk = validate_count(topk, "topk", "(how many candidates)")
        self.delta = non_negative(delta, "delta")
        self.fallback = choice(fallback, "fallback", FALLBACKS)

    def accept_set(self, p):
        top = np.lexsort((np.arange(p.size), -p))[: self.topk]
        accept = np.zeros(p.size, dtype=bool)
        accept[top] = p[top] >= p[top[0]] - self.delta
        accept[top[0]] = True
        return accept

    def fallback_law(self, p):
        if self.fallback == "sample":
            return p.copy()
        f = np.zeros_like(p)
        f[int(np.argmax(p))] = 1.0
        return f

    def __repr__(self) -> str:
        return (f"<rule 'relaxed' (LOSSY): topk={self.topk}, delta={self.delta}, "
                f"fallback={self.fallback!r}>")


RULE = Relaxed()
