r"""Accept-set rules: the shared core of the lossy rules ``typical`` and ``relaxed``.

An accept-set rule reads the target law ``p`` only (never ``q``). From ``p`` it builds a set
:math:`A(p)` of acceptable tokens (tokens of zero target probability never belong to it) and a
fallback law :math:`f(p)`. Given ``k`` drafts it outputs the acceptable draft of highest
``p`` (ties: lowest token id), and if no draft is acceptable a draw from ``f`` (inverse CDF
with the last uniform ``u[k]``; the coins ``u[:k]`` are not read). Its output law is not
``p`` in general: the rules built on it are **lossy**, and report their exact law.

Exact output law
----------------
Order :math:`A` by priority (``p`` decreasing, then id), :math:`a_1, a_2, \dots`, and let
:math:`h_j = P(\text{some draft lies in } \{a_1, \dots, a_j\})`. The output is :math:`a_j`
exactly when a draft hits the first ``j`` of them but not the first ``j - 1``, so

.. math:: \nu = \sum_j (h_j - h_{j-1})\, \delta_{a_j} + (1 - h_{|A|})\, f .

:math:`h_j` is :func:`coupling.lp.cut.hit_prefixes` along that order: closed form
for i.i.d. drafts (:math:`1 - (1 - q(a_1..a_j))^k`, any ``V``) and for two distinct drafts;
enumeration for ``k >= 3`` distinct drafts (small ``V``). The distortion is
:math:`\mathrm{TV}(\nu, p)`. Acceptance (the output is one of the drafts):

.. math:: \alpha = h_{|A|} + \sum_{y \notin A} f(y)\, P(\text{no draft in } A,\ y \text{ drafted}),

the last factor from :func:`coupling.lp.draftsets.inclusion`.

Derived here and checked exactly against the enumerated joint (``tests/rules/``).
"""

from __future__ import annotations

import math

import numpy as np

from ..dist import tuple_law
from ..lp.cut import hit_prefixes
from ..lp.draftsets import inclusion
from .base import Rule
from .common import bound_twin, categorical

__all__ = ["priority", "output_law", "acceptance", "joint", "verify", "chain_step",
           "non_negative", "choice", "AcceptSetRule"]


def non_negative(value: float, name: str) -> float:
    """A rule parameter as a finite float ``>= 0``, else ``ValueError`` naming it (bools are
    refused: ``True`` would read as 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def choice(value: str, name: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else ``ValueError`` naming ``name``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def priority(p: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """The acceptable tokens by ``p`` decreasing, ties by lower id."""
    a = np.flatnonzero(accept)
    return a[np.lexsort((a, -p[a]))]


def _hits(p: np.ndarray, q: np.ndarray, k: int, replacement: bool,
          accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(chain, h)``: the acceptable tokens in priority order and ``h_0..h_|A|``."""
    chain = priority(p, accept)
    order = np.concatenate([chain, np.flatnonzero(~accept)])
    return chain, np.clip(hit_prefixes(q, k, replacement, order)[: chain.size + 1], 0.0, 1.0)


def output_law(p: np.ndarray, q: np.ndarray, k: int, replacement: bool, accept: np.ndarray,
               fallback: np.ndarray) -> np.ndarray:
    """Exact law ``[V]`` of the output token (module doc)."""
    chain, h = _hits(p, q, k, replacement, accept)
    nu = (1.0 - h[-1]) * fallback
    nu[chain] += np.maximum(np.diff(h), 0.0)
    return nu


def acceptance(p: np.ndarray, q: np.ndarray, k: int, replacement: bool, accept: np.ndarray,
               fallback: np.ndarray) -> float:
    """Exact ``P(output is one of the drafts)`` (module doc)."""
    _, h = _hits(p, q, k, replacement, accept)
    rest = fallback * ~accept
    extra = float(np.dot(rest, inclusion(q, k, replacement, avoid=accept))) if rest.any() else 0.0
    return float(h[-1]) + extra


def joint(p: np.ndarray, q: np.ndarray, k: int, replacement: bool, accept: np.ndarray,
          fallback: np.ndarray) -> np.ndarray:
    """Exact law ``[T, V]`` of (draft tuple, output) by enumeration, rows in
    :func:`coupling.dist.tuple_law` order."""
    tuples, probs = tuple_law(q, k, replacement=replacement)
    J = np.outer(probs, fallback)
    rank = np.full(p.size, p.size)
    chain = priority(p, accept)
    rank[chain] = np.arange(chain.size)
    best = rank[tuples].min(axis=1)                        # the best acceptable draft's rank
    hit = np.flatnonzero(best < p.size)
    J[hit] = 0.0
    J[hit, chain[best[hit]]] = probs[hit]
    return J


def verify(p: np.ndarray, drafts: np.ndarray, accept: np.ndarray, fallback: np.ndarray,
           u_fallback: float) -> int:
    """Deterministic core: the acceptable draft of highest ``p`` (ties: lowest id), else the
    inverse-CDF draw of ``fallback`` at ``u_fallback``."""
    ok = drafts[accept[drafts]]
    if ok.size:
        return int(ok[np.lexsort((ok, -p[ok]))[0]])
    return categorical(fallback, u_fallback)


def chain_step(q: np.ndarray, accept: np.ndarray,
               fallback: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One draft: ``(stay, stop)``, P(draft = output = y) and P(output = y != draft)."""
    stay = np.where(accept, q, q * fallback)
    nu = np.where(accept, q, 0.0) + float(q[~accept].sum()) * fallback
    return stay, np.maximum(nu - stay, 0.0)


class AcceptSetRule(Rule):
    """A lossy rule given by ``accept_set(p)`` and ``fallback_law(p)`` (module doc)."""

    lossless = False

    def accept_set(self, p: np.ndarray) -> np.ndarray:
        """Boolean mask ``[V]`` of the acceptable tokens (validated ``p``)."""
        raise NotImplementedError

    def fallback_law(self, p: np.ndarray) -> np.ndarray:
        """Law ``[V]`` drawn from when no draft is acceptable (validated ``p``)."""
        raise NotImplementedError

    def _parts(self, p):
        return self.accept_set(p) & (p > 0), self.fallback_law(p)

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k, replacement, *self._parts(p))

    def _output_law(self, p, q, k, replacement):
        return output_law(p, q, k, replacement, *self._parts(p))

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k, replacement, *self._parts(p))

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, drafts, *self._parts(p), float(u[drafts.size]))

    def _bound(self, p, q, k, replacement):
        a = acceptance(p, q, k, replacement, *self._parts(p))
        return a, a

    def chain_step(self, p, q):
        return chain_step(q, *self._parts(p))

    @property
    def torch(self):
        """The batched twin, bound to this instance's parameters."""
        return bound_twin(super().torch, self)
