r"""``optimal``: verification whose acceptance equals the LP optimum.

Acceptance: :func:`optimal_acceptance` (:mod:`.cut`: the min-cut prefix scan, exact at full
vocabulary; that module has the structure theorem and its cost).

Sampler and exact law
---------------------
* ``k = 1``: speculative sampling (``token``) *is* optimal (acceptance ``1 - TV``), so
  the rule delegates to it at any ``V``; :func:`joint` is the token joint.
* ``k >= 2``: the rule realises an optimal plan :math:`\pi^\star` of the membership-cost
  LP (the oracle :func:`coupling.lp.solve.solve_coupling`): given the draft tuple ``t``, output
  ``y`` with probability :math:`\pi^\star(t, y) / Q(t)`, by inverse CDF over ``y = 0..V-1``
  with one uniform (:func:`plan_verify`). The plan is :class:`coupling.lp.plan.CutPlan`, built
  through the min cut ``H`` of the prefix scan: a set of drafts with one token in ``H``
  outputs it; the sets hitting ``H`` share their mass over their tokens in ``H``, and the
  sets inside ``H^c`` give each of their tokens exactly ``p`` and send the rest to the
  residual law, by closed forms where they pass their checks and by POT on that part alone
  where not. Each of its parts is solved only when a drafted set needs it, and cached with
  the plan per ``(p, q, k, replacement)`` (LRU of :data:`CACHE_SIZE`). :func:`joint` returns
  the same plan, so the sampler and the joint agree by construction; the law is lossless
  because the plan's columns sum to ``p``, and optimal because its flow meets the cut's value.

  Two drafts never enumerate tuples: the plan is over the ``U(U+1)/2`` sets of the
  support's ``U`` tokens (:func:`coupling.lp.draftsets.pair_sets`), where the whole
  LP had ``U^2`` rows and ``U`` columns. ``k >= 3`` enumerates the tuple law. The plan is
  built while ``T * U`` (``T`` draft tuples: the size of the whole LP, which bounds a part's
  fallback LP) stays within :data:`MAX_PLAN_ENTRIES`. The rule works on the union of the
  supports of ``p`` and ``q`` only (tokens with ``p = q = 0`` play no part).
* ``k >= 3`` i.i.d. drafts, and two past the plan's size (e.g. ``k`` up to 8 on a
  49152-token support): the **race through the min cut** (:mod:`.race`), an exact optimal
  sampler that enumerates nothing (one sort of the support and ``O(U k)`` vector work per
  law), with per-draft coins ``u[:k]`` and the residual draw ``u[k]``; :func:`joint` is its
  exact law (:meth:`.race.RacePlan.conditional`), so sampler and joint again agree by
  construction. ``Optimal(sampler="race")`` uses it for every i.i.d. ``k >= 2``,
  ``Optimal(sampler="plan")`` never. The registry's rule (``"auto"``) keeps the plan for two
  i.i.d. drafts where it fits: on a 64-token support it costs about 0.7 of the race per fresh
  law, while with three drafts its tuple enumeration costs 8 times the race already on 16
  tokens (``python benchmarks/bench_optimal_sampler.py``). Without replacement there is no race
  (its draws are dependent): past the plan's size the rule raises ``ValueError`` rather than
  return a sub-optimal or lossy sampler.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ...dist import num_tuples, tuple_law
from ...lp.cut import optimal_acceptance, optimal_cut, ratio_order
from ...lp.draftsets import group_by_set, padded_sets, pair_index, pair_sets
from ...lp.plan import CutPlan, cut_plan
from ..base import Rule
from ..common import bound_twin, categorical
from ..token import joint as token_joint
from ..token import verify as token_verify
from .race import RacePlan, race_plan

__all__ = ["optimal_acceptance", "optimal_cut", "ratio_order", "CutPlan", "cut_plan",
           "RacePlan", "race_plan", "set_plan", "tuple_plan", "verify", "race_verify",
           "plan_verify", "uses_race", "clear_plan_cache", "Optimal", "RULE",
           "MAX_PLAN_ENTRIES", "SAMPLERS"]

#: Largest ``T * V`` (draft tuples times vocabulary) for which the LP plan is built.
MAX_PLAN_ENTRIES = 4_000_000
CACHE_SIZE = 8
#: how the rule samples ``k >= 2`` drafts: the plan where it fits else the race (i.i.d.)
SAMPLERS = ("auto", "race", "plan")

_cache: OrderedDict = OrderedDict()


def _memo(params: tuple, laws: tuple[np.ndarray, ...], build):
    """The cached plan of ``laws`` and ``params`` (LRU of :data:`CACHE_SIZE`), built by
    ``build()`` on a miss.

    The key holds 64 entries of each law, and a hit is confirmed by comparing the whole laws
    with those stored beside the plan: hashing two full laws of 49152 entries costs more than
    looking a plan up should, where serving brings new laws every call. The
    laws are stored as given: callers pass arrays no one else writes to.
    """
    key = params + tuple((a.shape, a[:: max(1, a.size // 64)].tobytes()) for a in laws)
    hit = _cache.get(key)
    if hit is not None and all(map(np.array_equal, hit[0], laws)):
        _cache.move_to_end(key)
        return hit[1]
    value = build()
    _cache[key] = (laws, value)
    _cache.move_to_end(key)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return value


class SetPlan:
    """The rule's optimal plan, by draft *set* (:class:`.plan.CutPlan`): a tuple's conditional
    output law is its set's row. Sets of two drafts are :func:`coupling.lp.draftsets.pair_sets`;
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
        fix = ("i.i.d. drafts are sampled at any size by the race (Optimal(sampler='auto') "
               "or 'race')") if replacement else ("no exact large-vocabulary sampler for "
                                                  "distinct drafts (replacement=False) is "
                                                  "implemented")
        raise ValueError(
            f"the optimal plan for k={k} >= 2 drafts would have T*V = {T * V:.3g} entries "
            f"(> {MAX_PLAN_ENTRIES:.3g}); {fix}. Use optimal_acceptance for the number, or "
            "rrs/kseq to sample")
    # copies: the cache keeps the laws it compares against, and these are the caller's
    p, q = p.copy(), q.copy()
    return _memo(("plan", k, replacement), (p, q), lambda: SetPlan(p, q, k, replacement))


