r"""Exact laws of Gumbel-max list sampling through the exponential race (derived here).

Write :math:`E_{c,i} = e^{-G_{c,i}} \sim \mathrm{Exp}(1)` for the ``K`` noise columns. Column
``c`` drafts :math:`X_c = \arg\min_i E_{c,i}/q_i`; the target emits the token of
:math:`t = \min_{c,i} E_{c,i}/p_i`. With :math:`r_j = p_j/q_j` and the convex piecewise-linear
:math:`\varphi(w) = \sum_j (q_j w - p_j)_+`:

* ``Y = i`` wins in column ``c`` at time ``t`` with density :math:`p_i e^{-Kt}` (every one of
  the ``K`` columns alike); given that, memorylessness makes every other
  :math:`E_{c',j} = t p_j + \mathrm{Exp}(1)`;
* the winning column drafts ``i`` with probability :math:`a_i(t) = e^{-t\varphi(r_i)}` and
  ``x != i`` with :math:`g_{i,x}(t) = q_x t \int_{r_x}^{r_i} e^{-t\varphi(w)} dw`;
* any other column drafts ``x`` with :math:`b_x(t) = q_x t \int_{r_x}^{\infty}
  e^{-t\varphi(w)} dw`, independently given ``t``.

Between consecutive sorted ratios :math:`r_{(m)} \le w \le r_{(m+1)}`,
:math:`\varphi(w) = S_m w - P_m` (``S_m``, ``P_m`` the ``q`` and ``p`` mass of the first
``m + 1`` ratios), so every one of these is a finite sum of exponentials
:math:`\sum c\, e^{-\lambda t}` with :math:`\lambda_m = \varphi(r_{(m)})`:
:math:`q_x t \int_{r_{(m)}}^{r_{(m+1)}} e^{-t\varphi} = q_x (e^{-t\lambda_m} -
e^{-t\lambda_{m+1}}) / S_m`. Products of such sums are such sums, and
:math:`\int_0^\infty e^{-Kt} \sum c\, e^{-\lambda t} dt = \sum c / (K + \lambda)`: every law
below is a closed form (:class:`ExpSum`), rational when ``p`` and ``q`` are.

A walk along a draft tree sees ``m <= K`` of the columns at an offset (the surviving
branches) while the target still reads all ``K``; :func:`joint` and :func:`collision` take
both, ``m`` observed columns of ``K``:

.. math::

    P(X_{1..m} = x, Y = i) = p_i \int_0^\infty e^{-Kt}\Big[\sum_{c \le m} g_{i,x_c}
        \prod_{c' \ne c} b_{x_{c'}} + (K - m) \prod_{c} b_{x_c}\Big] dt,

with :math:`g_{i,i} = a_i`. Summed over ``x`` the bracket is ``K``, so the output law is
``p`` (lossless), and the rows are the i.i.d. law of ``m`` drafts.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy import integrate

__all__ = ["Race", "ExpSum", "collision", "acceptance", "joint", "own_column", "list_matching"]

#: an exponential sum ``t -> sum(coef * exp(-rate * t))`` as ``(coef, rate)``
ExpSum = tuple[np.ndarray, np.ndarray]

#: ``method="auto"`` expands the exponential sums while they hold at most this many terms
MAX_TERMS = 20_000


def _mul(f: ExpSum, g: ExpSum) -> ExpSum:
    return np.multiply.outer(f[0], g[0]).ravel(), np.add.outer(f[1], g[1]).ravel()


def _laplace(f: ExpSum, s: float):
    r""":math:`\int_0^\infty e^{-st} f(t)\, dt`."""
    c, r = f
    return (c / (s + r)).sum()


def _ones(dtype) -> np.ndarray:
    """``[1]`` in ``dtype``: an exact Fraction for object arrays (an int 1 would turn a
    division into a float)."""
    if np.dtype(dtype) == np.dtype(object):
        return np.array([Fraction(1)], dtype=object)
    return np.ones(1, dtype=dtype)


def _one_minus(f: ExpSum) -> ExpSum:
    one = _ones(f[0].dtype)
    return np.concatenate([one, -f[0]]), np.concatenate([0 * one, f[1]])


class Race:
    """The sorted-ratio pieces of :math:`\\varphi` for one ``(p, q)`` (float64 or exact
    Fraction laws): tokens with ``q > 0`` by ratio ascending, ``lam[m]`` and ``S[m]``; a token
    with ``q = 0`` sits past the end (ratio :math:`+\\infty`: never drafted)."""

    def __init__(self, p: np.ndarray, q: np.ndarray):
        self.p, self.q = p, q
        live = np.flatnonzero(q != 0)
        if p.dtype == object:
            tok = sorted(live.tolist(), key=lambda j: p[j] / q[j])
        else:
            with np.errstate(over="ignore"):       # p / (subnormal q) is inf: it sorts last
                tok = live[np.argsort(p[live] / q[live], kind="stable")]
        self.tok = np.asarray(tok, dtype=np.int64)
        qs, ps = q[self.tok], p[self.tok]
        self.S = np.cumsum(qs)
        with np.errstate(over="ignore", invalid="ignore"):
            r = ps / qs
            # phi(r_m) = r_m S_m - P_m = sum_{l <= m} q_l (r_m - r_l): a sum of non-negative
            # terms, written so as not to cancel (and inf where r_m overflowed)
            lam = r * self.S - np.cumsum(ps) if p.dtype == object else \
                np.where(np.isfinite(r), np.maximum(r * self.S - np.cumsum(ps), 0.0), np.inf)
        self.lam = lam
        self.n = self.tok.size
        self.pos = np.full(p.size, self.n)
        self.pos[self.tok] = np.arange(self.n)

    def pieces(self, x: int, upto: int) -> ExpSum:
        """:math:`q_x t \\int_{r_x}^{r_{(upto)}} e^{-t\\varphi}` (``upto = n``: to infinity)."""
        m = np.arange(int(self.pos[x]), upto)
        if m.size == 0:
            return np.zeros(0, dtype=self.q.dtype), np.zeros(0, dtype=self.q.dtype)
        inv = np.array([self.q[x] / s for s in self.S[m]], dtype=self.q.dtype) \
            if self.q.dtype == object else self.q[x] / self.S[m]
        nxt = m + 1 < self.n                                   # the last piece runs to infinity
        return (np.concatenate([inv, -inv[nxt]]),
                np.concatenate([self.lam[m], self.lam[m[nxt] + 1]]))

    def b(self, x: int) -> ExpSum:
        """A non-winning column drafts ``x``."""
        return self.pieces(x, self.n)

    def g(self, i: int, x: int) -> ExpSum:
        """The column where ``Y = i`` won drafts ``x`` (``a_i`` for ``x = i``)."""
        if x == i:
            return _ones(self.q.dtype), np.array([self.lam[self.pos[i]]], dtype=self.q.dtype)
        return self.pieces(x, int(self.pos[i]))


def joint(p: np.ndarray, q: np.ndarray, tuples: np.ndarray, K: int) -> np.ndarray:
    """Exact ``P(observed drafts = tuple, Y = i)``, ``[T, V]``, for ``m`` observed columns of
    ``K`` (``tuples [T, m]``; module doc). Float64 or exact Fraction laws; small ``V``."""
    race = Race(p, q)
    T, m = tuples.shape
    V = p.size
    J = np.zeros((T, V), dtype=p.dtype)
    b = [race.b(x) for x in range(V)]
    for t, tup in enumerate(tuples.tolist()):
        if any(q[x] == 0 for x in tup):
            continue
        rest = [_prod((b[y] for j, y in enumerate(tup) if j != c), p.dtype) for c in range(m)]
        unseen = _mul(b[tup[0]], rest[0]) if K > m else None
        for i in np.flatnonzero(p != 0):
            f = sum(_laplace(_mul(race.g(int(i), x), rest[c]), K) for c, x in enumerate(tup))
            if unseen is not None:
                f = f + (K - m) * _laplace(unseen, K)
            J[t, i] = p[i] * f
    return J


def _prod(fs, dtype) -> ExpSum:
    """The product of exponential sums (the constant 1 for none), in ``dtype``."""
    one = _ones(dtype)
    out = one, 0 * one
    for f in fs:
        out = _mul(out, f)
    return out


def collision(p: np.ndarray, q: np.ndarray, m: int, K: int, *,
              method: str = "auto") -> np.ndarray:
    r"""Per token ``P(Y = i and i is among the m observed drafts)`` (``m`` of ``K`` columns):
    :math:`p_i \int_0^\infty e^{-Kt}[K - m(1 - a_i)(1 - b_i)^{m-1} - (K - m)(1 - b_i)^m]\,
    dt`.

    ``m = 1`` is a closed form at any ``V`` (:math:`p_i [1/(K + \lambda_i) + (K - 1) \hat
    b_i(K)]`, :math:`\hat b_i` the Laplace transform of :math:`b_i`, one suffix sum; ``K = 1``
    is the Gumbel coupling's :math:`p_i / (1 + \varphi(r_i))`). For ``m >= 2``,
    ``method="exact"`` expands the exponential sums (terms grow as ``n^m``, ``n`` the support
    of ``q``: small supports; float64 or exact Fractions), ``"quad"`` integrates in ``t``
    adaptively (:func:`scipy.integrate.quad_vec`, O(V) per node: any ``V``, absolute error
    below 1e-13), ``"auto"`` picks ``"exact"`` up to :data:`MAX_TERMS` terms.
    """
    if method not in ("auto", "exact", "quad"):
        raise ValueError(f"method must be 'auto', 'exact' or 'quad', got {method!r}")
    race = Race(p, q)
    if m == 1:
        return _collision_one(race, K)
    if method == "auto":
        method = "exact" if (2 * race.n + 1) ** m <= MAX_TERMS else "quad"
    out = np.zeros(p.size, dtype=p.dtype)
    if method == "quad":
        pt = p[race.tok]
        rej = integrate.quad_vec(lambda t: np.exp(-K * t) * _rejected(race, m, K, t), 0.0,
                                 np.inf, epsabs=1e-15, epsrel=1e-12)[0]
        out[race.tok] = pt * np.clip(1.0 - rej, 0.0, 1.0)
        return out
    for i in race.tok[p[race.tok] != 0]:
        one_b = _one_minus(race.b(int(i)))
        rej = (m * _laplace(_mul(_one_minus(race.g(int(i), int(i))),
                                 _power(one_b, m - 1)), K)
               + (K - m) * _laplace(_power(one_b, m), K))
        out[i] = p[i] * (1 - rej)
    return out


def _collision_one(race: Race, K: int) -> np.ndarray:
    """:func:`collision` for one observed column, O(n) after the sort."""
    p, tok = race.p, race.tok
    out = np.zeros(p.size, dtype=p.dtype)
    if race.n == 0:
        return out
    if p.dtype == object:
        lap = np.array([1 / (K + lam) for lam in race.lam], dtype=object)
        nxt = np.append(lap[1:], 0 * lap[0])
    else:
        with np.errstate(over="ignore"):
            lap = 1.0 / (K + race.lam)                     # 0 where lam overflowed
        nxt = np.append(lap[1:], 0.0)
    d = (lap - nxt) / race.S
    tail = np.cumsum(d[::-1])[::-1]                        # sum over the pieces m >= pos
    out[tok] = p[tok] * (lap + (K - 1) * race.q[tok] * tail)
    return out


def _power(f: ExpSum, n: int) -> ExpSum:
    return _prod([f] * n, f[0].dtype)


def _rejected(race: Race, m: int, K: int, t: float) -> np.ndarray:
    """The bracket of the rejected mass at time ``t``, per token of ``race.tok`` (O(n))."""
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.exp(-t * race.lam)
        piece = (a - np.append(a[1:], 0.0)) / race.S
    b = np.clip(race.q[race.tok] * np.cumsum(piece[::-1])[::-1], 0.0, 1.0)
    return m * (1 - a) * (1 - b) ** (m - 1) + (K - m) * (1 - b) ** m


def acceptance(p: np.ndarray, q: np.ndarray, m: int, K: int, *, method: str = "auto") -> float:
    """``P(Y is among the m observed drafts)``: the sum of :func:`collision`."""
    return float(collision(p, q, m, K, method=method).sum())


def own_column(p: np.ndarray, q: np.ndarray, K: int) -> float:
    r""":math:`\sum_i K p_i / (K + \varphi(r_i))`: ``P(Y`` is the winning column's draft``)``,
    a lower bound on the collision probability of ``K`` drafts."""
    race = Race(p, q)
    i = race.tok
    with np.errstate(over="ignore"):
        return float(np.sum(K * p[i] / (K + race.lam)))


def list_matching(p: np.ndarray, q: np.ndarray, K: int) -> float:
    r""":math:`\sum_i (1/p_i + 1/(K q_i))^{-1} = \sum_i K p_i q_i / (K q_i + p_i)`: since
    :math:`\varphi(r_i) \le r_i`, a lower bound on :func:`own_column` (``K = 1``: Daliri et
    al.'s :math:`\sum_i p_i q_i / (p_i + q_i)`)."""
    both = (p > 0) & (q > 0)
    pb, qb = p[both], q[both]
    return float(np.sum(K * pb * qb / (K * qb + pb)))
