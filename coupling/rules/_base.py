"""Shared machinery for the single-step verification rules.

A *rule* turns ``k`` drafted tokens (drawn from the draft law ``q``) into one output
token whose law is exactly the target ``p``. Each rule module exposes plain functions
(``acceptance``, ``joint``, ``sample``, ``bound`` and a deterministic ``verify`` core that
takes explicit uniforms) and a :class:`Rule` object bundling them for
:data:`coupling.rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from ..dist import check_pair, validate_drafts, validate_k, validate_replacement

__all__ = [
    "Rule",
    "categorical",
    "require_supported",
    "require_distinct",
    "require_generator",
    "prepare",
    "residual",
    "sample_uniform",
]


def categorical(weights: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from non-negative ``weights`` (need not sum to 1) with uniform ``u``.

    Returns the first index ``i`` with ``cumsum(weights)[i] > u * sum(weights)``; an index
    of zero weight is never returned (its cumulative sum equals its predecessor's), and
    ``u`` rounding up to the total falls back to the last index of positive weight.
    """
    w = np.asarray(weights, dtype=np.float64)
    c = np.cumsum(w)
    total = c[-1]
    if not total > 0:
        raise ValueError("categorical: weights sum to zero; nothing to sample")
    i = int(np.searchsorted(c, u * total, side="right"))
    if i >= w.size or w[i] <= 0:
        i = int(np.flatnonzero(w > 0)[-1])
    return i


def require_generator(rng: np.random.Generator) -> np.random.Generator:
    """Every sampler takes an explicit generator: reject the legacy global state and seeds."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(
            "rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
            f"got {type(rng).__name__}"
        )
    return rng


def sample_uniform(rng: np.random.Generator) -> float:
    """One uniform on [0, 1) from an explicit generator (type-checked)."""
    return float(require_generator(rng).random())


def residual(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
    r"""Normalised residual :math:`(p - q)_+ / \sum (p - q)_+` and its mass ``sum (p - q)_+``.

    When the mass is zero (``p <= q`` everywhere, i.e. ``p == q`` for distributions) the
    residual is never used; ``p`` is returned so callers stay well defined.
    """
    d = np.maximum(p - q, 0.0)
    z = float(d.sum())
    if z <= 0.0:
        return p.copy(), 0.0
    return d / z, z


def require_supported(rule: Rule, k: int, replacement: bool) -> int:
    k = validate_k(k)
    replacement = validate_replacement(replacement)
    if not rule.supports(k, replacement):
        raise ValueError(
            f"rule {rule.name!r} does not support k={k}, replacement={replacement}; "
            f"{rule.support_text}"
        )
    return k


def require_distinct(drafts: np.ndarray, replacement: bool) -> None:
    """Drafts without replacement are distinct by construction: a repeat is a caller error."""
    if not replacement and np.unique(drafts).size != drafts.size:
        raise ValueError(
            f"drafts {drafts.tolist()} repeat a token but replacement=False promises distinct "
            "drafts; pass replacement=True for i.i.d. drafts"
        )


def prepare(
    p: ArrayLike, q: ArrayLike, drafts: ArrayLike | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Validate ``(p, q)`` and optionally the drafted tokens against ``q``."""
    pa, qa = check_pair(p, q)
    d = None if drafts is None else validate_drafts(drafts, qa)
    return pa, qa, d


@dataclass(frozen=True)
class Rule:
    """A single-step verification rule (see the module of the same name for its math).

    Methods mirror the module functions: ``acceptance`` (closed form), ``joint`` (exact
    law of (draft tuple, output) with rows in :func:`coupling.dist.tuple_law` order),
    ``sample`` (one verification step), ``bound`` (the rule's own guarantee).
    """

    name: str
    support_text: str
    bound_text: str
    _supports: Callable[[int, bool], bool] = field(repr=False)
    _acceptance: Callable[..., float] = field(repr=False)
    _joint: Callable[..., np.ndarray] = field(repr=False)
    _sample: Callable[..., int] = field(repr=False)
    _bound: Callable[..., tuple[float, float]] = field(repr=False)

    def supports(self, k: int, replacement: bool = True) -> bool:
        return bool(self._supports(int(k), bool(replacement)))

    def acceptance(
        self, p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
    ) -> float:
        return self._acceptance(p, q, k, replacement=replacement)

    def joint(
        self, p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
    ) -> np.ndarray:
        return self._joint(p, q, k, replacement=replacement)

    def sample(
        self,
        p: ArrayLike,
        q: ArrayLike,
        drafts: ArrayLike,
        rng: np.random.Generator,
        *,
        replacement: bool = True,
    ) -> int:
        return self._sample(p, q, drafts, rng, replacement=replacement)

    def bound(
        self, p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
    ) -> tuple[float, float]:
        return self._bound(p, q, k, replacement=replacement)
