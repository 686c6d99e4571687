r"""``optimal``: verification whose acceptance equals the LP optimum.

Acceptance: :func:`optimal_acceptance` (:mod:`.cut`: the min-cut prefix scan, exact at full
vocabulary; that module has the structure theorem and its cost).

Sampler and exact law
---------------------
* ``k = 1``: speculative sampling (``token``) *is* optimal (acceptance ``1 - TV``), so
  the rule delegates to it at any ``V``; :func:`joint` is the token joint.
* ``k >= 2``: the rule realises an optimal plan :math:`\pi^\star` of the membership-cost
  LP (the oracle :func:`coupling.solve.solve_coupling`): given the draft tuple ``t``, output
  ``y`` with probability :math:`\pi^\star(t, y) / Q(t)`, by inverse CDF over ``y = 0..V-1``
  with one uniform (:func:`verify`). The plan is :class:`.plan.CutPlan`, built
  through the min cut ``H`` of the prefix scan: a set of drafts with one token in ``H``
  outputs it; the sets hitting ``H`` share their mass over their tokens in ``H``, and the
  sets inside ``H^c`` give each of their tokens exactly ``p`` and send the rest to the
  residual law, by closed forms where they pass their checks and by POT on that part alone
  where not. Each of its parts is solved only when a drafted set needs it, and cached with
  the plan per ``(p, q, k, replacement)`` (LRU of :data:`CACHE_SIZE`). :func:`joint` returns
  the same plan, so the sampler and the joint agree by construction; the law is lossless
  because the plan's columns sum to ``p``, and optimal because its flow meets the cut's value.

  Two drafts never enumerate tuples: the plan is over the ``U(U+1)/2`` sets of the
  support's ``U`` tokens (:func:`coupling.draftsets.pair_sets`), where the whole
  LP had ``U^2`` rows and ``U`` columns. ``k >= 3`` enumerates the tuple law. The rule
  raises ``ValueError`` when ``T * U`` (``T`` draft tuples: the size of the whole LP, which
  bounds a part's fallback LP) exceeds :data:`MAX_PLAN_ENTRIES`. The rule works on
  the union of the supports of ``p`` and ``q`` only (tokens with ``p = q = 0`` play no
  part), so with top-k / top-p truncated laws it runs at any vocabulary size. **No exact
  sampler for wide supports is implemented** (the pair sets grow as ``U^2``); asking for one
  raises instead of silently returning a sub-optimal or lossy sampler.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...dist import num_tuples, tuple_law
from ...draftsets import group_by_set, padded_sets, pair_index, pair_sets
from ..base import Rule
from ..common import categorical
from ..token import joint as token_joint
from ..token import verify as token_verify
from .cut import optimal_acceptance, optimal_cut, ratio_order
from .plan import CutPlan, cut_plan

__all__ = ["optimal_acceptance", "optimal_cut", "ratio_order", "CutPlan", "cut_plan",
           "set_plan", "tuple_plan", "verify", "clear_plan_cache", "Optimal", "RULE",
           "MAX_PLAN_ENTRIES"]

#: Largest ``T * V`` (draft tuples times vocabulary) for which the LP plan is built.
MAX_PLAN_ENTRIES = 4_000_000
CACHE_SIZE = 8

_cache: OrderedDict = OrderedDict()


class SetPlan:
    """The rule's optimal plan, by draft *set* (:class:`.plan.CutPlan`): a tuple's conditional
    output law is its set's row. Sets of two drafts are :func:`coupling.draftsets.pair_sets`;
    for ``k >= 3``, ``tuple_set[t]`` is the set of ``tuple_law``'s tuple ``t``."""

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool):
        self.tuple_set = self.tuples = None
        if k == 2:
            sets, mass = pair_sets(q, replacement)
        else:
            self.tuples, probs = tuple_law(q, k, replacement=replacement)
            self.tuple_set, mass, members = group_by_set(self.tuples, probs, p.size)
            sets = padded_sets(members)
        self.plan = CutPlan(p, q, k, replacement, sets, mass)


def set_plan(p: np.ndarray, q: np.ndarray, k: int, replacement: bool) -> SetPlan:
    """Cached optimal plan over draft sets (:class:`SetPlan`), for validated ``p, q``; its
    parts are solved as rows ask for them."""
    V = p.size
    T = num_tuples(V, k, replacement)
    if T * V > MAX_PLAN_ENTRIES:
        raise ValueError(
            f"the optimal rule for k={k} >= 2 samples from an exact LP plan with T*V = {T * V:.3g} "
            f"entries (> {MAX_PLAN_ENTRIES:.3g}); no exact large-vocabulary sampler for k >= 2 is "
            "implemented. Use optimal_acceptance for the number, or rrs/kseq to sample")
    key = (p.tobytes(), q.tobytes(), k, replacement)
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    _cache[key] = SetPlan(p, q, k, replacement)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return _cache[key]


