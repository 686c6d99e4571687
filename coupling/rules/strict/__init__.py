r"""``strict``: exact-match verification, the target's own sample checked against the drafts.

Several serving engines verify drafts this way: the target draws its token with its own
randomness, and a draft counts as accepted iff it is that token.

Algorithm (what :func:`verify` does)
------------------------------------
The target draws :math:`y \sim p` by inverse CDF with the last uniform ``u[k]``, independently
of the drafts (the per-draft coins ``u[:k]`` are not read). The step accepts iff ``y`` is
among the ``k`` drafts; the output is always ``y``.

Exact law and losslessness (proved)
-----------------------------------
:math:`\pi(t, y) = Q(t)\, p(y)`: the independent coupling of the draft tuple and the output.
The output is drawn from ``p`` and never changed, so the rule is lossless whatever ``q``.

Acceptance (closed form)
------------------------
:math:`\alpha = \sum_y p(y)\, P(y \in \text{drafts})` (:func:`acceptance`, the inclusion
probabilities of :func:`coupling.lp.draftsets.inclusion`):

* ``k = 1``: :math:`\sum_y p(y)\, q(y)`;
* ``k`` i.i.d. drafts: :math:`\sum_y p(y)\,(1 - (1 - q(y))^k)`, any ``V``;
* without replacement: ``k = 2`` in closed form at any ``V``; ``k >= 3`` from the enumerated
  tuple law (small ``V`` only: no large-``V`` form is implemented there).

Information model: the output depends on ``p`` and the target's randomness only, so the
drafts cannot move it; the only coupling available is the product, and :math:`\alpha` is its
value, far below the LP optimum of the same draft law (which sees the drafts).

What it keeps, what it costs
----------------------------
Under a fixed seed the emitted stream does not depend on the drafter (``drafter_invariant``):
the torch twin keys the target's draw of the token at absolute position ``s`` by
``U(seed, s, STREAM_SAMPLE, 0)``, the uniform plain sampling of the target reads
(:func:`target_uniforms`), so the stream is the target sampled alone with that seed.
The Gumbel coupling keeps that property and never accepts less, token by token (**proved**
here, ``k = 1``): its collision mass on ``i`` is
:math:`1 / \sum_j \max(p_j/p_i, q_j/q_i) \ge p_i q_i`, because with :math:`a = q_i`,
:math:`b = p_i`, :math:`\sum_j \max(a p_j, b q_j) \le ab + a(1 - b) + b(1 - a)
= 1 - (1 - a)(1 - b) \le 1` (the ``j = i`` term is ``ab``; the others are at most
:math:`a p_j + b q_j`). For ``k`` drafts ``gls`` is the drafter-invariant counterpart;
``gls >= strict`` is **verified** on seeded laws (``benchmarks/bench_lossy_invariant.py``),
not proved. Token verification (``1 - TV``) and the optimum accept more, but their output
depends on the drafter.
"""

from __future__ import annotations

import numpy as np

from ...dist import tuple_law, validate_seed
from ...keyed import STREAM_SAMPLE, call_uniforms, uniforms
from ...lp.draftsets import inclusion
from ..base import Rule
from ..common import categorical

__all__ = ["acceptance", "joint", "verify", "target_uniforms", "Strict", "RULE"]


def acceptance(p: np.ndarray, q: np.ndarray, k: int = 1, replacement: bool = True) -> float:
    r""":math:`\sum_y p(y)\, P(y \in \text{drafts})` on validated laws (module doc)."""
    return float(np.dot(p, inclusion(q, k, replacement)))


def joint(p: np.ndarray, q: np.ndarray, k: int = 1, replacement: bool = True) -> np.ndarray:
    """Exact law ``[T, V]``: ``Q(t) p(y)``, rows in :func:`coupling.dist.tuple_law` order."""
    _, probs = tuple_law(q, k, replacement=replacement)
    return np.outer(probs, p)


def verify(p: np.ndarray, u_target: float) -> int:
    """Deterministic core: the target's own token, the inverse-CDF draw of ``p`` at
    ``u_target``; the drafts are accepted iff it is among them."""
    return categorical(p, u_target)


def target_uniforms(seed: int, position: int, gamma: int) -> np.ndarray:
    """``[gamma + 1]`` uniforms ``U(seed, position + i, STREAM_SAMPLE, 0)``: the draw of the
    token at absolute position ``position + i`` when the target samples alone with this seed,
    which the torch twin reads (the ``u`` of :meth:`Rule.verify_block` for a seeded call)."""
    seed, position = validate_seed(seed), validate_seed(position, "position")
    return uniforms(seed, np.arange(position, position + gamma + 1, dtype=np.uint64),
                    STREAM_SAMPLE, 0)


class Strict(Rule):
    """Exact match: the target samples its own token; a draft is accepted iff it equals it."""

    name = "strict"
    twin = "coupling.rules.strict.torch"
    draws_by_position = True
    title = "exact-match verification (drafter-invariant)"
    reference = "the exact-match check of serving engines; closed form derived here"
    drafter_invariant = True
    bound_text = "= sum_y p(y) P(y drafted) (the independent coupling: exact)"

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k, replacement)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k, replacement)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, float(u[drafts.size]))

    def _bound(self, p, q, k, replacement):
        a = acceptance(p, q, k, replacement)
        return a, a

    def call_uniforms(self, seed, position, gamma, k):
        """Coins (never read) and the target's own draws, keyed by the absolute position of the
        token they decide (:func:`target_uniforms`), as the torch twin draws them."""

        return call_uniforms(seed, position, gamma, k)[0], target_uniforms(seed, position, gamma)

    def chain_step(self, p, q):
        """``(p q, p (1 - q))``: the draft survives as ``y`` iff it is the target's ``y``;
        exact on Fraction laws too."""
        return p * q, p * (1 - q)


RULE = Strict()
