r"""The statistical test of the conformance check, its power and its TV interval.

Test (one model pair)
---------------------
``n`` generation loops give counts :math:`O_s` of the first ``L`` emitted strings
:math:`s \in V^L`; the target's exact law gives :math:`P(s)` and expected counts
:math:`E_s = n P(s)`. Cells ``c`` are the strings with :math:`E_s \ge` :data:`MIN_EXPECTED`
plus one cell pooling the rarer strings (merged into the smallest cell if its own expected
count is below :data:`MIN_EXPECTED`). The statistic is the multinomial likelihood ratio
with Williams' correction,

.. math:: G = \frac{2 \sum_c O_c \ln(O_c / E_c)}{w}, \qquad
          w = 1 + \frac{\sum_c 1/P_c - 1}{6 n (c - 1)},

referred to :math:`\chi^2_{c-1}`; the p-value is its upper tail. A string of target
probability 0 that occurs is a certain failure (p-value 0).

Why the likelihood ratio and not Pearson's :math:`X^2`: the check works at tiny levels
(``alpha = 1e-6`` over six pairs). There the tail of :math:`G/2 = n\,\mathrm{KL}(\hat P \| P)`
decays at exactly the :math:`\chi^2` rate :math:`e^{-x/2}` (Sanov), whereas Pearson's
statistic has a heavier tail along skewed directions (:math:`\mathrm{KL} < \chi^2/2` there).
Measured on null multinomials of the check's own laws (``n = 20000``, ``V = 3``, ``L = 4``):
Pearson's statistic with the same cells rejects 2.0x and 3.9x too often at 1e-4 and 1e-5 on
the near-deterministic pair (10^6 draws); :math:`G` with Williams' correction
(:func:`null_rejections`) stays within noise on every pair at 10^6, and at 10^7 on the
near-deterministic and ``q-zeros`` pairs down to 1e-6 (12 and 7 events against 10);
``docs/conformance.md`` has the table and the command.

Power
-----
Under a verifier with output law :math:`P'`, :math:`G` is approximately noncentral
:math:`\chi^2_{c-1}(\lambda)` with :math:`\lambda = n\,\chi^2(P' \| P) \ge 4 n\,
\mathrm{TV}(P', P)^2` (Cauchy-Schwarz, on the pooled cells). :func:`detectable_tv` returns
the smallest TV whose worst case still rejects with probability :data:`POWER`: the check
catches every verifier at least that far from the target on that pair, and most much closer.

TV interval
-----------
The estimate is :math:`\widehat{T} = \mathrm{TV}(\hat P, P)` with :math:`\hat P` the empirical
law of the ``n`` loops (biased up: a lossless verifier scores about
:math:`\tfrac12 \sum_s \sqrt{2 P(s) / (\pi n)}`). The interval holds for every verifier
law :math:`P'` with probability at least ``confidence``, half the risk on each side:

* upper: :math:`D = \mathrm{TV}(P', P) \le \widehat T + \mathrm{TV}(\hat P, P')`; one loop
  moves :math:`\mathrm{TV}(\hat P, P')` by at most :math:`1/n` (McDiarmid) and its mean is
  at most :math:`\sum_s \sqrt{P'(s)} / (2\sqrt n)`, which is at most both
  :math:`\sqrt{K - 1} / (2 \sqrt n)` over :math:`K = V^L` strings and
  :math:`(\sum_s \sqrt{P(s)} + \sqrt{2 K D}) / (2 \sqrt n)` (then solved for :math:`D`);
* lower: the loops are split in two independent halves; the strings one half sees more
  often than :math:`P` says form an event :math:`A`, and :math:`D \ge P'(A) - P(A)` where the
  other half bounds :math:`P'(A)` from below (Hoeffding), both ways round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

__all__ = [
    "noise_tv",
    "MIN_EXPECTED",
    "POWER",
    "Result",
    "cells",
    "likelihood_ratio",
    "null_rejections",
    "detectable_tv",
    "tv_interval",
]

#: Strings expected fewer times than this are pooled into one cell.
MIN_EXPECTED = 10.0
#: The power at which :func:`detectable_tv` is quoted.
POWER = 0.9


@dataclass(frozen=True)
class Result:
    """The likelihood-ratio test of counts against an exact law (see the module doc)."""

    statistic: float
    dof: int
    p_value: float
    impossible: int  # observations of strings the target never emits


def cells(expected: np.ndarray, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """The test's cell of each string of positive expected count (pooling rule above)."""
    big = expected >= min_expected
    cell = np.where(big, np.cumsum(big) - 1, -1)
    n_big, pooled = int(big.sum()), float(expected[~big].sum())
    if pooled > 0:
        if pooled >= min_expected or n_big == 0:
            cell[~big] = n_big
        else:  # a pooled cell still too rare: merge it into the smallest cell
            cell[~big] = cell[int(np.argmin(np.where(big, expected, np.inf)))]
    return cell


def _g(obs: np.ndarray, exp: np.ndarray, n: int) -> np.ndarray:
    """Williams-corrected G of observed cell counts ``obs [..., c]`` (expected ``exp [c]``)."""
    dof = exp.size - 1
    williams = 1.0 + (float((n / exp).sum()) - 1.0) / (6.0 * n * dof)
    return 2.0 * special.xlogy(obs, obs / exp).sum(axis=-1) / williams


