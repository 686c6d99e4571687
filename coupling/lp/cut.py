r"""Exact optimal multi-draft acceptance at full vocabulary (min-cut prefix scan).

Let :math:`Q` be the law of ``k`` drafts from ``q`` and ``p`` the target. The optimal
acceptance (the membership-cost LP of :func:`coupling.lp.solve.solve_coupling`) is a maximum
bipartite flow from draft tuples to the tokens they contain, so by max-flow/min-cut

.. math::

    \alpha^\star = \min_{H \subseteq [V]} \; 1 - p(H) + P(\text{some draft lies in } H)
                 = \min_H \; p(H^c) + 1 - P(\text{all drafts avoid } H).

(The cut either pays the source edge of a tuple or the sink edges of the tokens it can
reach; ``H`` is the set of tokens whose sink edge is *not* cut.) See Hu et al. 2025,
"Towards Optimal Multi-draft Speculative Decoding" (ICLR 2025), which derives the same
subset-selection dual.

Prefix structure
----------------
Sort tokens by :math:`p(x)/q(x)` decreasing (``q = 0 < p`` first, ratio :math:`+\infty`).

* With replacement, :math:`P(\text{hit } H) = F(q(H))`, :math:`F(s) = 1 - (1-s)^k`
  concave. If :math:`y \notin H` had a larger ratio than :math:`x \in H`, optimality of
  ``H`` against ``H + y`` and ``H - x`` gives
  :math:`p_y \le F(s+q_y) - F(s) \le q_y F'(s)` and :math:`p_x \ge F(s) - F(s-q_x) \ge q_x F'(s)`,
  so :math:`p_y/q_y \le F'(s) \le p_x/q_x`: some optimal ``H`` is a prefix (equal ratios:
  the objective is concave along a tie group, so all-or-none of it is optimal).
  Checked in ``proofs/multidraft_mincut.py`` (symbolic exchange step + exhaustive check
  over all subsets).
* Without replacement (successive sampling), ``P(hit H)`` is not a function of ``q(H)``.
  That the best ``H`` is still a prefix of the same order is checked exhaustively over all
  ``2^V`` subsets on random instances in ``proofs/multidraft_mincut.py`` (no symbolic
  proof here). The prefix values need :math:`P(\text{hit } H_m)`:
  ``k = 1``: :math:`q(H)`; ``k = 2``:
  :math:`P(\text{hit } H) = q(H) + \sum_{a \in C} q_a\, q(H)/(1 - q_a) = q(H)(1 + A_C)` with
  :math:`C = H^c` and the suffix sums :math:`A_C = \sum_{a \in C} q_a/(1-q_a)` (a sum of
  non-negative terms; :math:`1 - q_a` is taken as the sum of the other entries)
  (O(V log V)); ``k >= 3``: one pass over the
  enumerated tuple law, binning each tuple's mass by its smallest rank in the order
  (a tuple hits :math:`H_m` iff its minimum rank is ``< m``), cost O(V^k k), limited by
  :data:`coupling.dist.MAX_TUPLES`. A fast exact large-V method for ``k >= 3`` without
  replacement is not implemented (``ValueError`` says so).

Cost with replacement: one ``argsort`` of ``V`` ratios plus a few cumulative sums.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..dist import (
    MAX_TUPLES,
    check_pair,
    num_tuples,
    tuple_law,
    validate_k,
    validate_replacement,
)
from .draftsets import others_sum

__all__ = ["optimal_acceptance", "optimal_cut", "ratio_order", "hit_prefixes", "scan",
           "scan_order"]


def ratio_order(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Token order by ``p/q`` decreasing; ``q = 0 < p`` first, ``p = q = 0`` last."""
    m = q > 0
    full = bool(m.all())                       # no q = 0: no masks (a full-support softmax)
    with np.errstate(over="ignore"):
        ratio = p / q if full else np.where(m, p / np.where(m, q, 1.0), np.inf)
    if np.isinf(ratio if full else ratio[m]).any():
        # p / (subnormal q) overflows, and overflowed ratios would tie with each other and
        # with q = 0 < p; their order decides the cut without replacement: compare logarithms
        with np.errstate(divide="ignore"):
            ratio = np.where(m, np.log(p) - np.log(np.where(m, q, 1.0)), np.inf)
    if not full:
        ratio[(p == 0) & ~m] = -np.inf
    # numpy's default (SIMD quicksort) argsort is ~7x faster than a stable sort here; the
    # order inside a group of equal ratios is irrelevant with replacement (the objective is
    # concave along a tie group, so the best cut takes all of it or none); without
    # replacement this is checked exhaustively (proofs/multidraft_mincut.py, ties included)
    return np.argsort(-ratio)


