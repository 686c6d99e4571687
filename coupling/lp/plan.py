r"""An optimal plan of the membership-cost transport, built through the min cut.

Let H be a minimising cut (optimal_cut), so the optimum is P(hit H) + p(H^c). By
complementary slackness every maximum flow on the membership edges (a draft set -> each of
its tokens) has the same shape:

* a set that hits H sends *all* its mass to its members in H (its source edge is cut, and
  no flow crosses the cut backwards), token x in H taking at most p_x. What x is left short
  of, r_x = p_x - load_x, is the residual law; it totals R = p(H) - P(hit H).       (A)
* every token outside H receives exactly p_x (its sink edge is cut), from the sets inside
  H^c only, which reject the rest: P(inside H^c) - p(H^c), which is R again.          (B)

A set's rejected mass then goes to H in proportion to r, every column sums to p, and the
plan accepts P(hit H) + p(H^c). So an optimal plan needs no optimisation at all, only a
feasible point of (A) and of (B), which exist by the cut's optimality (Hall's condition for
(A) is the cut inequality against H less a subset, for (B) against H plus a subset). The
converse is a certificate: a flow that meets the value of a cut is a maximum flow (weak
duality), so feasible parts prove the plan optimal whatever found them. Closed forms below
find them on almost every law met in practice (on LLM laws (A) holds for 99.0-99.7% of them
and (B) for 96.3-99.7%); where one fails its check, that part alone is solved by POT as a
zero-cost transport on its own rows and columns (|H| or |H^c| columns, where the whole
transport has V, and only the sets of that part as rows).
"""

from __future__ import annotations

import functools

import numpy as np

from .cut import scan
from .draftsets import flows_on, members_on
from .solvers import TOLERANCES, SolverError, zero_cost_transport

__all__ = ["CutPlan", "cut_plan"]


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
    (:math:`g_x > 1`). A greedy, not a theorem: on LLM laws it serves 92-98% of those where
    the shares of :func:`_shares` fail.
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
    if margin < -TOLERANCES.plan_margin:
        raise SolverError(f"cut_plan: {what} by {-margin:.3g}; the cut is not minimal "
                          "(please report p and q)")


class CutPlan:
    """An optimal plan over draft *sets*, built through the min cut (section comment above).

    For validated ``p, q`` and the set law ``(sets [S, m], mass [S])`` of ``k`` drafts
    (:func:`coupling.lp.draftsets.pair_sets` or :func:`coupling.lp.draftsets.padded_sets`:
    ``-1`` pads a set's token list).
    ``cut``: the minimising set ``H`` if already known (else
    :func:`coupling.lp.cut.optimal_cut`'s scan).

    Row ``s`` sums to ``mass[s]``; the conditional output law of any tuple of set ``s`` is that
    row, normalised. A set with exactly one token in ``H`` sends it everything; the parts (A)
    and (B) are solved on first use, each by its closed form when that passes its check, else
    by POT on the part alone, so a sampler reading one row solves only what that row needs.
    ``closed_forms``: the parts allowed their closed forms (``()`` solves both by POT, which
    the tests and proofs use to exercise the fallbacks on every kind of instance).
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool,
                 sets: np.ndarray, mass: np.ndarray, *, cut: np.ndarray | None = None,
                 closed_forms: tuple[str, ...] = ("A", "B")):
        self.p, self.sets, self.mass = p, sets, mass
        self.closed_forms = frozenset(closed_forms)
        self.cut = scan(p, q, k, replacement)[1] if cut is None else cut
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
        split = _split_by_capacity(sets[multi], mass[multi], on_h[multi], cap) \
            if "A" in self.closed_forms else None
        self.how["A"] = "split by capacity"
        if split is None:
            slack = cap.sum() - mass[multi].sum()
            _require_minimal(slack, "the sets hitting H hold more than H can take")
            slack = max(slack, 0.0)
            cols = self.cut
            mine = np.where(on_h[multi], sets[multi], -1)
            allowed = np.vstack([members_on(mine, cols), np.ones((1, cols.size), bool)])
            sub = _part_transport(np.append(mass[multi], slack), cap[cols], allowed)
            split = flows_on(mine, sub[:-1], cols)
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
        closed = "B" in self.closed_forms
        flow = _shares(sets[rows], mass[rows], need) if closed else None
        self.how["B"] = "shares"
        if flow is None and closed and sets.shape[1] == 2:
            flow = _peel_pairs(sets[rows], mass[rows], need)
            self.how["B"] = "peeled"
        if flow is None:
            cols = np.flatnonzero(~in_h)
            reject_total = mass[rows].sum() - need.sum()
            _require_minimal(reject_total, "the sets inside H^c hold less than H^c needs")
            reject_total = max(reject_total, 0.0)
            allowed = np.hstack([members_on(sets[rows], cols),
                                 np.ones((rows.size, 1), bool)])
            sub = _part_transport(mass[rows], np.append(need[cols], reject_total), allowed)
            flow = flows_on(sets[rows], sub[:, :-1], cols)
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
    *, cut: np.ndarray | None = None, closed_forms: tuple[str, ...] = ("A", "B"),
) -> CutPlan:
    """:class:`CutPlan` with both parts solved (``coupling.solve_coupling(solver="cut")``)."""
    plan = CutPlan(p, q, k, replacement, sets, mass, cut=cut, closed_forms=closed_forms)
    plan.part_a, plan.part_b  # noqa: B018 - solve both now
    return plan


def _part_transport(a: np.ndarray, b: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A part's plan on its allowed edges; one exists by the cut's optimality, so a failure
    means the cut is not minimal."""
    try:
        return zero_cost_transport(a, b, allowed)
    except SolverError as exc:
        raise SolverError(f"cut_plan: {exc}; the cut is not minimal (please report p and q)") \
            from None
