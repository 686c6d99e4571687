r"""Exact arithmetic of *priority races* between drafts: the loads and the winner's law of the
race sampler (:mod:`coupling.rules.optimal.race`).

A race gives each racing token ``x`` a weight :math:`W_x > 0` (kept as :math:`\log W_x`) and
each of the ``k`` i.i.d. draws from ``q`` an independent coin :math:`u_j \sim U(0, 1)`; draw
``j`` has the key :math:`u_j W_{x_j}`.

* :func:`loads_min`: the smallest key among the racing draws wins. Per token, the
  probability that a draw of it wins,

  .. math:: \ell_x = k q_x \int_0^1 (1 - G(u W_x))^{k-1} du, \qquad
            G(\kappa) = \sum_{y\ \mathrm{racing}} q_y \min(1, \kappa / W_y);

* :func:`loads_max`: the largest key wins and is kept only if it is at least
  :math:`\theta`, and every draw must be allowed (racing, or *silent*: never kept, never
  blocking):

  .. math:: \ell_x = k q_x \int_{\theta / W_x}^1 G(u W_x)^{k-1} du, \qquad
            G(\kappa) = \sum_{y\ \mathrm{allowed}} q_y \min(1, \kappa / W_y)\
            (\text{silent } y\text{: } q_y).

Between consecutive sorted weights both integrands are polynomials in :math:`\kappa = u W_x`
(``G`` is linear there), so with weights sorted ascending and
:math:`\Delta_j = W_j - W_{j-1}`

.. math:: \ell_{(i)} = \frac{q_{(i)}}{W_{(i)}} \sum_{j \le i} \Delta_j\, h_j, \qquad
          h_j = \sum_{m=0}^{k-1} g_{j,\mathrm{lo}}^{m}\, g_{j,\mathrm{hi}}^{k-1-m},

``g`` the integrand's base at the piece's two ends (:math:`h_j \Delta_j` is ``k`` times the
piece's integral, written without the cancelling :math:`g_{lo}^k - g_{hi}^k`). The sums run on
weights divided by the smallest when they span under 600 nats (plain cumulative sums), else
in log space, so weights of any range neither underflow nor overflow. One pass, O(n k).

:func:`win_given_min` and :func:`win_given_max` give the exact law of the winner for one
drafted tuple (one polynomial integral per draw): the rows of the exact joint law.
"""

from __future__ import annotations

import numpy as np
from numpy.polynomial import polynomial as P

__all__ = ["loads_min", "loads_max", "win_given_min", "win_given_max"]

#: weights spanning less than this many nats are summed linearly (exp stays finite)
LINEAR_SPAN = 600.0


def _geometric(lo: np.ndarray, hi: np.ndarray, k: int) -> np.ndarray:
    r""":math:`\sum_{m<k} lo^m hi^{k-1-m}`, i.e. :math:`(lo^k - hi^k)/(lo - hi)` without
    cancelling: Horner's rule :math:`s_{j+1} = lo\, s_j + hi^j`, products and sums of
    non-negative terms only (a float power per term costs more than the whole product)."""
    out = np.ones_like(lo)
    power = np.ones_like(hi)
    for _ in range(k - 1):
        power *= hi
        out *= lo
        out += power
    return out


def _race_sums(q: np.ndarray, logw: np.ndarray, k: int, *, base: float, sign: float,
               logw0: float) -> np.ndarray:
    """The loads of racing tokens sorted by ``logw`` ascending (``logw[0] >= logw0``, the
    left end of the first piece), for the integrand base ``g = base + sign * G_racing``."""
    lw_prev = np.concatenate([[logw0], logw[:-1]])
    saturated = np.concatenate([[0.0], np.cumsum(q)[:-1]])   # q of the tokens below the piece
    shift = logw[0]
    linear = logw[-1] - shift < LINEAR_SPAN
    with np.errstate(divide="ignore", under="ignore"):
        # B_j W: the racing mass still linear on piece j (sum_{l >= j} q_l / W_l), times W at
        # the piece's two ends
        if linear:
            w = np.exp(logw - shift)                           # >= 1
            bsum = np.cumsum((q / w)[::-1])[::-1]
            bw_hi, bw_lo = bsum * w, bsum * np.exp(lw_prev - shift)
        else:
            lb = np.logaddexp.accumulate((np.log(q) - logw)[::-1])[::-1]
            bw_hi, bw_lo = np.exp(lb + logw), np.exp(lb + lw_prev)
        g_lo = np.clip(base + sign * (saturated + bw_lo), 0.0, None)
        g_hi = np.clip(base + sign * (saturated + bw_hi), 0.0, None)
        h = _geometric(g_lo, g_hi, k)
        frac = -np.expm1(np.minimum(lw_prev - logw, 0.0))      # Delta_j / W_j, exact at ties
        if linear:
            return q * np.cumsum(w * frac * h) / w
        acc = np.logaddexp.accumulate(logw + np.log(frac) + np.log(h))
        return q * np.exp(acc - logw)