def likelihood_ratio(counts: np.ndarray, probs: np.ndarray, *,
                     min_expected: float = MIN_EXPECTED) -> Result:
    """Williams-corrected :math:`G` of ``counts`` against ``probs``, rare strings pooled."""
    counts = np.asarray(counts, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    n = int(counts.sum())
    impossible = int(counts[probs <= 0].sum())
    support = probs > 0
    cell = cells(n * probs[support], min_expected)
    exp = np.bincount(cell, weights=n * probs[support])
    dof = exp.size - 1
    if impossible:
        return Result(math.inf, dof, 0.0, impossible)
    if dof < 1:
        return Result(0.0, 0, 1.0, 0)
    g = float(_g(np.bincount(cell, weights=counts[support], minlength=exp.size), exp, n))
    return Result(g, dof, float(stats.chi2.sf(g, dof)), 0)


def null_rejections(probs: np.ndarray, n: int, reps: int, alphas, *,
                    seed: int = 0, chunk: int = 100_000) -> np.ndarray:
    """How often the test rejects at each level in ``alphas`` over ``reps`` null count
    vectors ``Multinomial(n, probs)``: the check's false-positive rate on that law."""
    probs = np.asarray(probs, dtype=np.float64)
    support = probs > 0
    cell = cells(n * probs[support])
    exp = np.bincount(cell, weights=n * probs[support])
    onehot = np.zeros((cell.size, exp.size))
    onehot[np.arange(cell.size), cell] = 1.0
    crit = stats.chi2.isf(np.asarray(alphas, dtype=np.float64), exp.size - 1)
    rng = np.random.default_rng(seed)
    out = np.zeros(crit.size, dtype=np.int64)
    for start in range(0, reps, chunk):
        counts = rng.multinomial(n, probs[support], size=min(chunk, reps - start))
        out += (_g(counts @ onehot, exp, n)[:, None] > crit).sum(axis=0)
    return out


def detectable_tv(n: int, dof: int, alpha: float, power: float = POWER) -> float:
    r"""Smallest TV the test detects with probability ``power`` whatever the distortion:
    :math:`\sqrt{\lambda^* / (4n)}` with :math:`\lambda^*` the noncentrality at which
    :math:`\chi^2_{dof}` at level ``alpha`` has that power."""
    if dof < 1 or n < 1:
        return math.inf
    crit = stats.chi2.isf(alpha, dof)

    def gap(lam: float) -> float:
        return float(stats.ncx2.sf(crit, dof, lam)) - power

    hi = 1.0
    while gap(hi) < 0:
        hi *= 2.0
    lam = optimize.brentq(gap, 1e-9, hi, xtol=1e-6)
    return min(1.0, math.sqrt(lam / (4.0 * n)))


def noise_tv(probs: np.ndarray, n: int) -> float:
    r"""The plug-in TV that a lossless sampler shows after ``n`` draws, by sampling noise
    alone: :math:`\tfrac12 \sum_i E|\hat p_i - p_i| \approx \tfrac12 \sum_i
    \sqrt{2 p_i (1 - p_i) / (\pi n)}` (the normal approximation of each cell's mean absolute
    deviation). Why: over many strings this floor exceeds the detectable TV, so a passing
    verifier's plug-in estimate is read against it, not against zero.

    >>> round(noise_tv(np.full(4, 0.25), 10_000), 4)
    0.0069
    """
    p = np.asarray(probs, dtype=np.float64)
    return float(0.5 * np.sqrt(2.0 * p * (1.0 - p) / (math.pi * n)).sum())


def tv_interval(halves: np.ndarray, probs: np.ndarray,
                confidence: float = 0.95) -> tuple[float, float, float]:
    """``(estimate, low, high)`` from the counts of two independent halves ``[2, K]`` of the
    loops: the plug-in TV of their sum and its distribution-free interval (module doc)."""
    halves = np.asarray(halves, dtype=np.float64)
    counts = halves.sum(axis=0)
    n = counts.sum()
    est = 0.5 * float(np.abs(counts / n - probs).sum())
    delta = 1.0 - confidence
    t = math.sqrt(math.log(2.0 / delta) / (2.0 * n))  # McDiarmid, risk delta / 2
    # upper end: D <= est + min(sqrt(K - 1), S + sqrt(2 K D)) / (2 sqrt n) + t
    root_n = 2.0 * math.sqrt(n)
    b = math.sqrt(2.0 * probs.size) / root_n
    c = est + float(np.sqrt(probs).sum()) / root_n + t
    high = min(((b + math.sqrt(b * b + 4.0 * c)) / 2.0) ** 2,
               est + math.sqrt(probs.size - 1) / root_n + t)
    # lower end: the event one half finds in excess, measured on the other half
    low = 0.0
    for pick, measure in (halves, halves[::-1]):
        if pick.sum() == 0 or measure.sum() == 0:
            continue
        event = pick / pick.sum() > probs
        slack = math.sqrt(math.log(4.0 / delta) / (2.0 * measure.sum()))  # risk delta / 4
        low = max(low, float(measure[event].sum() / measure.sum() - probs[event].sum()) - slack)
    return est, low, min(1.0, high)
