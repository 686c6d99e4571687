r"""``optimal``: verification whose acceptance equals the LP optimum.

Acceptance: :func:`coupling.optimal.optimal_acceptance` (min-cut prefix scan, exact at
full vocabulary; see that module for the structure theorem and its cost).

Sampler and exact law
---------------------
* ``k = 1``: speculative sampling (``token``) *is* optimal (acceptance ``1 - TV``), so
  the rule delegates to it at any ``V``; :func:`joint` is the token joint.
* ``k >= 2``: the rule realises an optimal LP plan :math:`\pi^\star` of
  :func:`coupling.solve.solve_coupling` (``solver="pot"``): given the draft tuple ``t``,
  output ``y`` with probability :math:`\pi^\star(t, y) / Q(t)`, by inverse CDF over
  ``y = 0..V-1`` with one uniform (:func:`verify`). The plan is computed once per
  ``(p, q, k, replacement)`` and cached (LRU of :data:`CACHE_SIZE`). :func:`joint` returns
  the same plan, so the sampler and the joint agree by construction, and the law is
  lossless because :math:`\pi^\star` has column sums ``p``.

  This is exact but needs the LP over the enumerated tuple law. The sampler solves it on
  the union of the supports of ``p`` and ``q`` only (tokens with ``p = q = 0`` play no
  part), so with top-k / top-p truncated laws it runs at any vocabulary size; it raises
  ``ValueError`` when ``T * |support|`` exceeds :data:`MAX_PLAN_ENTRIES`. **No exact large-V
  sampler for k >= 2 is implemented**: we did not build (and do not approximate) a
  selection rule realising the optimal selected-token law in the base polytope of the
  coverage function; asking for one raises instead of silently returning a sub-optimal
  or lossy sampler.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
from numpy.typing import ArrayLike

from ..optimal import optimal_acceptance
from . import token as _token
from ._base import (
    Rule,
    categorical,
    prepare,
    require_distinct,
    require_supported,
    sample_uniform,
)

__all__ = ["acceptance", "joint", "sample", "verify", "bound", "plan", "clear_plan_cache", "RULE",
           "MAX_PLAN_ENTRIES"]

#: Largest ``T * V`` (draft tuples times vocabulary) for which the LP plan is built.
MAX_PLAN_ENTRIES = 4_000_000
CACHE_SIZE = 8
BOUND_TEXT = "= OPT (LP optimum, min-cut prefix scan; Hu et al. 2025)"

_cache: OrderedDict = OrderedDict()


def _supports(k: int, replacement: bool) -> bool:
    return k >= 1


def acceptance(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> float:
    k = require_supported(RULE, k, replacement)
    return optimal_acceptance(p, q, k, replacement=replacement)


def plan(p: np.ndarray, q: np.ndarray, k: int, replacement: bool):
    """Cached ``(plan [T, V], tuples [T, k])`` of an optimal LP coupling: row ``t`` of the plan
    is the draft tuple ``tuples[t]`` (:func:`coupling.dist.tuple_law` order)."""
    from ..solve import solve_coupling

    V = p.size
    T = V**k if replacement else math.perm(V, k)
    if T * V > MAX_PLAN_ENTRIES:
        raise ValueError(
            f"the optimal rule for k={k} >= 2 samples from an exact LP plan with T*V = {T * V:.3g} "
            f"entries (> {MAX_PLAN_ENTRIES:.3g}); no exact large-vocabulary sampler for k >= 2 is "
            "implemented. Use optimal_acceptance for the number, or rrs/kseq to sample"
        )
    key = (p.tobytes(), q.tobytes(), k, replacement)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    c = solve_coupling(p, q, k, replacement=replacement, solver="pot")
    _cache[key] = (c.plan, c.tuples)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return _cache[key]


def clear_plan_cache() -> None:
    """Forget the cached LP plans (benchmarks time a fresh solve: on real text every
    verification call brings new laws, so the cache never hits there)."""
    _cache.clear()


def joint(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> np.ndarray:
    k = require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    if k == 1:
        return _token.joint(pa, qa)
    return plan(pa, qa, k, replacement)[0].copy()


def verify(
    p: np.ndarray,
    q: np.ndarray,
    drafts: np.ndarray,
    u: float,
    *,
    replacement: bool = True,
    u_resid: float | None = None,
) -> int:
    """Deterministic core. ``k = 1``: token rule with ``(u, u_resid)``; ``k >= 2``: one
    uniform ``u`` for the inverse CDF of the plan row of the tuple."""
    if drafts.size == 1:
        return _token.verify(p, q, int(drafts[0]), u, 0.5 if u_resid is None else u_resid)
    # Tokens with p = q = 0 are never drafted and never output: solve the LP on the union
    # of the supports only. Exact, and what makes the rule usable on a 49152-token
    # vocabulary after top-k / top-p truncation.
    support = np.flatnonzero((p > 0) | (q > 0))
    P, tuples = plan(p[support], q[support], drafts.size, replacement)
    # one row is read per call: matching it costs O(T k) in numpy, where a tuple -> row dict
    # cost a Python tuple per row to build, a third of the call on the demo's laws (stop 29)
    hit = np.flatnonzero((tuples == np.searchsorted(support, drafts)).all(1))
    if hit.size == 0:
        raise ValueError(f"drafts {drafts.tolist()} are no draft tuple of this rule (without "
                         "replacement the k drafts must be distinct)")
    row = P[hit[0]]
    if not row.sum() > 0:   # the plan's row is the tuple's mass: no conditional law to sample
        raise ValueError(f"drafts {drafts.tolist()} have probability 0 as a tuple under q (in "
                         "float64: a product of tiny q's underflows); the optimal plan gives "
                         "them no output law, so they cannot be verified by it")
    return int(support[categorical(row, u)])


def sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    pa, qa, d = prepare(p, q, drafts)
    k = require_supported(RULE, d.size, replacement)
    require_distinct(d, replacement)
    if k == 1:
        return _token.verify(pa, qa, int(d[0]), sample_uniform(rng), sample_uniform(rng))
    return verify(pa, qa, d, sample_uniform(rng), replacement=replacement)


def bound(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, float]:
    a = acceptance(p, q, k, replacement=replacement)
    return (a, a)


RULE = Rule(
    name="optimal",
    support_text="the optimal rule supports any k >= 1, with or without replacement",
    bound_text=BOUND_TEXT,
    _supports=_supports,
    _acceptance=acceptance,
    _joint=joint,
    _sample=sample,
    _bound=bound,
)
