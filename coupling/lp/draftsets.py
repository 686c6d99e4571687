r"""The law of the *set* of drafted tokens, the form every multi-draft LP works on.

The membership cost :math:`\mathbf 1[y \notin x]` of a draft tuple ``x`` depends only on the
set of distinct tokens in it, so the LPs of :mod:`coupling.lp.solve` and the optimal rule's plan
(:mod:`coupling.rules.optimal`) work on draft sets. Two encodings are used:

* ``members [S, V]`` booleans, ``members[s, y]`` iff token ``y`` is in set ``s``;
* ``sets [S, m]`` token lists padded with ``-1`` (``m`` the largest set), compact when
  ``V`` is large.

Two drafts have a closed-form set law (:func:`pair_sets`, no ``V^2`` tuple enumeration);
any ``k`` can be grouped from the enumerated tuple law (:func:`group_by_set`). The
probability that a token is drafted (while no draft falls in a given set) is
:func:`inclusion`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..dist import tuple_law

__all__ = [
    "group_by_set",
    "padded_sets",
    "set_members",
    "members_on",
    "flows_on",
    "pair_sets",
    "pair_index",
    "others_sum",
    "inclusion",
]


def others_sum(q: np.ndarray) -> np.ndarray:
    """``1 - q_x`` for every ``x``, computed as the sum of the *other* entries (prefix plus
    suffix sums): it keeps its relative accuracy when ``q_x`` is close to 1, where
    ``1 - q_x`` would cancel."""
    pre = np.concatenate([[0.0], np.cumsum(q)[:-1]])
    suf = np.concatenate([np.cumsum(q[::-1])[::-1][1:], [0.0]])
    return pre + suf


def group_by_set(tuples: np.ndarray, probs: np.ndarray,
                 V: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge draft tuples ``[T, k]`` of probabilities ``[T]`` that hold the same set of tokens.

    Returns ``(set_index [T], set_mass [S], members [S, V])``, sets in lexicographic order of
    their membership rows.
    """
    T = tuples.shape[0]
    member = np.zeros((T, V), dtype=bool)
    member[np.arange(T)[:, None], tuples] = True
    # One opaque key per row (its bits packed, column 0 first) instead of np.unique(axis=0) on
    # booleans: the same sets in the same order, 10-100x faster on a few hundred tokens.
    packed = np.ascontiguousarray(np.packbits(member, axis=1))
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, set_index = np.unique(keys, return_index=True, return_inverse=True)
    set_index = set_index.reshape(-1)
    mass = np.bincount(set_index, weights=probs, minlength=first.size)
    return set_index, mass, member[first]


def padded_sets(members: np.ndarray) -> np.ndarray:
    """``[S, m]`` token lists (``-1`` pads) of the sets in ``members [S, V]``."""
    rows, cols = np.nonzero(members)
    n = members.sum(axis=1)
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    out = np.full((members.shape[0], max(int(n.max(initial=0)), 1)), -1, dtype=np.int64)
    out[rows, np.arange(rows.size) - start[rows]] = cols
    return out


def _positions(cols: np.ndarray) -> np.ndarray:
    """``pos[token]``: the token's index in ``cols``, ``-1`` if absent (one slot to spare)."""
    pos = np.full(max(int(cols.max(initial=-1)) + 2, 1), -1)
    pos[cols] = np.arange(cols.size)
    return pos