def uses_race(U: int, k: int, replacement: bool, sampler: str = "auto") -> bool:
    """Whether ``k >= 2`` drafts over a support of ``U`` tokens are sampled by the race (else
    by the plan): always for ``sampler="race"``, never for ``"plan"``; for ``"auto"``, i.i.d.
    drafts with ``k >= 3`` (the plan enumerates ``U^k`` tuples) or where two would make the
    plan exceed :data:`MAX_PLAN_ENTRIES`."""
    if k == 1 or not replacement or sampler == "plan":
        return False
    return sampler == "race" or k >= 3 or num_tuples(U, k, True) * U > MAX_PLAN_ENTRIES


def _on_support(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(support, p_s, q_s)``: the union of the supports and both laws on it, each divided by
    its float64 sum, so float32 laws give the plan distributions. Where several plans are
    optimal, laws one ulp apart (the same law normalised in another summation order) may
    select different ones: each is lossless and optimal, but the output law given the drafts
    is the selected plan's."""
    on = (p > 0) | (q > 0)
    if on.all():                                    # full support: no gathers
        return np.arange(p.size), p / p.sum(), q / q.sum()
    support = np.flatnonzero(on)
    ps, qs = p[support], q[support]
    return support, ps / ps.sum(), qs / qs.sum()


def _race(ps: np.ndarray, qs: np.ndarray, k: int) -> RacePlan:
    return _memo(("race", k), (ps, qs), lambda: race_plan(ps, qs, k))


def race_verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: np.ndarray) -> int:
    """The race's sampler for ``k`` i.i.d. drafts: ``u [k + 1]``, the per-draft
    coins then the residual draw (validated laws; :meth:`.race.RacePlan.verify`)."""
    support, ps, qs = _on_support(p, q)
    plan = _race(ps, qs, drafts.size)
    return int(support[plan.verify(np.searchsorted(support, drafts), u)])


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: np.ndarray, *,
           replacement: bool = True, sampler: str = "auto") -> int:
    """The deterministic core for ``k >= 2`` drafts on validated laws, ``u [k + 1]`` (the coins
    then the draw): the race (:func:`race_verify`) or the plan's row (:func:`plan_verify`), as
    :func:`uses_race` decides."""
    support = int(np.count_nonzero((p > 0) | (q > 0)))
    if uses_race(support, drafts.size, replacement, sampler):
        return race_verify(p, q, drafts, u)
    return plan_verify(p, q, drafts, float(u[-1]), replacement=replacement)


