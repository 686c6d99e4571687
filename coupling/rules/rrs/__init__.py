r"""``rrs``: recursive rejection sampling over ``k`` drafts.

SpecInfer's multi-step speculative sampling (Miao et al. 2024), "Multi-candidate
speculative decoding" (Yang et al. 2024) and "Recursive speculative decoding"
(Jeon et al. 2024). Each draft in turn gets one speculative-sampling test against the
*current* target, which after a rejection becomes the residual.

Algorithm (what :func:`verify` does, step by step)
--------------------------------------------------
State: target :math:`r_0 = p`; draft law :math:`q_1 = q`.

For ``i = 1..k``:

1. ``x_i`` is the i-th draft; its law given the past is :math:`q_i`:
   with replacement :math:`q_i = q`; without replacement (successive sampling,
   e.g. Gumbel-top-k) :math:`q_i = q` with :math:`x_1..x_{i-1}` zeroed and renormalised,
   :math:`q_i(y) = q(y) / (1 - \sum_{j<i} q(x_j))`.
2. Draw ``u_i ~ U[0,1)``; accept (output ``x_i``, stop) iff
   ``u_i * q_i(x_i) < r_{i-1}(x_i)``.
3. Otherwise :math:`r_i = (r_{i-1} - q_i)_+ / \sum (r_{i-1} - q_i)_+`.

If all ``k`` are rejected, draw ``u_res`` and output the inverse-CDF draw from
:math:`r_k`.

Why it is lossless: given the history up to step ``i`` the draft :math:`x_i` has law
:math:`q_i`, so step ``i`` is a single-draft speculative-sampling step from proposal
:math:`q_i` to target :math:`r_{i-1}`: its output, or on rejection the law of what
follows (by induction, :math:`r_i`), mixes back to :math:`r_{i-1}`. Unrolling gives
``p``. Without replacement, a rejected :math:`x_j` had :math:`r_{j-1}(x_j) < q_j(x_j)`,
so :math:`r_j(x_j) = 0`: the residual never asks for an already drafted token.

Acceptance (closed form)
------------------------
With replacement the residual chain does not depend on which tokens were rejected, so

.. math:: \alpha = 1 - \prod_{i=1}^k \big(1 - \beta_i\big), \qquad
          \beta_i = \sum_y \min(r_{i-1}(y), q(y)) = 1 - \mathrm{TV}(r_{i-1}, q),

O(kV). Without replacement the chain depends on the rejected path; ``P(all rejected)``
is a sum over rejection paths of :math:`\prod_i (q_i(x_i) - r_{i-1}(x_i))_+` times the
last step's rejection mass. ``k = 2`` has an O(V log V) form (the first residual
:math:`r_1` does not depend on :math:`x_1`, and the second step's rejection mass
:math:`S(c) - c\,q(x_1)` with :math:`c = 1/(1-q(x_1))`,
:math:`S(c) = \sum_y (c\,q(y) - r_1(y))_+`, is read off one sort of :math:`r_1/q`);
``k >= 3`` enumerates rejection paths, cost O(V^k), and raises ``ValueError`` beyond
:data:`MAX_PATH_WORK`.
"""

from __future__ import annotations

import numpy as np

from ...dist import num_tuples, tuple_law
from ...lp.cut import optimal_acceptance
from ...lp.draftsets import others_sum
from ..base import Rule
from ..common import categorical

__all__ = ["acceptance", "joint", "try_law", "verify", "RecursiveRejection", "RULE",
           "MAX_PATH_WORK"]

#: Largest V**k for the exact path enumeration (without replacement, k >= 3).
MAX_PATH_WORK = 20_000_000


def _next_residual(r: np.ndarray, qi: np.ndarray) -> np.ndarray:
    d = np.maximum(r - qi, 0.0)
    z = float(d.sum())
    # z == 0 means this step accepts with probability 1: the residual is never used
    return d / z if z > 0 else r


def acceptance(pa: np.ndarray, qa: np.ndarray, k: int, replacement: bool = True) -> float:
    """Exact acceptance (closed form with replacement; see module doc for the cost without)."""
    if replacement or k == 1:
        r, reject = pa, 1.0
        for _ in range(k):
            reject *= 1.0 - float(np.minimum(r, qa).sum())
            r = _next_residual(r, qa)
        return float(1.0 - reject)
    if k == 2:
        return float(1.0 - _reject2_wor(pa, qa))
    work = num_tuples(pa.size, k, True)
    if work > MAX_PATH_WORK:
        raise ValueError(
            f"rrs acceptance without replacement for k={k} enumerates rejection paths (cost V**k = "
            f"{work:.3g} > {MAX_PATH_WORK:.3g}); "
            "use k <= 2, replacement=True, or a smaller vocabulary"
        )
    return float(1.0 - _reject_paths(pa, qa, qa.copy(), 1.0, k))


