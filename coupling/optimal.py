r"""Exact optimal multi-draft acceptance at full vocabulary (min-cut prefix scan).

Let :math:`Q` be the law of ``k`` drafts from ``q`` and ``p`` the target. The optimal
acceptance (the membership-cost LP of :func:`coupling.solve.solve_coupling`) is a maximum
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

import functools

import numpy as np
from numpy.typing import ArrayLike

from .dist import MAX_TUPLES, check_pair, tuple_law, validate_k, validate_replacement

__all__ = ["optimal_acceptance", "optimal_cut", "ratio_order", "CutPlan", "cut_plan", "pair_sets",
           "pair_index", "set_members"]


def ratio_order(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Token order by ``p/q`` decreasing; ``q = 0 < p`` first, ``p = q = 0`` last."""
    m = q > 0
    with np.errstate(over="ignore"):   # p / (subnormal q) is inf: it sorts with q = 0, first
        ratio = np.where(m, p / np.where(m, q, 1.0), np.inf)
    ratio[(p == 0) & ~m] = -1.0
    # numpy's default (SIMD quicksort) argsort is ~7x faster than a stable sort here; the
    # order inside a group of equal ratios is irrelevant with replacement (the objective is
    # concave along a tie group, so the best cut takes all of it or none); without
    # replacement this is checked exhaustively (proofs/multidraft_mincut.py, ties included)
    return np.argsort(-ratio)


def _rest(q: np.ndarray) -> np.ndarray:
    """``1 - q_x`` computed as the sum of the *other* entries (prefix + suffix sums), which
    keeps its relative accuracy when ``q_x`` is close to 1 (``1 - q_x`` would cancel)."""
    pre = np.concatenate([[0.0], np.cumsum(q)[:-1]])
    suf = np.concatenate([np.cumsum(q[::-1])[::-1][1:], [0.0]])
    return pre + suf


def _hit_prefixes(q: np.ndarray, k: int, replacement: bool, order: np.ndarray) -> np.ndarray:
    """``P(some of the k drafts lies in H_m)`` for every prefix ``H_m = order[:m]``, m = 0..V.

    Written as sums of non-negative terms wherever possible, so that no prefix value loses
    digits to cancellation (e.g. a token with ``q`` close to 1 drawn without replacement).
    """
    qs = q[order]
    head_q = np.concatenate([[0.0], np.cumsum(qs)])  # q(H_m)
    tail_q = np.concatenate([np.cumsum(qs[::-1])[::-1], [0.0]])  # q(C_m), C_m = order[m:]
    if k == 1:
        return head_q
    if replacement:
        # 1 - (1 - s)^k with 1 - s taken as the tail sum (accurate when s is close to 1)
        return 1.0 - tail_q**k
    if k == 2:
        # P(hit) = q(H) + sum_{a in C} q_a q(H) / (1 - q_a) = q(H) (1 + A_C) + the term of b.
        # Only the likeliest token b can have 1 - q_b < 1/2; when it is tiny (subnormal),
        # q_b / (1 - q_b) overflows and 0 * inf poisons the prefix. Its term is taken as
        # q_b * (q(H) / (1 - q_b)) instead: q(H) <= 1 - q_b while b is outside H, a ratio <= 1.
        rest = _rest(qs)
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
            import math

            T = math.perm(V, k)
            if T > MAX_TUPLES:
                raise ValueError(
                    f"exact optimum without replacement for k={k} >= 3 enumerates the tuple law "
                    f"({T:.3g} tuples > {MAX_TUPLES:.3g}); no exact large-V method is implemented "
                    "for k >= 3 without replacement: use k <= 2, replacement=True, or a smaller V"
                )
    return _scan(pa, qa, k, replacement)


def _scan(pa: np.ndarray, qa: np.ndarray, k: int, replacement: bool) -> tuple[float, np.ndarray]:
    """The prefix scan on validated inputs (benchmarked separately from validation)."""
    order = ratio_order(pa, qa)
    ps = pa[order]
    tail_p = np.concatenate([np.cumsum(ps[::-1])[::-1], [0.0]])  # p(H_m^c)
    vals = tail_p + _hit_prefixes(qa, k, replacement, order)
    if not np.all(np.isfinite(vals)):  # max(0.0, nan) below would read as acceptance 0
        raise FloatingPointError("optimal_cut: a prefix value is not finite (an overflow in "
                                 "the hit probabilities); please report these p and q")
    m = int(np.argmin(vals))
    return float(min(1.0, max(0.0, vals[m]))), order[:m].astype(np.int64)


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