def _race_joint(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Exact law ``[T, V]`` of the race, rows in :func:`coupling.dist.tuple_law` order."""
    support, ps, qs = _on_support(p, q)
    plan = _race(ps, qs, k)
    tuples, probs = tuple_law(q, k)
    J = np.zeros((probs.size, p.size))
    for t in np.flatnonzero(probs > 0):         # a tuple holding a token of q = 0 never occurs
        J[t, support] = probs[t] * plan.conditional(np.searchsorted(support, tuples[t]))
    return J


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


def plan_verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: float, *,
                replacement: bool = True) -> int:
    """The plan's sampler for ``k >= 2`` drafts: one uniform ``u`` for the inverse CDF of the
    plan row of the drafted tuple's set (validated laws)."""
    # Tokens with p = q = 0 are never drafted and never output: build the plan on the union
    # of the supports only. Exact, and what makes the rule usable on a 49152-token
    # vocabulary after top-k / top-p truncation.
    support, ps, qs = _on_support(p, q)
    sp = set_plan(ps, qs, drafts.size, replacement)
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
    """The LP optimum: sample an optimal coupling (the drafted set's row of the plan through
    the cut, or the race through the cut for i.i.d. drafts on wide supports).

    Parameters
    ----------
    sampler : {"auto", "race", "plan"}
        How ``k >= 2`` drafts are sampled (module doc; :func:`uses_race`).
    """

    name = "optimal"
    twin = "coupling.rules.optimal.torch"
    attains_optimum = True
    solves_lp = True
    title = "LP-optimal verification (min-cut value, plan or race through the cut)"
    reference = "Sun et al. 2023 (SpecTr, the LP); Hu et al., ICLR 2025 (the min-cut dual)"
    bound_text = "= OPT (LP optimum, min-cut prefix scan; Hu et al. 2025)"

    def __init__(self, sampler: str = "auto"):
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.sampler = sampler

    def _race(self, p, q, k, replacement) -> bool:
        return uses_race(int(np.count_nonzero((p > 0) | (q > 0))), k, replacement, self.sampler)

    def _acceptance(self, p, q, k, replacement):
        return optimal_acceptance(p, q, k, replacement=replacement)

    def _joint(self, p, q, k, replacement):
        if k == 1:
            return token_joint(p, q)
        if self._race(p, q, k, replacement):
            return _race_joint(p, q, k)
        return tuple_plan(p, q, k, replacement)[0]

    def _verify(self, p, q, drafts, u, replacement):
        if drafts.size == 1:   # speculative sampling is optimal for one draft
            return token_verify(p, q, int(drafts[0]), float(u[0]), float(u[1]))
        return verify(p, q, drafts, u, replacement=replacement, sampler=self.sampler)

    @property
    def torch(self):
        """The batched twin, bound to this instance's sampler."""
        return bound_twin(super().torch, self)

    def __repr__(self) -> str:
        return f"<rule 'optimal': {self.title}, sampler={self.sampler!r}>"

    def _bound(self, p, q, k, replacement):
        a = optimal_acceptance(p, q, k, replacement=replacement)
        return a, a


RULE = Optimal()