def members_on(sets: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``[S, len(cols)]`` booleans: padded set ``s`` holds token ``cols[j]``."""
    pos = _positions(cols)
    m = np.zeros((sets.shape[0], cols.size), dtype=bool)
    ok = sets >= 0
    j = pos[np.minimum(sets[ok], pos.size - 1)]
    m[np.nonzero(ok)[0][j >= 0], j[j >= 0]] = True
    return m


def set_members(sets: np.ndarray, V: int) -> np.ndarray:
    """``members [S, V]`` from padded token lists ``sets [S, m]`` (inverse of
    :func:`padded_sets`)."""
    return members_on(sets, np.arange(V))


def flows_on(sets: np.ndarray, plan_cols: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Per-set flows aligned with the padded ``sets [S, m]``, read from a plan ``[S, len(cols)]``
    over the tokens ``cols`` (the inverse of :func:`members_on`'s column map)."""
    pos = _positions(cols)
    j = np.where(sets >= 0, pos[np.minimum(np.maximum(sets, 0), pos.size - 1)], -1)
    return np.where(j >= 0, np.take_along_axis(plan_cols, np.maximum(j, 0), axis=1), 0.0)


@functools.lru_cache(maxsize=64)
def _pairs(V: int, replacement: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = np.triu_indices(V, 0 if replacement else 1)
    sets = np.stack([a, np.where(a == b, -1, b)], axis=1)
    for arr in (a, b, sets):       # shared by every call for this V: read-only
        arr.flags.writeable = False
    return a, b, sets


def pair_sets(q: np.ndarray, replacement: bool) -> tuple[np.ndarray, np.ndarray]:
    """The law of the set of two drafts from ``q``, built directly.

    Returns ``(sets [S, 2], mass [S])``: the sets ``{a, b}``, ``a <= b`` (``a < b`` without
    replacement), in the order of :func:`pair_index`; a double ``{a}`` is ``(a, -1)``.
    ``sets`` is shared between calls (read-only).
    """
    a, b, sets = _pairs(q.size, replacement)
    if replacement:
        mass = q[a] * q[b]
        mass[a != b] *= 2.0
    else:
        # P{(a, b)} + P{(b, a)} = q_a q_b / (1 - q_a) + q_b q_a / (1 - q_b), each as q times a
        # ratio q_b / (1 - q_a) <= 1: q_b / (1 - q_a) cannot overflow where 1 - q_a is
        # subnormal, as q_a / (1 - q_a) would (inf, then inf * q_b)
        rest = others_sum(q)
        qa, qb, ra, rb = q[a], q[b], rest[a], rest[b]
        mass = (qa * np.divide(qb, ra, out=np.zeros_like(qb), where=ra > 0)
                + qb * np.divide(qa, rb, out=np.zeros_like(qa), where=rb > 0))
    return sets, mass


def pair_index(a, b, V: int, replacement: bool):
    """Row of the set ``{a, b}`` in :func:`pair_sets` (``-1``: a repeat without replacement);
    ints or int arrays."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    if replacement:
        return lo * V - lo * (lo - 1) // 2 + (hi - lo)
    return np.where(lo == hi, -1, lo * (V - 1) - lo * (lo - 1) // 2 + (hi - lo - 1))


def inclusion(q: np.ndarray, k: int, replacement: bool,
              avoid: np.ndarray | None = None) -> np.ndarray:
    r"""``P(y is among the k drafts and no draft lies in avoid)`` for every token ``y``, ``[V]``
    (``avoid`` a boolean mask, default empty: the inclusion probabilities; 0 on ``avoid``).

    With :math:`b = q(\text{avoid}^c)`: i.i.d. drafts give :math:`b^k - (b - q_y)^k
    = b^k \,(1 - (1 - q_y/b)^k)`, written with ``expm1``/``log1p`` so that a tiny ``q_y``
    keeps its digits (any ``V``). Without replacement (successive sampling) ``k = 1`` is
    :math:`q_y`, ``k = 2`` is :math:`q_y [(b - q_y)/(1 - q_y) + \sum_{a \notin
    \text{avoid},\, a \ne y} q_a / (1 - q_a)]` (any ``V``; each ratio taken where it cannot
    overflow, as in :func:`pair_sets`), and ``k >= 3`` enumerates the tuple law (small ``V``:
    :func:`coupling.dist.tuple_law` refuses past its limit).
    """
    avoid = np.zeros(q.size, dtype=bool) if avoid is None else avoid
    free = ~avoid & (q > 0)
    out = np.zeros_like(q)
    if replacement:
        b = float(q[free].sum())
        if b > 0:
            with np.errstate(divide="ignore"):      # q_y = b: log1p(-1) = -inf, expm1 -> -1
                out[free] = b**k * -np.expm1(k * np.log1p(-np.minimum(q[free] / b, 1.0)))
        return out
    if k == 1:
        out[free] = q[free]
        return out
    if k == 2:
        rest = others_sum(q)                       # 1 - q_a, kept accurate near q_a = 1
        j = int(np.argmax(q))                      # the one token whose 1 - q_j may be tiny
        ok = free & (np.arange(q.size) != j)
        terms = np.divide(q, rest, out=np.zeros_like(q), where=ok & (rest > 0))   # each <= 1
        # b - q_y as the sum of the other free entries (no cancellation when q_y is near b)
        own = np.divide(others_sum(np.where(free, q, 0.0)), rest, out=np.zeros_like(q),
                        where=rest > 0)
        tail = np.zeros_like(q)
        if free[j] and rest[j] > 0:
            tail[ok] = q[j] * np.minimum(q[ok] / rest[j], 1.0)   # q_y <= 1 - q_j: no overflow
        out[free] = (q * (np.minimum(own, 1.0) + terms.sum() - terms) + tail)[free]
        return np.minimum(out, 1.0)

    tuples, probs = tuple_law(q, k, replacement=False)
    keep = ~avoid[tuples].any(axis=1)
    for i in range(k):                             # distinct drafts: each position counts once
        np.add.at(out, tuples[keep, i], probs[keep])
    return out