# --------------------------------------------------------------------------------------
# An optimal plan through the cut
# --------------------------------------------------------------------------------------
#
# Let H be a minimising cut (optimal_cut), so the optimum is P(hit H) + p(H^c). By
# complementary slackness every maximum flow on the membership edges (a draft set -> each of
# its tokens) has the same shape:
#
# * a set that hits H sends *all* its mass to its members in H (its source edge is cut, and
#   no flow crosses the cut backwards), token x in H taking at most p_x. What x is left short
#   of, r_x = p_x - load_x, is the residual law; it totals R = p(H) - P(hit H).       (A)
# * every token outside H receives exactly p_x (its sink edge is cut), from the sets inside
#   H^c only, which reject the rest: P(inside H^c) - p(H^c), which is R again.          (B)
#
# A set's rejected mass then goes to H in proportion to r, every column sums to p, and the
# plan accepts P(hit H) + p(H^c). So an optimal plan needs no optimisation at all, only a
# feasible point of (A) and of (B), which exist by the cut's optimality (Hall's condition for
# (A) is the cut inequality against H less a subset, for (B) against H plus a subset). The
# converse is a certificate: a flow that meets the value of a cut is a maximum flow (weak
# duality), so feasible parts prove the plan optimal whatever found them. Closed forms below
# find them on almost every law the demo meets; where one fails its check, that part alone is
# solved by POT as a zero-cost transport on its own rows and columns (|H| or |H^c| columns,
# where the whole transport has V, and only the sets of that part as rows).


