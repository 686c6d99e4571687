r"""The exact optimal sampler for ``k`` i.i.d. drafts at full vocabulary: a priority race
through the min cut.

Status: **derived here**. Thomas & Pal ("partial resolution", NeurIPS 2025) report an exact
i.i.d. sampler at :math:`O(2^{1.5k} k^2 + 2^k V + V \log V)` per step; the reference store
holds their abstract only, so their algorithm was not read and this is a different one. It
enumerates no subsets: one sort of the union support ``U`` of ``p`` and ``q`` (the min cut's
own) and :math:`O(U k)` vector work (Newton iterations for the join times), per ``(p, q, k)``.

Structure (proved, :mod:`coupling.lp.plan`)
------------------------------------------------------
With the tokens sorted by ``p/q`` decreasing, a prefix ``H`` is a min cut; with
:math:`s = q(H)`, :math:`b = 1 - s` and :math:`F(x) = 1 - (1 - x)^k` the optimum is
:math:`F(s) + p(H^c)`, and a plan is optimal iff (A) every tuple hitting ``H`` outputs one of
its tokens in ``H``, token ``x`` of ``H`` receiving at most :math:`p_x`, and (B) the tuples
inside :math:`H^c` give each ``x`` of :math:`H^c` exactly :math:`p_x` and send the rest,
:math:`R = b^k - p(H^c)`, to the residual law.

The race (:meth:`RacePlan.verify`; ``u[:k]`` the per-draft coins, ``u[k]`` the residual draw)
--------------------------------------------------------------------------------------------
Every token has a weight, :math:`W^A_x` on ``H`` and :math:`W^B_x` on :math:`H^c`, and there
is a threshold :math:`\theta`; draw ``j`` has the key :math:`u_j W_{x_j}`.

1. Some draft lies in ``H``: output the ``H``-draft of **smallest** key.
2. Otherwise take the draft of **largest** key (tokens with :math:`p = 0` are silent: they
   never win); output it if its key is at least :math:`\theta`, else draw the residual
   :math:`r = p - \ell^A - \ell^B` (normalised) at ``u[k]``.

Lossless for **any** weights with :math:`r \ge 0` (**proved**): whatever the weights, the
coupling has the shape of (A) and (B), each token's load (the mass it is output with) is an
exact closed form (:mod:`coupling.rules.optimal.loads`), and the residual is *defined* as
``p`` minus the loads; its mass :math:`1 - \sum \ell = b^k - \sum_{H^c} \ell^B` is exactly the
rejected mass, so the output law is ``p`` whatever the float error in the weights. The
weights only decide feasibility (:math:`r \ge 0`) and optimality (:math:`\ell^B = p` on
:math:`H^c`).

How the weights are found (derived; checked in exact arithmetic by
``proofs/optimal_race_sampler.py``)
---------------------------------------------------------------------------------------
*Positions.* Give every draw a position: a draw of ``x`` lands in a set of measure
:math:`q_x` of a line, the tokens' sets tiling it; with i.i.d. draws the first position among
the ``k`` draws on part A's line :math:`[0, s]` has density :math:`F'`, so a token placed where
:math:`F'` is large gets more load per unit of mass. Loading the tokens is a scheduling
problem, solved by the earliest-deadline rule run from the cheap end:

* serve the group of tokens with the smallest remaining capacity/mass ratio, each in
  proportion to its remaining mass (which keeps their ratios equal);
* the group's ratio :math:`(p(J) - \Phi(\tau)) / (q(J) - \tau)`, with
  :math:`\Phi(\tau) = F(s) - F(s - \tau) = (b + \tau)^k - b^k`, rises until it meets the next
  token's ratio :math:`r_y = p_y / q_y`: ``y`` joins at the smallest root of
  :math:`\Phi(\tau) - r_y \tau = p(J_y) - r_y q(J_y)` (``J_y`` the tokens of lower ratio),
  one independent root per token (vectorised Newton from the left: :math:`\Phi` is convex,
  so the iterates increase monotonically to the root);
* capacity never runs out: the group ``J`` at :math:`\tau \le q(J)` has used
  :math:`\Phi(\tau) \le \Phi(q(J)) \le p(J)`, the last step being the cut inequality for the
  lowest-ratio tokens of ``H``.

Inside the group all masses shrink in proportion, so token ``x`` (joined at :math:`\tau_x`)
keeps the fraction :math:`E(\tau)/E(\tau_x)` of its mass with
:math:`E(\tau) = \exp(-\int_0^\tau d\tau' / M(\tau'))`, :math:`M` the group's remaining mass
(piecewise linear). A draw of ``x`` with coin ``u`` sits where :math:`E(\tau) = u E(\tau_x)`:
comparing positions is comparing :math:`u W_x` with :math:`W_x = E(\tau_x)`, and no inverse is
ever computed. A group exhausted exactly starts a new epoch (its weights drop by
:data:`EPOCH_GAP` nats: a strict priority). Part B is the mirror image, run forward with rate
:math:`D'` for :math:`D(\sigma) = b^k - (b - \sigma)^k`, exact demands :math:`p_x` and mass
budgets :math:`q_x`, highest ratio first; its accept region ends at
:math:`T = b - R^{1/k}` (:math:`D(T) = p(H^c)`) and :math:`\theta = E_B(T)`; the cut inequality
:math:`p(J) \le D(q(J))` for the highest-ratio tokens of :math:`H^c` keeps every demand
reachable. With ``k = 1`` the race is token verification.

Without replacement the first position among successive-sampling draws has no density of
its own (the draws are dependent), so this construction does not apply; the rule's LP plan
serves that case on small supports.
"""

