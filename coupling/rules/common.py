"""Small pieces every rule uses: inverse-CDF draws, residuals, explicit randomness."""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["categorical", "residual", "normalise", "require_generator", "check_uniforms",
           "bound_twin"]


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


def normalise(v: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """``v / v.sum()`` (float64 or exact Fractions), or ``fallback`` where ``v`` has no mass: a
    residual of zero mass belongs to a stop of probability 0, and callers never see NaN."""
    s = v.sum()
    return v / s if s > 0 else fallback


def require_generator(rng: np.random.Generator) -> np.random.Generator:
    """Every sampler takes an explicit generator: reject the legacy global state and seeds."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError("rng must be a numpy.random.Generator (np.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def check_uniforms(u: ArrayLike, n: int, *, open_interval: bool = False,
                   name: str = "u") -> np.ndarray:
    """``u`` as float64 ``[n]`` in ``[0, 1)`` (``(0, 1)`` with ``open_interval``), else
    ``ValueError`` naming ``name``."""
    arr = np.asarray(u, dtype=np.float64) if not isinstance(u, np.ndarray) else u
    if arr.dtype.kind != "f" or arr.shape != (n,):
        raise ValueError(f"{name} must be {n} float uniforms, got shape {np.shape(u)} "
                         f"of dtype {arr.dtype}")
    low_ok = (arr > 0) if open_interval else (arr >= 0)
    if not (low_ok & (arr < 1)).all():
        span = "(0, 1)" if open_interval else "[0, 1)"
        raise ValueError(f"{name} must lie in {span}, got {arr.tolist()}")
    return arr.astype(np.float64, copy=False)


def bound_twin(module: ModuleType, rule) -> SimpleNamespace:
    """A rule's torch twin bound to a parameterised instance: ``verify`` and ``make_step`` of
    ``module`` with ``rule=rule`` (the registry's instance is the twin's default)."""
    return SimpleNamespace(verify=functools.partial(module.verify, rule=rule),
                           make_step=functools.partial(module.make_step, rule=rule))