@functools.lru_cache(maxsize=64)
def _pairs(V: int, replacement: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, b = np.triu_indices(V, 0 if replacement else 1)
    sets = np.stack([a, np.where(a == b, -1, b)], axis=1)
    for arr in (a, b, sets):       # shared by every call for this V: read-only
        arr.flags.writeable = False
    return a, b, sets


def pair_sets(q: np.ndarray, replacement: bool) -> tuple[np.ndarray, np.ndarray]:
    """The law of the *set* of two drafts, built directly (no ``V^2`` tuple enumeration).

    Returns ``(sets [S, 2], mass [S])``: the sets ``{a, b}``, ``a <= b`` (``a < b`` without
    replacement), in the order of :func:`pair_index`; a double ``{a}`` is ``(a, -1)``.
    ``sets`` is shared between calls (read-only).
    """
    a, b, sets = _pairs(q.size, replacement)
    if replacement:
        mass = q[a] * q[b]
        mass[a != b] *= 2.0
    else:
        # P{(a, b)} + P{(b, a)} = q_a q_b / (1 - q_a) + q_b q_a / (1 - q_b), with 1 - q_x taken
        # as the sum of the other entries (it cancels when q_x is close to 1)
        rest = _rest(q)
        share = np.divide(q, rest, out=np.zeros_like(q), where=rest > 0)
        mass = q[b] * share[a] + q[a] * share[b]
    return sets, mass


def pair_index(a, b, V: int, replacement: bool):
    """Row of the set ``{a, b}`` in :func:`pair_sets` (``-1``: a repeat without replacement);
    ints or int arrays."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    if replacement:
        return lo * V - lo * (lo - 1) // 2 + (hi - lo)
    return np.where(lo == hi, -1, lo * (V - 1) - lo * (lo - 1) // 2 + (hi - lo - 1))


def _loads(sets: np.ndarray, flow: np.ndarray, V: int) -> np.ndarray:
    ok = sets >= 0
    return np.bincount(sets[ok], weights=flow[ok], minlength=V)


def _split_by_capacity(sets, mass, on_h, cap):
    """(A) closed form: a set splits its mass over its tokens in ``H`` in proportion to their
    capacities; ``None`` if a load then exceeds its capacity."""
    w = np.where(on_h, cap[sets], 0.0)
    den = w.sum(axis=1)
    if not (den > 0).all():
        return None
    split = w * (mass / den)[:, None]
    return split if (_loads(np.where(on_h, sets, -1), split, cap.size) <= cap + 1e-15).all() \
        else None


def _shares(sets, mass, need):
    """(B) closed form: token ``x`` takes the share ``need_x / M_x`` of every set holding it
    (``M_x`` their mass), so it gets ``need_x`` exactly; ``None`` if a set's shares pass 1."""
    ok = sets >= 0
    M = np.bincount(sets[ok], weights=np.broadcast_to(mass[:, None], sets.shape)[ok],
                    minlength=need.size)
    if ((M <= 0) & (need > 0)).any():
        return None
    w = np.divide(need, M, out=np.zeros_like(need), where=M > 0)
    share = np.where(ok, w[sets], 0.0)
    return share * mass[:, None] if share.sum(axis=1).max(initial=0.0) <= 1 + 1e-13 else None


def _peel_pairs(sets, mass, need):
    r"""(B) closed form for sets of at most two tokens (``k = 2``, any law of the pair): serve
    the tokens one at a time, the least demanding first (smallest ``need_x / M_x``, ``M_x``
    the mass of the sets holding ``x``).

    A token's *own* supply is what no token still to be served can use: its double, and what
    the tokens served before it left of their pairs with it. It takes from there first (the
    fraction :math:`\phi_x`), then, if short, the same fraction :math:`g_x` of each pair it
    forms with a later token, whose rest becomes that token's own supply. So the pair
    ``{e, l}`` (``e`` served first, mass ``m``) sends :math:`g_e m` to ``e`` and
    :math:`\phi_l (1 - g_e) m` to ``l``, and a double ``{x}`` sends :math:`\phi_x m`. Every
    token gets exactly ``need``; ``None`` if one would need more than all its pairs
    (:math:`g_x > 1`). A greedy, not a theorem: on the demo's laws it serves 92-98% of those
    where the shares of :func:`_shares` fail (``benchmarks/bench_cut_plan.py``).
    """
    V = need.size
    a = sets[:, 0]
    b = np.where(sets[:, 1] < 0, a, sets[:, 1])
    M2 = np.zeros((V, V))
    np.add.at(M2, (a, b), mass)                          # upper triangle and diagonal
    held = M2.sum(axis=0) + M2.sum(axis=1) - np.diag(M2)
    if ((need > 0) & (held <= 0)).any():
        return None
    toks = np.flatnonzero(held > 0)
    order = toks[np.argsort(need[toks] / held[toks], kind="stable")]
    Mo = (M2 + np.triu(M2, 1).T)[np.ix_(order, order)]   # symmetric, in serving order
    later = np.triu(Mo, 1).sum(axis=1)
    n = order.size
    keep = np.zeros(n)             # 1 - g of the tokens served so far
    phi, g = np.zeros(n), np.zeros(n)
    for i in range(n):
        own = Mo[i, i] + keep[:i] @ Mo[:i, i]
        d = need[order[i]]
        if d <= own:
            phi[i] = d / own if own > 0 else 0.0
        else:
            phi[i] = 1.0
            g[i] = (d - own) / later[i] if later[i] > 0 else np.inf
            if g[i] > 1 + 1e-13:
                return None
            g[i] = min(g[i], 1.0)
        keep[i] = 1.0 - g[i]
    rank = np.zeros(V, dtype=np.int64)
    rank[order] = np.arange(n)
    PHI, G = np.zeros(V), np.zeros(V)
    PHI[order], G[order] = phi, g
    double = sets[:, 1] < 0
    a_first = double | (rank[a] < rank[b])
    e, l_ = np.where(a_first, a, b), np.where(a_first, b, a)
    f_e = np.where(double, PHI[a], G[e]) * mass
    f_l = np.where(double, 0.0, PHI[l_] * (1.0 - G[e]) * mass)
    return np.stack([np.where(a_first, f_e, f_l), np.where(a_first, f_l, f_e)], axis=1)


def _require_minimal(margin: float, what: str) -> None:
    """A part of the plan cannot exist through this cut: it is not minimal (a bug upstream,
    or a caller's ``cut=``), and no plan is returned rather than a wrong one."""
    if margin < -1e-12:
        from .solve import SolverError

        raise SolverError(f"cut_plan: {what} by {-margin:.3g}; the cut is not minimal "
                          "(please report p and q)")


def _zero_cost_transport(a, b, allowed):
    """A plan of the transport on the ``allowed`` edges (marginals of one total below 1), by
    POT with cost 1 off them. The cut makes a zero-cost plan exist; where rounding at a tight
    cut leaves it short by ulps, the off-edge mass stays at that size (the plan is still a
    coupling), and anything larger is a bug, not a number to return."""
    from .solve import SolverError, _emd, _rebalance

    total = float(a.sum())
    if not total > 0:
        return np.zeros(allowed.shape)
    cost = (~allowed).astype(np.float64)
    plan = _emd(*_rebalance(a, b), cost)[0] * total
    off = float((plan * cost).sum())
    if off > 1e-9:
        raise SolverError(f"cut_plan: a part of the plan needs {off:.3g} of mass off its "
                          "edges; the cut is not minimal (please report p and q)")
    return plan


def _positions(cols: np.ndarray) -> np.ndarray:
    """``pos[token]``: the token's index in ``cols``, ``-1`` if absent (one slot to spare)."""
    pos = np.full(max(int(cols.max(initial=-1)) + 2, 1), -1)
    pos[cols] = np.arange(cols.size)
    return pos


def _dense_members(sets: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``[S, len(cols)]`` booleans: set ``s`` holds token ``cols[j]``."""
    pos = _positions(cols)
    m = np.zeros((sets.shape[0], cols.size), dtype=bool)
    ok = sets >= 0
    j = pos[np.minimum(sets[ok], pos.size - 1)]
    m[np.nonzero(ok)[0][j >= 0], j[j >= 0]] = True
    return m


def set_members(sets: np.ndarray, V: int) -> np.ndarray:
    """``[S, V]`` booleans from the padded token lists ``sets [S, m]`` (:func:`pair_sets`): the
    ``members`` form of :func:`coupling.solve.solve_sets` (the inverse of
    :func:`coupling.solve.padded_sets`)."""
    return _dense_members(sets, np.arange(V))


def _spread(sets_sub, plan_cols, cols):
    """Back from a transport on ``cols`` to per-set flows aligned with ``sets_sub``."""
    pos = _positions(cols)
    j = np.where(sets_sub >= 0, pos[np.minimum(np.maximum(sets_sub, 0), pos.size - 1)], -1)
    return np.where(j >= 0, np.take_along_axis(plan_cols, np.maximum(j, 0), axis=1), 0.0)


class CutPlan:
    """An optimal plan over draft *sets*, built through the min cut (section comment above).

    For validated ``p, q`` and the set law ``(sets [S, m], mass [S])`` of ``k`` drafts
    (:func:`pair_sets`, or :func:`coupling.solve.padded_sets`: ``-1`` pads a set's token list).
    ``cut``: the minimising set ``H`` if already known (else :func:`optimal_cut`'s scan).

    Row ``s`` sums to ``mass[s]``; the conditional output law of any tuple of set ``s`` is that
    row, normalised. A set with exactly one token in ``H`` sends it everything; the parts (A)
    and (B) are solved on first use, each by its closed form when that passes its check, else
    by POT on the part alone, so a sampler reading one row solves only what that row needs.
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool,
                 sets: np.ndarray, mass: np.ndarray, *, cut: np.ndarray | None = None):
        self.p, self.sets, self.mass = p, sets, mass
        self.cut = _scan(p, q, k, replacement)[1] if cut is None else cut
        self.in_h = np.zeros(p.size, dtype=bool)
        self.in_h[self.cut] = True
        self.on_h = (sets >= 0) & self.in_h[sets]      # sets[-1] reads a token; masked by >= 0
        self.n_h = self.on_h.sum(axis=1)
        self.how: dict[str, str] = {}

    @property
    def status(self) -> str:
        how = ", ".join(f"{k} {v}" for k, v in sorted(self.how.items())) or "nothing solved yet"
        return f"optimal (min-cut split, |H|={self.cut.size}: {how})"

    @functools.cached_property
    def part_a(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(A): ``(rows, flow [rows, m], resid [V])`` for the sets hitting ``H``."""
        V, sets, mass, on_h, in_h = self.p.size, self.sets, self.mass, self.on_h, self.in_h
        rows = np.flatnonzero(self.n_h > 0)
        flow = on_h[rows] * mass[rows][:, None]         # right for the forced sets
        forced = self.n_h[rows] == 1
        cap = (self.p - _loads(sets[rows[forced]], flow[forced], V)) * in_h
        _require_minimal(cap.min(initial=0.0), "the sets forced to a token of H overfill it")
        cap = np.clip(cap, 0.0, None)
        multi = rows[~forced]
        split = _split_by_capacity(sets[multi], mass[multi], on_h[multi], cap)
        self.how["A"] = "split by capacity"
        if split is None:
            slack = cap.sum() - mass[multi].sum()
            _require_minimal(slack, "the sets hitting H hold more than H can take")
            slack = max(slack, 0.0)
            cols = self.cut
            mine = np.where(on_h[multi], sets[multi], -1)
            allowed = np.vstack([_dense_members(mine, cols), np.ones((1, cols.size), bool)])
            sub = _zero_cost_transport(np.append(mass[multi], slack), cap[cols], allowed)
            split = _spread(mine, sub[:-1], cols)
            self.how["A"] = "by POT"
        flow[~forced] = split
        resid = np.clip(cap - _loads(sets[multi], split, V), 0.0, None)
        return rows, flow, resid

    @functools.cached_property
    def part_b(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(B): ``(rows, flow [rows, m], reject [rows])`` for the sets inside ``H^c``."""
        sets, mass, p, in_h = self.sets, self.mass, self.p, self.in_h
        rows = np.flatnonzero(self.n_h == 0)
        need = np.where(in_h, 0.0, p)
        flow = _shares(sets[rows], mass[rows], need)
        self.how["B"] = "shares"
        if flow is None and sets.shape[1] == 2:
            flow = _peel_pairs(sets[rows], mass[rows], need)
            self.how["B"] = "peeled"
        if flow is None:
            cols = np.flatnonzero(~in_h)
            reject_total = mass[rows].sum() - need.sum()
            _require_minimal(reject_total, "the sets inside H^c hold less than H^c needs")
            reject_total = max(reject_total, 0.0)
            allowed = np.hstack([_dense_members(sets[rows], cols),
                                 np.ones((rows.size, 1), bool)])
            sub = _zero_cost_transport(mass[rows], np.append(need[cols], reject_total), allowed)
            flow = _spread(sets[rows], sub[:, :-1], cols)
            self.how["B"] = "by POT"
        return rows, flow, np.clip(mass[rows] - flow.sum(axis=1), 0.0, None)

    def row(self, s: int) -> np.ndarray:
        """Row ``s`` of the plan, ``[V]`` (a sampler reads one row per call)."""
        out = np.zeros(self.p.size)
        toks = self.sets[s][self.sets[s] >= 0]
        if self.n_h[s] == 1:
            out[toks[self.in_h[toks]]] = self.mass[s]
            return out
        rows, flow, reject = (*self.part_a[:2], None) if self.n_h[s] > 0 else self.part_b
        i = int(np.searchsorted(rows, s))
        np.add.at(out, toks, flow[i][: toks.size])
        if reject is not None and reject[i] > 0:
            resid = self.part_a[2]
            R = resid.sum()       # equals the total rejected mass: both are p(H) - P(hit H)
            if R > 0:
                out += resid * (reject[i] / R)
        return out

    def dense(self) -> np.ndarray:
        """The whole plan ``[S, V]``."""
        out = np.zeros((self.mass.size, self.p.size))
        for rows, flow in (self.part_a[:2], self.part_b[:2]):
            ok = self.sets[rows] >= 0
            np.add.at(out, (rows[np.nonzero(ok)[0]], self.sets[rows][ok]), flow[ok])
        resid, (rows, _, reject) = self.part_a[2], self.part_b
        if resid.sum() > 0:
            out[rows] += np.outer(reject, resid / resid.sum())
        return out


def cut_plan(
    p: np.ndarray, q: np.ndarray, k: int, replacement: bool, sets: np.ndarray, mass: np.ndarray,
    *, cut: np.ndarray | None = None,
) -> CutPlan:
    """:class:`CutPlan` with both parts solved (the form :func:`coupling.solve.solve_coupling`
    uses: ``solver="cut"``)."""
    plan = CutPlan(p, q, k, replacement, sets, mass, cut=cut)
    plan.part_a, plan.part_b  # noqa: B018 - solve both now
    return plan