from __future__ import annotations

import functools

import numpy as np

from ...lp.cut import scan_order
from ..common import categorical
from .loads import loads_max, loads_min, win_given_max, win_given_min

__all__ = ["RacePlan", "race_plan", "EPOCH_GAP"]

#: log-weight drop between two exhausted groups: exp(-1000) == 0.0, a strict priority
EPOCH_GAP = 1000.0
#: Newton iterations per join time, at most (convergence is quadratic: about 8 are used)
NEWTON_STEPS = 200


class RacePlan:
    """The race through the cut for one validated ``(p, q, k)`` (module doc).

    ``in_h``, ``logw_a`` / ``logw_b`` (``-inf`` where a token does not race in that part) and
    ``log_theta`` are all a call needs. Part A's weights, the exact loads, the residual law
    and the rejected mass are computed on first use: a call reads part A's weights only when
    a draft lies in ``H`` (with ``k`` drafts, probability ``1 - b^k``, about 0.1 on softmax
    laws), and the rest only after a rejection.
    """

    def __init__(self, p, q, k, in_h, b, order_a, order_b, logw_b, log_theta, optimum):
        self.p, self.q, self.k, self.in_h, self.b = p, q, k, in_h, b    # b = 1 - q(H)
        self.order_a, self.order_b = order_a, order_b          # racing tokens, weight ascending
        self.logw_b, self.log_theta = logw_b, log_theta
        self.optimum = optimum

    @functools.cached_property
    def logw_a(self) -> np.ndarray:
        """Part A's log-weights ``[V]`` (``-inf`` off ``H`` and where ``q = 0``)."""
        logw = np.full(self.p.size, -np.inf)
        tok = self.order_a[::-1]                               # join order: ratio increasing
        if tok.size:
            logw[tok] = 0.0 if self.k == 1 else _part(self.p[tok], self.q[tok], self.k,
                                                      self.b, +1.0)[0]
        return logw

    @functools.cached_property
    def loads_a(self) -> np.ndarray:
        """Per token of ``H``, the mass the tuples hitting ``H`` output it with."""
        return loads_min(self.q, self.logw_a, self.k, self.order_a)

    @functools.cached_property
    def loads_b(self) -> np.ndarray:
        """Per token of ``H^c``, the mass the tuples inside ``H^c`` output it with."""
        return loads_max(self.q, self.logw_b, self.k, self.log_theta, ~self.in_h,
                         self.order_b)

    @functools.cached_property
    def residual(self) -> np.ndarray:
        """The residual law ``(p - loads)_+``, normalised (``p`` where it has no mass)."""
        rest = np.clip(self.p - self.loads_a - self.loads_b, 0.0, None)
        total = rest.sum()
        return rest / total if total > 0 else self.p.copy()

    @property
    def acceptance(self) -> float:
        """The plan's acceptance from its exact loads (equals :attr:`optimum`)."""
        return float(self.loads_a.sum() + self.loads_b.sum())

    def verify(self, drafts: np.ndarray, u: np.ndarray) -> int:
        """Deterministic core: drafts ``[k]`` and uniforms ``u [k + 1]`` (module doc)."""
        with np.errstate(divide="ignore"):              # a coin of 0 has key -inf
            lu = np.log(u[: drafts.size])
        hit = self.in_h[drafts]
        if hit.any():
            keys = np.where(hit, lu + self.logw_a[drafts], np.inf)
            return int(drafts[int(np.argmin(keys))])
        keys = lu + self.logw_b[drafts]
        j = int(np.argmax(keys))
        if np.isfinite(keys[j]) and keys[j] >= self.log_theta:
            return int(drafts[j])
        return categorical(self.residual, float(u[drafts.size]))

    def conditional(self, drafts: np.ndarray) -> np.ndarray:
        """Exact output law ``[V]`` given the drafted tuple (the coins integrated out)."""
        out = np.zeros(self.p.size)
        hit = self.in_h[drafts]
        if hit.any():
            np.add.at(out, drafts[hit], win_given_min(self.logw_a[drafts[hit]]))
            return out
        win, reject = win_given_max(self.logw_b[drafts], self.log_theta)
        np.add.at(out, drafts, win)
        return out + reject * self.residual


