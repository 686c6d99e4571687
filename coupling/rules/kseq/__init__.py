r"""``kseq``: SpecTr's k-sequential selection (Sun et al., NeurIPS 2023, "SpecTr: Fast
Speculative Decoding via Optimal Transport", Algorithm "K-SEQ").

Setting: ``k`` i.i.d. drafts :math:`x_1, \dots, x_k \sim q` (with replacement only).

Algorithm (what :func:`verify` does, step by step)
--------------------------------------------------
Fix :math:`\rho \ge 1` (below) and let :math:`a(x) = \min(1, p(x) / (\rho\, q(x)))`.

1. For ``i = 1..k``: draw ``u_i ~ U[0,1)``; if ``u_i * rho * q(x_i) < p(x_i)`` output
   ``x_i`` and stop.
2. If every draft was rejected, draw ``u_res ~ U[0,1)`` and output the inverse-CDF draw
   from the residual

.. math::

    p_{\mathrm{res}}(y) = \frac{p(y) - c\,\min(q(y), p(y)/\rho)}{(1-\beta)^k},\qquad
    \beta = \sum_y \min(q(y), p(y)/\rho),\quad c = \frac{1 - (1-\beta)^k}{\beta}.

Why it is lossless: a draft is accepted at step ``i`` with token law
:math:`(1-\beta)^{i-1} \min(q, p/\rho)`; summing over ``i`` gives
:math:`c \min(q, p/\rho)`, and the residual supplies the rest of ``p`` with the remaining
mass :math:`(1-\beta)^k`. Where some token of ``p``-mass has :math:`p/q < \rho`, the residual
is a distribution iff :math:`c \le \rho` (those tokens need :math:`p \ge c\,p/\rho`; the others
then satisfy :math:`p \ge \rho q \ge c q`), i.e. iff

.. math:: g(\rho) = \rho\beta(\rho) - \big(1 - (1-\beta(\rho))^k\big) \ge 0 ;

where none has, it needs only :math:`c \le \min_{p > 0} p/q` (:mod:`.rho` explains how this
decides ``rho = 1``).

Choice of rho: the best valid choice is the smallest root :math:`\rho^\star \in [1, k]` of
``g``, found by :func:`coupling.rules.kseq.rho.optimal_rho` (exact up to rounding; its module
describes how). The acceptance is reported as :math:`\beta c` (no cancellation).
For ``k = 1``, :math:`\rho^\star = 1` and the rule is ``token``.

``rho`` and the residual depend only on ``(p, q, k)``: the torch twin computes them once per
step for the rows that need them (a test ``u rho q(x) < p(x)`` can be decided without ``rho``
when it holds or fails for every ``rho`` in ``[1, k]``), then runs the accept loop.

Guarantee (Sun et al. 2023, abstract and Theorem on K-SEQ): acceptance
:math:`\ge (1 - 1/e)` times the optimal (LP) acceptance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ...dist import check_pair, tuple_law, validate_k
from ...lp.cut import optimal_acceptance
from ..base import Rule
from ..common import categorical
from .rho import beta as beta_at
from .rho import geometric_c
from .rho import optimal_rho as _optimal_rho

__all__ = ["acceptance", "joint", "verify", "residual_law", "optimal_rho", "KSequential",
           "RULE", "APPROX", "RESIDUAL_ULPS"]

#: Sun et al.'s approximation ratio, 1 - 1/e
APPROX = 1.0 - math.exp(-1.0)
#: residual entries within this many ulps of ``p(x)`` count as 0 (see :func:`residual_at`)
RESIDUAL_ULPS = 64


def _params(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, np.ndarray, float]:
    rho = _optimal_rho(p, q, k)
    # acceptance probability of each token when drafted: min(1, p / (rho q))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = np.where(q > 0, np.minimum(1.0, p / (rho * np.where(q > 0, q, 1.0))), 0.0)
    return rho, a, beta_at(p, q, rho)


def residual_at(p: np.ndarray, q: np.ndarray, k: int, rho: float,
                beta: float | None = None) -> np.ndarray:
    """The residual law at a given ``rho`` (``p`` itself where ``beta = 0``)."""
    low = np.minimum(q, p / rho)
    beta = float(low.sum()) if beta is None else beta
    if beta <= 0.0:
        return p.copy()
    c = float(geometric_c(beta, k))
    # where the residual is exactly 0 in exact arithmetic, rounding leaves +-1e-17 (and the
    # torch twin may round the other way): entries within 64 ulps of p(x) count as 0, which
    # moves the law by at most 1.5e-14 in TV and makes both backends agree on the support
    d = p - c * low
    d = np.where(d > RESIDUAL_ULPS * np.finfo(np.float64).eps * p, d, 0.0)
    z = float(d.sum())
    return d / z if z > 0 else p.copy()


def optimal_rho(p: ArrayLike, q: ArrayLike, k: int) -> float:
    r"""The smallest valid ratio :math:`\rho^\star \in [1, k]` for ``k`` i.i.d. drafts
    (:func:`coupling.rules.kseq.rho.optimal_rho` on the validated laws)."""
    pa, qa = check_pair(p, q)
    return _optimal_rho(pa, qa, validate_k(k))


def residual_law(p: ArrayLike, q: ArrayLike, k: int) -> np.ndarray:
    """The K-SEQ residual :math:`p_{res}` at the optimal rho (``p``, ``q``, ``k`` validated)."""
    pa, qa = check_pair(p, q)
    k = validate_k(k)
    rho, _, beta = _params(pa, qa, k)
    return residual_at(pa, qa, k, rho, beta)


def acceptance(p: np.ndarray, q: np.ndarray, k: int) -> float:
    r""":math:`1 - (1 - \beta(\rho^\star))^k`, as :math:`\beta c` (no cancellation)."""
    _, _, beta = _params(p, q, k)
    return float(beta * geometric_c(beta, k))


def joint(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """Exact law ``[V**k, V]`` of (draft tuple, output), rows in ``tuple_law`` order."""
    rho, a, beta = _params(p, q, k)
    res = residual_at(p, q, k, rho, beta)
    tuples, probs = tuple_law(q, k, replacement=True)
    T, V = tuples.shape[0], p.size
    A = a[tuples]  # [T, k] acceptance probability of each draft
    surv = np.concatenate([np.ones((T, 1)), np.cumprod(1.0 - A, axis=1)], axis=1)  # [T, k+1]
    J = np.zeros((T, V))
    rows = np.arange(T)
    for i in range(k):
        np.add.at(J, (rows, tuples[:, i]), probs * surv[:, i] * A[:, i])
    J += np.outer(probs * surv[:, k], res)
    return J


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u_accept: np.ndarray,
           u_resid: float) -> int:
    """Deterministic core (validated laws).

    ``rho`` is only needed through the tests ``u rho q(x) < p(x)`` and the residual: a draft
    with ``u q(x) >= p(x)`` fails and one with ``u k q(x) < p(x)`` passes for every ``rho``
    in ``[1, k]`` (rounding is monotone), so where the first draft that does not surely
    fail surely passes, it is the output without computing ``rho`` (the same bit for bit).
    """
    k = drafts.size
    for i in range(k):
        x = int(drafts[i])
        if u_accept[i] * q[x] >= p[x]:
            continue
        if u_accept[i] * k * q[x] < p[x]:
            return x
        break
    rho = _optimal_rho(p, q, k)
    for i in range(k):
        x = int(drafts[i])
        if u_accept[i] * rho * q[x] < p[x]:
            return x
    return categorical(residual_at(p, q, k, rho), u_resid)


class KSequential(Rule):
    """SpecTr's k-sequential selection: accept the first draft passing ``u rho q(x) < p(x)``,
    else draw the K-SEQ residual."""

    name = "kseq"
    twin = "coupling.rules.kseq.torch"
    title = "SpecTr k-sequential selection"
    reference = "Sun et al., SpecTr, NeurIPS 2023"
    draft_laws = (True,)
    bound_text = ">= (1 - 1/e) * OPT (Sun et al. 2023, SpecTr: K-SEQ approximation guarantee)"

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, drafts, u[:-1], float(u[-1]))

    def _bound(self, p, q, k, replacement):

        opt = optimal_acceptance(p, q, k, replacement=True)
        return APPROX * opt, opt


RULE = KSequential()