def hit_prefixes(q: np.ndarray, k: int, replacement: bool, order: np.ndarray) -> np.ndarray:
    """``P(some of the k drafts lies in H_m)`` for every prefix ``H_m = order[:m]``, m = 0..V.

    Written as sums of non-negative terms wherever possible, so that no prefix value loses
    digits to cancellation (e.g. a token with ``q`` close to 1 drawn without replacement).
    """
    qs = q[order]
    if replacement and k > 1:
        # 1 - (1 - s)^k with 1 - s taken as the tail sum q(C_m), C_m = order[m:] (accurate
        # when s is close to 1)
        return 1.0 - np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]]) ** k
    head_q = np.concatenate([[0.0], np.cumsum(qs)])  # q(H_m)
    if k == 1:
        return head_q
    if k == 2:
        # P(hit) = q(H) + sum_{a in C} q_a q(H) / (1 - q_a) = q(H) (1 + A_C) + the term of b.
        # Only the likeliest token b can have 1 - q_b < 1/2; when it is tiny (subnormal),
        # q_b / (1 - q_b) overflows and 0 * inf poisons the prefix. Its term is taken as
        # q_b * (q(H) / (1 - q_b)) instead: q(H) <= 1 - q_b while b is outside H, a ratio <= 1.
        rest = others_sum(qs)
        j = int(np.argmax(qs))
        others = np.arange(qs.size) != j
        terms = np.divide(qs, rest, out=np.zeros_like(qs), where=others)   # each <= 2
        A = np.concatenate([np.cumsum(terms[::-1])[::-1], [0.0]])
        b_out = np.arange(qs.size + 1) <= j                                # b in C_m
        share = np.divide(head_q, rest[j], out=np.zeros_like(head_q), where=b_out & (rest[j] > 0))
        b_term = np.where(b_out, qs[j] * np.minimum(share, 1.0), 0.0)
        return np.minimum(head_q * (1.0 + A) + b_term, 1.0)
    V = q.size
    tuples, probs = tuple_law(q, k, replacement=False)
    rank = np.empty(V, dtype=np.int64)
    rank[order] = np.arange(V)
    mins = rank[tuples].min(axis=1)
    hist = np.bincount(mins, weights=probs, minlength=V)
    # hit H_m  <=>  the tuple's smallest rank is < m
    return np.concatenate([[0.0], np.cumsum(hist)])


def optimal_cut(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, np.ndarray]:
    """Optimal acceptance and a minimising token set ``H`` (the first ``m`` tokens of
    :func:`ratio_order`), as an int64 array of token ids."""
    pa, qa = check_pair(p, q)
    k = validate_k(k)
    replacement = validate_replacement(replacement)
    V = pa.size
    if not replacement and k > 1:
        nz = int(np.count_nonzero(qa))
        if nz < k:
            raise ValueError(
                f"cannot draw k={k} distinct tokens without replacement: q has only {nz} token(s) "
                "of positive probability; lower k or use replacement=True"
            )
        if k >= 3:
            T = num_tuples(V, k, False)
            if T > MAX_TUPLES:
                raise ValueError(
                    f"exact optimum without replacement for k={k} >= 3 enumerates the tuple law "
                    f"({T:.3g} tuples > {MAX_TUPLES:.3g}); no exact large-V method is implemented "
                    "for k >= 3 without replacement: use k <= 2, replacement=True, or a smaller V"
                )
    return scan(pa, qa, k, replacement)


def scan(pa: np.ndarray, qa: np.ndarray, k: int, replacement: bool) -> tuple[float, np.ndarray]:
    """The prefix scan on validated inputs (for callers that validated ``p``, ``q`` once)."""
    value, order, m = scan_order(pa, qa, k, replacement)
    return value, order[:m].astype(np.int64)


def scan_order(pa: np.ndarray, qa: np.ndarray, k: int,
               replacement: bool) -> tuple[float, np.ndarray, int]:
    """:func:`scan` keeping its sort: ``(value, ratio order, m)``, the cut being
    ``order[:m]`` (the race sampler reuses the order rather than sort twice)."""
    order = ratio_order(pa, qa)
    ps = pa[order]
    tail_p = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]])  # p(H_m^c)
    vals = tail_p + hit_prefixes(qa, k, replacement, order)
    if not np.all(np.isfinite(vals)):  # max(0.0, nan) below would read as acceptance 0
        raise FloatingPointError("optimal_cut: a prefix value is not finite (an overflow in "
                                 "the hit probabilities); please report these p and q")
    m = int(np.argmin(vals))
    return float(min(1.0, max(0.0, vals[m]))), order, m


def optimal_acceptance(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> float:
    r"""Exact optimal acceptance :math:`\alpha^\star(p, q, k)` (equals ``solve_coupling``).

    Parameters
    ----------
    p, q : array_like [V]
        Target and draft distributions.
    k : int
        Number of drafts.
    replacement : bool
        ``True``: i.i.d. drafts; ``False``: distinct drafts by successive sampling.

    Cost: O(V log V) with replacement (any ``k``) and without replacement for ``k <= 2``;
    O(V^k) enumeration without replacement for ``k >= 3`` (``ValueError`` above
    :data:`coupling.dist.MAX_TUPLES` tuples).
    """
    return optimal_cut(p, q, k, replacement=replacement)[0]