def tuple_plan(p: np.ndarray, q: np.ndarray, k: int,
               replacement: bool) -> tuple[np.ndarray, np.ndarray]:
    """The rule's optimal plan over draft tuples, ``(plan [T, V], tuples [T, k])`` in
    :func:`coupling.dist.tuple_law` order: each tuple gets its set's row of :func:`set_plan`,
    scaled to the tuple's probability (so the sampler and this joint agree by construction)."""
    sp = set_plan(p, q, k, replacement)
    tuples, probs = tuple_law(q, k, replacement=replacement)
    rows = pair_index(tuples[:, 0], tuples[:, 1], p.size, replacement) if k == 2 \
        else sp.tuple_set
    P = sp.plan.dense()
    set_mass = P.sum(axis=1)[rows]
    share = np.divide(probs, set_mass, out=np.zeros_like(probs), where=set_mass > 0)
    return P[rows] * share[:, None], tuples


def clear_plan_cache() -> None:
    """Forget the cached plans (to time a fresh solve: on real text every call brings new
    laws, so the cache never hits there)."""
    _cache.clear()


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: float, *,
           replacement: bool = True) -> int:
    """Deterministic core for ``k >= 2`` drafts: one uniform ``u`` for the inverse CDF of the
    plan row of the drafted tuple's set (validated laws)."""
    # Tokens with p = q = 0 are never drafted and never output: build the plan on the union
    # of the supports only. Exact, and what makes the rule usable on a 49152-token
    # vocabulary after top-k / top-p truncation.
    support = np.flatnonzero((p > 0) | (q > 0))
    # renormalised on the support, so float32 laws give the plan distributions. Where several
    # plans are optimal, laws one ulp apart (the same law normalised in another summation
    # order) may select different ones: every one is lossless and optimal, but the output law
    # given the drafts is the selected plan's
    ps, qs = p[support], q[support]
    sp = set_plan(ps / ps.sum(), qs / qs.sum(), drafts.size, replacement)
    local = np.searchsorted(support, drafts)
    if drafts.size == 2:
        s = int(pair_index(int(local[0]), int(local[1]), support.size, replacement))
    else:   # one row is read per call: match it in numpy rather than build a tuple -> row dict
        hit = np.flatnonzero((sp.tuples == local).all(1))
        s = int(sp.tuple_set[hit[0]]) if hit.size else -1
    if s < 0:
        raise ValueError(f"drafts {drafts.tolist()} are no draft tuple of this rule (without "
                         "replacement the k drafts must be distinct)")
    row = sp.plan.row(s)
    if not row.sum() > 0:   # the plan's row is the tuple's mass: no conditional law to sample
        raise ValueError(f"drafts {drafts.tolist()} have probability 0 as a tuple under q (in "
                         "float64: a product of tiny q's underflows); the optimal plan gives "
                         "them no output law, so they cannot be verified by it")
    return int(support[categorical(row, u)])


class Optimal(Rule):
    """The LP optimum: sample the drafted set's row of an optimal coupling."""

    name = "optimal"
    title = "LP-optimal verification (min-cut value, plan built through the cut)"
    reference = "Sun et al. 2023 (SpecTr, the LP); Hu et al., ICLR 2025 (the min-cut dual)"
    bound_text = "= OPT (LP optimum, min-cut prefix scan; Hu et al. 2025)"

    def _acceptance(self, p, q, k, replacement):
        return optimal_acceptance(p, q, k, replacement=replacement)

    def _joint(self, p, q, k, replacement):
        return token_joint(p, q) if k == 1 else tuple_plan(p, q, k, replacement)[0]

    def _verify(self, p, q, drafts, u, replacement):
        if drafts.size == 1:   # speculative sampling is optimal for one draft
            return token_verify(p, q, int(drafts[0]), float(u[0]), float(u[1]))
        return verify(p, q, drafts, float(u[-1]), replacement=replacement)

    def _bound(self, p, q, k, replacement):
        a = optimal_acceptance(p, q, k, replacement=replacement)
        return a, a


RULE = Optimal()