def _sorted_racing(logw: np.ndarray, mask: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    if order is None:
        idx = np.flatnonzero(mask)
        return idx[np.argsort(logw[idx], kind="stable")]
    return order[mask[order]]


def loads_min(q: np.ndarray, logw: np.ndarray, k: int,
              order: np.ndarray | None = None) -> np.ndarray:
    """Per token, ``P(a draw of it has the smallest key among the racing draws)`` ``[V]``.

    Tokens with finite ``logw`` and ``q > 0`` race; ``order``: the racing tokens already
    sorted by ``logw`` ascending (saves a sort).
    """
    out = np.zeros_like(q)
    o = _sorted_racing(logw, np.isfinite(logw) & (q > 0), order)
    if o.size:
        out[o] = _race_sums(q[o], logw[o], k, base=1.0, sign=-1.0, logw0=-np.inf)
    return out


def loads_max(q: np.ndarray, logw: np.ndarray, k: int, log_theta: float, allowed: np.ndarray,
              order: np.ndarray | None = None) -> np.ndarray:
    """Per token, ``P(all k draws are allowed, a draw of it has the largest key, and that key
    is >= theta)`` ``[V]``. Allowed tokens with ``logw = -inf`` or ``W < theta`` are silent.
    ``order``: the racing tokens sorted by ``logw`` ascending, if known."""
    out = np.zeros_like(q)
    racing = allowed & np.isfinite(logw) & (q > 0) & (logw >= log_theta)
    o = _sorted_racing(logw, racing, order)
    if o.size:
        silent = float(q[allowed & (q > 0) & ~racing].sum())   # saturated for kappa >= theta
        # the first piece starts at theta, where every racing token already counts
        # q_y theta / W_y: the linear part of G from there on
        out[o] = _race_sums(q[o], logw[o], k, base=silent, sign=1.0, logw0=log_theta)
    return out


def win_given_min(logw: np.ndarray) -> np.ndarray:
    r"""``P(draw j has the smallest key)`` for racing draws of weights ``exp(logw)``:
    :math:`\int_0^{t^*} \prod_{i \ne j} (1 - c_i t)\, dt` with :math:`c_i = W_j / W_i` and
    :math:`t^* = \min(1, 1/\max_i c_i)`, one polynomial of degree ``k - 1``."""
    out = np.zeros(logw.size)
    for j in range(logw.size):
        c = np.exp(logw[j] - np.delete(logw, j))
        poly = np.array([1.0])
        for ci in c:
            poly = P.polymul(poly, [1.0, -ci])
        out[j] = P.polyval(min(1.0, 1.0 / c.max()) if c.size else 1.0, P.polyint(poly))
    return out


def win_given_max(logw: np.ndarray, log_theta: float) -> tuple[np.ndarray, float]:
    r"""``(P(draw j has the largest key and it is >= theta) [m], P(every key < theta))``.

    Draw ``j`` with coin ``t`` wins with :math:`\prod_{i \ne j} \min(1, c_i t)` on
    :math:`[\theta / W_j, 1]`; between the sorted breakpoints :math:`1/c_i` that is a monomial.
    Silent draws (``logw = -inf``) never win and never block.
    """
    out = np.zeros(logw.size)
    live = np.isfinite(logw)
    with np.errstate(over="ignore"):
        reject = float(np.prod(np.minimum(1.0, np.exp(log_theta - logw[live]))))
    for j in np.flatnonzero(live):
        lo = min(1.0, float(np.exp(log_theta - logw[j])))
        others = np.delete(logw, j)
        c = np.exp(logw[j] - others[np.isfinite(others)])      # factor min(1, c t)
        edges = np.concatenate([[lo], np.sort(np.clip(1.0 / c, lo, 1.0)), [1.0]])
        total = 0.0
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            if b > a:
                lin = c * (0.5 * (a + b)) < 1.0                 # factors still linear here
                n = int(lin.sum())
                total += float(np.prod(c[lin])) * (b ** (n + 1) - a ** (n + 1)) / (n + 1)
        out[j] = total
    return out, reject