def _reject2_wor(p: np.ndarray, q: np.ndarray) -> float:
    w1 = np.maximum(q - p, 0.0)  # P(draft x1 and reject it); such x1 have r1(x1) = 0
    r1 = _next_residual(p, q)
    x1 = np.flatnonzero(w1 > 0)
    if x1.size == 0:
        return 0.0
    rest = others_sum(q)[x1]  # 1 - q_x1 without cancellation when q_x1 is near 1
    # second step, given x1: rejection mass S = sum_{y != x1} (c q_y - r1_y)_+, a sum over the
    # y with r1_y / q_y < c. Split the y with r1_y = 0 (group G0, which contains x1) from
    # the rest, so that x1's own term is excluded exactly instead of subtracted.
    g0 = (q > 0) & (r1 == 0)
    q0 = q[g0]
    pos_in_g0 = np.cumsum(g0) - 1  # index of each G0 token inside q0
    other0 = others_sum(q0)[pos_in_g0[x1]]  # q-mass of G0 without x1
    m = (q > 0) & (r1 > 0)
    # the y with r1_y / q_y < c = 1 / (1 - q_x1), found in the order of r1 / q; compared as
    # logarithms, since with a subnormal q_y or 1 - q_x1 the ratios overflow to inf and tie
    # (ties at the threshold itself add (c q_y - r1_y)_+ = 0 whichever side they fall on)
    log_ratio = np.log(r1[m]) - np.log(q[m])
    order = np.argsort(log_ratio)
    cq = np.concatenate([[0.0], np.cumsum(q[m][order])])
    cr = np.concatenate([[0.0], np.cumsum(r1[m][order])])
    n = np.searchsorted(log_ratio[order], -np.log(rest), side="left")
    # c (other0 + cq) as a ratio, other0 + cq <= 1 - q_x1: no inf * 0 when 1 - q_x1 is tiny
    rej2 = np.maximum((other0 + cq[n]) / rest - cr[n], 0.0)
    return float(min(1.0, (w1[x1] * rej2).sum()))


def _reject_paths(r: np.ndarray, q: np.ndarray, qi: np.ndarray, mass: float, steps: int) -> float:
    """P(all remaining ``steps`` rejected) times ``mass``; ``qi`` is the current draft law."""
    w = np.maximum(qi - r, 0.0)  # per-token probability of "draft it and reject it"
    if steps == 1:
        return mass * float(w.sum())
    r_next = _next_residual(r, qi)
    total = 0.0
    for x in np.flatnonzero(w > 0):
        qn = qi.copy()
        qn[x] = 0.0
        z = qn.sum()
        if z <= 0:
            continue
        total += _reject_paths(r_next, q, qn / z, mass * float(w[x]), steps - 1)
    return total


def _chain(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, replacement: bool):
    """Yield (x_i, r_{i-1}, q_i) along the drafts, and finally the last residual."""
    r = p
    qi = q
    steps = []
    for i, x in enumerate(drafts):
        x = int(x)
        steps.append((x, r, qi))
        r = _next_residual(r, qi)
        if not replacement and i + 1 < drafts.size:
            qn = qi.copy()
            qn[x] = 0.0
            qi = qn / qn.sum()
    return steps, r


def try_law(p: np.ndarray, q: np.ndarray, drafts: np.ndarray,
            replacement: bool = True) -> np.ndarray:
    """``[m + 1]``: the probability, given the drafts, that try ``i`` accepts (``i < m``), and
    last that all ``m`` are rejected (over the coins; laws validated, float64).

    >>> try_law(np.array([0.5, 0.5]), np.array([1.0, 0.0]), np.array([0, 0])).tolist()
    [0.5, 0.0, 0.5]
    """
    steps, _ = _chain(p, q, np.asarray(drafts), replacement)
    out, surv = [], 1.0
    for x, r, qi in steps:
        acc = (1.0 if r[x] >= qi[x] else r[x] / qi[x]) if qi[x] > 0 else 0.0
        out.append(surv * acc)
        surv *= 1.0 - acc
    return np.array(out + [surv])


def joint(pa: np.ndarray, qa: np.ndarray, k: int, replacement: bool = True) -> np.ndarray:
    """Exact law ``[T, V]`` of (draft tuple, output), rows in ``tuple_law`` order."""
    tuples, probs = tuple_law(qa, k, replacement=replacement)
    T, V = tuples.shape[0], pa.size
    J = np.zeros((T, V))
    for t in range(T):
        if probs[t] <= 0:
            continue
        steps, r_last = _chain(pa, qa, tuples[t], replacement)
        surv = probs[t]
        for x, r, qi in steps:
            # min(1, r / q) without forming r / q where it could overflow (a subnormal q)
            acc = (1.0 if r[x] >= qi[x] else r[x] / qi[x]) if qi[x] > 0 else 0.0
            J[t, x] += surv * acc
            surv *= 1.0 - acc
        J[t] += surv * r_last
    return J


def verify(
    p: np.ndarray,
    q: np.ndarray,
    drafts: np.ndarray,
    u_accept: np.ndarray,
    u_resid: float,
    *,
    replacement: bool = True,
) -> int:
    """Deterministic core (inputs assumed validated)."""
    r = p
    qi = q
    for i in range(drafts.size):
        x = int(drafts[i])
        if u_accept[i] * qi[x] < r[x]:
            return x
        r = _next_residual(r, qi)
        if not replacement and i + 1 < drafts.size:
            qn = qi.copy()
            qn[x] = 0.0
            qi = qn / qn.sum()
    return categorical(r, u_resid)


class RecursiveRejection(Rule):
    """Recursive rejection sampling: each draft in turn is a speculative-sampling test against
    the residual the earlier rejections left."""

    name = "rrs"
    twin = "coupling.rules.rrs.torch"
    title = "recursive rejection sampling"
    reference = "SpecInfer (Miao et al. 2024); Yang et al. 2024; Jeon et al. 2024"
    bound_text = ">= 1 - TV (its first step is speculative sampling) and <= OPT"

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k, replacement)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k, replacement)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, drafts, u[:-1], float(u[-1]), replacement=replacement)

    def _bound(self, p, q, k, replacement):

        return float(np.minimum(p, q).sum()), optimal_acceptance(p, q, k, replacement=replacement)

    def try_law(self, p: np.ndarray, q: np.ndarray, drafts: np.ndarray,
                replacement: bool = True) -> np.ndarray:
        """:func:`try_law`: which try accepts given the drafts (float64 laws)."""
        return try_law(p, q, drafts, replacement)


RULE = RecursiveRejection()