def _join_times(r: np.ndarray, kappa: np.ndarray, hi: np.ndarray, k: int, a: float,
                sign: float) -> np.ndarray:
    """Smallest root on ``[0, hi]`` of ``G(t) - r t = kappa`` per token: part A
    (``sign = +1``) ``G = (a + t)^k - a^k``, convex; part B (``sign = -1``)
    ``G = a^k - (a - t)^k``, concave; both ``G(0) = 0``.

    Vectorised Newton from the left of each root, where ``-f/f' >= 0`` and the convexity (A) or
    concavity (B) of ``f`` keeps every iterate left of it: the iterates increase. With
    ``z = 1 + sign t / a``, ``G = a^(k-1) t sum_{i<k} z^i`` (non-negative terms, no
    cancellation at small ``t``). A token stops after a step below ``1e-9`` relative (its
    error is then ~1e-18), when the slope vanishes (a double root) or at ``hi``. The roots only
    place the weights: the plan stays exact whatever their error (module doc).
    """
    scale = a ** (k - 1) if a > 0 else 0.0
    if r.size == 0:
        return r.copy()
    if sign < 0 and a > 0:
        t = _start_b(r, kappa, hi, k, a, scale)
    elif sign > 0 and k >= 2:
        t = _start_a(r, kappa, hi, k, a)
    else:
        t = np.zeros_like(r)
    idx, rr, kk, hh, tt = None, r, kappa, hi, t         # idx None: every root is in tt
    live = np.ones(r.size, dtype=bool)      # over tt: the roots still moving
    for _ in range(NEWTON_STEPS):
        f, df = _newton_terms(tt, rr, kk, k, a, sign, scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            back = f / df                                        # minus the Newton step
        good = live & (back < 0) & (back > -np.inf)              # a finite step to the right
        new = np.minimum(tt - np.where(good, back, 0.0), hh)    # a stopped root stays put
        live = good & (new - tt > 1e-9 * new) & (new < hh)
        tt = new
        # drop the stopped roots once a quarter of them have stopped (each drop copies
        # five arrays; the first iterations stop almost none)
        n_live = np.count_nonzero(live)
        if 4 * n_live < 3 * live.size:
            if idx is None:
                t, idx = tt, np.flatnonzero(live)
            else:
                t[idx] = tt
                idx = idx[live]
            if n_live == 0:
                return t
            rr, kk, hh, tt, live = rr[live], kk[live], hh[live], tt[live], live[live]
    if idx is None:
        return tt
    t[idx] = tt
    return t


def _start_a(r: np.ndarray, kappa: np.ndarray, hi: np.ndarray, k: int,
             a: float) -> np.ndarray:
    """Part A's Newton start (:func:`_join_times`): G's binomial terms are all non-negative,
    so its first two, ``c1 t + c2 t^2``, lie below it; the quadratic's smallest root is left of
    f's (a valid start), and is f's own root for ``k = 2``."""
    c1, c2 = k * a ** (k - 1), 0.5 * k * (k - 1) * a ** (k - 2) if k > 2 else 1.0
    with np.errstate(over="ignore", invalid="ignore"):   # a huge ratio: no start, t = 0
        disc = (r - c1) ** 2 + 4.0 * c2 * kappa
        root = 2.0 * (-kappa) / ((r - c1) + np.sqrt(np.maximum(disc, 0.0)))
    return np.where((disc >= 0) & np.isfinite(root) & (root > 0), np.minimum(root, hi), 0.0)


def _start_b(r: np.ndarray, kappa: np.ndarray, hi: np.ndarray, k: int, a: float,
             scale: float) -> np.ndarray:
    """Part B's Newton start (:func:`_join_times`), left of the root and, on softmax laws,
    within about 1e-6 of it: one Newton step then reaches the root to rounding.

    * ``t0`` with ``G(t0) = kappa`` is left of the root: ``f(t0) = -r t0 <= 0``.
    * Right of ``t0``, ``G''' = k (k-1) (k-2) (a - t)^(k-3) >= 0``, so ``G`` lies above its
      quadratic Taylor polynomial at ``t0``; where ``f``'s quadratic minorant so formed has a
      root ``t_q``, ``f(t_q) >= 0``: the root lies in ``[t0, t_q]``.
    * ``f`` is concave, so it lies below its tangent at ``t_q``: where ``f'(t_q) > 0`` the
      tangent's root (a Newton step back) is left of the root again, with about the square
      of ``t_q``'s error. Elsewhere the start is ``t0``.
    """
    # in place where it reads as well: each fresh array of this size costs page faults
    w0 = np.maximum(a**k - kappa, 0.0)
    np.power(w0, 1.0 / k, out=w0)
    t0 = np.minimum(np.maximum(a - w0, 0.0), hi)
    np.subtract(a, t0, out=w0)
    wk2 = w0 if k >= 3 else np.ones_like(w0)   # w0^(k-2) by products (a float power is slower)
    for _ in range(k - 3):
        wk2 = wk2 * w0
    rt0 = r * t0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        slack = (k * w0) * wk2 - r if k >= 2 else 1.0 - r     # f'(t0)
        # the quadratic minorant's root: h = 2 r t0 / (slack + sqrt(slack^2 - 4 d2 r t0)),
        # d2 = -G''(t0) / 2 (NaN where it has none: ok fails below)
        den = wk2 * ((2.0 * k * (k - 1)) if k >= 2 else 0.0)
        den *= rt0
        np.subtract(slack * slack, den, out=den)
        np.sqrt(den, out=den)
        den += slack
        tq = np.divide(rt0, den, out=den)
        tq *= 2.0
        tq += t0
        np.minimum(tq, hi, out=tq)
        f, df = _newton_terms(tq, r, kappa, k, a, -1.0, scale)
        back = np.divide(f, df, out=f)
        np.subtract(tq, back, out=back)
    ok = (slack > 0) & (df > 0) & np.isfinite(back)
    return np.where(ok, np.minimum(np.maximum(back, t0), hi), t0)


def _newton_terms(tt: np.ndarray, rr: np.ndarray, kk: np.ndarray, k: int, a: float,
                  sign: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``(f, f')`` of :func:`_join_times` at ``tt``, with ``G``'s sum of powers of ``z``
    accumulated lowest first (the order that makes it free of cancellation)."""
    if a <= 0:                                           # part A with s = 1: G(t) = t^k
        return tt**k - rr * tt - kk, k * tt ** (k - 1) - rr
    # in place, the same operations in the same order (fresh temporaries cost page faults)
    z = tt * (sign / a)
    z += 1.0
    if k == 1:
        acc = zi = np.ones_like(tt)
    else:
        acc, zi = z + 1.0, z                             # 1 + z, then z^2 ... z^(k - 1)
        for _ in range(k - 2):
            zi = zi * z
            acc += zi
    df = zi * (k * scale)
    df -= rr
    f = tt * scale
    f *= acc
    f -= np.multiply(rr, tt, out=acc)                    # acc (and zi, for k = 1) read
    f -= kk
    return f, df


def _log_weights(q: np.ndarray, before: np.ndarray, join: np.ndarray) -> np.ndarray:
    """``log E`` at each token's join (tokens in join order; ``before`` the mass of the tokens
    ahead of each): between joins ``E`` shrinks with the group's remaining mass; a group
    exhausted exactly starts a new epoch. Made non-increasing exactly (rounding could
    otherwise reorder equal weights)."""
    left = np.maximum(before - join, 0.0)
    with np.errstate(divide="ignore"):
        step = np.where(left[1:] > 0, np.log(left[1:]), -EPOCH_GAP) - np.log(left[:-1]
                                                                            + q[:-1])
    return np.minimum.accumulate(np.concatenate([[0.0], np.cumsum(step)]))


def _part(pt: np.ndarray, qt: np.ndarray, k: int, a: float,
          sign: float) -> tuple[np.ndarray, np.ndarray]:
    """``(log weights, join times)`` of one part's tokens, their laws ``pt, qt`` in join
    order."""
    before = np.concatenate([[0.0], np.cumsum(qt)[:-1]])        # q(J_y): the group's mass
    with np.errstate(over="ignore", invalid="ignore"):
        r = pt / qt                                              # inf for a subnormal q
        kappa = np.concatenate([[0.0], np.cumsum(pt)[:-1]]) - r * before
    kappa = np.minimum(kappa, 0.0) if sign > 0 else np.maximum(kappa, 0.0)
    finite = np.isfinite(r) & np.isfinite(kappa)
    if finite.all():
        t = _join_times(r, kappa, before, k, a, sign)
    else:
        t = before.copy()          # an infinite ratio joins when the group is exhausted
        t[finite] = _join_times(r[finite], kappa[finite], before[finite], k, a, sign)
    t = np.maximum.accumulate(t)
    return _log_weights(qt, before, t), t


def race_plan(p: np.ndarray, q: np.ndarray, k: int) -> RacePlan:
    """The race for validated ``p, q`` (float64, summing to 1) and ``k >= 1`` i.i.d. drafts."""
    optimum, order, m = scan_order(p, q, k, True)
    V = p.size
    in_h = np.zeros(V, dtype=bool)
    in_h[order[:m]] = True
    head, tail = order[:m], order[m:]
    q_tail, p_tail = q[tail], p[tail]
    b = float(q_tail.sum())                                      # 1 - q(H)
    logw_b = np.full(V, -np.inf)
    races = (q_tail > 0) & (p_tail > 0)                          # p = 0 is silent
    b_tok, qb, pb = (tail, q_tail, p_tail) if races.all() else \
        (tail[races], q_tail[races], p_tail[races])              # join order: ratio decreasing
    log_theta = -np.inf
    if b_tok.size and b > 0:
        lw, t = _part(pb, qb, k, b, -1.0)
        logw_b[b_tok] = lw
        reject = max(b**k - float(p_tail.sum()), 0.0)
        end = b - reject ** (1.0 / k)                            # D(end) = p(H^c)
        left = float(qb.sum()) - end                             # racing mass left at the end
        last = max(float(qb[:-1].sum()) - t[-1], 0.0) + qb[-1]   # ... after the last join
        if left > 0:
            log_theta = float(lw[-1] + np.log(left) - np.log(last))
    # weight order ascending = join order reversed (the weights never increase along it)
    return RacePlan(p, q, k, in_h, b, head[q[head] > 0], b_tok[::-1], logw_b, log_theta,
                    optimum)
