r"""Validation harness for verification rules.

:func:`check_rule` checks a rule *exactly* on one ``(p, q, k, replacement)``:

1. the output law (column sums of ``rule.joint``) equals the law the rule reports,
   ``rule.output_law`` (entrywise within ``tol``); for a lossless rule that is ``p`` and the
   report is ``lossless`` (TV < ``tol``). A lossy rule (``rule.lossless`` False) is never
   called lossless: its report gives its exact ``distortion`` TV(output law, p) instead;
2. the draft marginal (row sums) equals the rule's draft law (``rule.draft_law``:
   :func:`coupling.dist.tuple_law` unless the rule drafts otherwise);
3. the closed-form ``rule.acceptance`` equals the joint's trace mass
   :math:`\sum_t \sum_{y \in t} \pi(t, y)`;
4. acceptance :math:`\le` the LP optimum of its information model + ``opt_tol``: the
   lossless optimum over its draft law (:func:`coupling.lp.solve.solve_draft_law`), or for a
   lossy rule the best acceptance at its own distortion
   (:func:`coupling.lp.solve.optimal_lossy_acceptance`);
5. acceptance lies inside the rule's own ``bound`` (± ``opt_tol``).

:func:`check_sampler` checks ``rule.sample`` *statistically* against ``rule.joint``:
draft tuples are drawn from the rule's draft law (``rule.draw_drafts``: i.i.d. from ``q``, or
Gumbel-top-k for successive sampling, unless the rule drafts otherwise), the sampler is
run, and the (tuple, output) counts are compared with the joint by Pearson's chi-square;
cells with expected count below ``min_expected`` are pooled into one cell. The test rejects
at level ``alpha`` (its false-positive rate when the sampler is exact); use fixed seeds so a
test outcome is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from .dist import (
    as_distribution,
    check_pair,
    sample_tuple,
    validate_count,
    validate_k,
    validate_replacement,
    validate_seed,
)
from .lp.solve import optimal_lossy_acceptance
from .rules.base import Rule
from .rules.common import require_generator

__all__ = [
    "RuleReport",
    "SamplerReport",
    "check_rule",
    "check_sampler",
    "draw_drafts",
    "trace_mass",
]


@dataclass(frozen=True)
class RuleReport:
    """Exact checks of one rule on one input (see :func:`check_rule`)."""

    rule: str
    k: int
    replacement: bool
    V: int
    output_tv: float  # TV(column sums of joint, p)
    draft_err: float  # max |row sums - tuple law|
    acceptance: float  # closed form
    trace_acceptance: float  # from the joint
    optimum: float  # lossless LP optimum
    bound: tuple[float, float]
    tol: float
    opt_tol: float
    declared_lossless: bool  # the rule's own label (rule.lossless)
    distortion: float  # TV(rule.output_law, p): the exact distortion the rule reports
    law_err: float  # max |column sums of joint - rule.output_law|
    optimum_at_distortion: float  # LP optimum at the rule's distortion (= optimum if lossless)

    @property
    def acceptance_err(self) -> float:
        return abs(self.acceptance - self.trace_acceptance)

    @property
    def lossless(self) -> bool:
        """The rule claims the target law and its joint delivers it (TV < ``tol``); never
        True for a rule labelled lossy."""
        return self.declared_lossless and self.output_tv < self.tol

    @property
    def within_optimum(self) -> bool:
        return self.acceptance <= self.optimum_at_distortion + self.opt_tol

    @property
    def within_bound(self) -> bool:
        lo, hi = self.bound
        return lo - self.opt_tol <= self.acceptance <= hi + self.opt_tol

    @property
    def ok(self) -> bool:
        return (
            (self.lossless or not self.declared_lossless)
            and self.law_err < self.tol
            and self.draft_err < self.tol
            and self.acceptance_err < self.tol
            and self.within_optimum
            and self.within_bound
        )


def trace_mass(J: np.ndarray, tuples: np.ndarray) -> float:
    """:math:`\\sum_t \\sum_{y \\in \\mathrm{set}(t)} J(t, y)` (each token counted once)."""
    T, V = J.shape
    member = np.zeros((T, V), dtype=bool)
    member[np.arange(T)[:, None], tuples] = True
    return float(J[member].sum())


def check_rule(
    rule: Rule,
    p: ArrayLike,
    q: ArrayLike,
    k: int = 1,
    *,
    replacement: bool = True,
    tol: float = 1e-12,
    opt_tol: float = 1e-9,
) -> RuleReport:
    """Exact validation of ``rule`` on ``(p, q, k, replacement)``; see module doc."""

    pa, qa = check_pair(p, q)
    tuples, probs = rule.draft_law(qa, k, replacement=replacement)
    J = np.asarray(rule.joint(pa, qa, k, replacement=replacement), dtype=np.float64)
    if J.shape != (tuples.shape[0], pa.size):
        raise ValueError(
            f"rule {rule.name!r} returned a joint of shape {J.shape}, "
            f"expected {(tuples.shape[0], pa.size)}"
        )
    out = J.sum(axis=0)
    law = np.asarray(rule.output_law(pa, qa, k, replacement=replacement), dtype=np.float64)
    distortion = 0.5 * float(np.abs(law - pa).sum())
    optimum = rule.optimum(pa, qa, k, replacement=replacement, solver="pot")
    at_distortion = optimum if rule.lossless else optimal_lossy_acceptance(
        pa, qa, k, distortion=distortion, replacement=replacement)
    return RuleReport(
        rule=rule.name,
        k=int(k),
        replacement=bool(replacement),
        V=int(pa.size),
        output_tv=0.5 * float(np.abs(out - pa).sum()),
        draft_err=float(np.abs(J.sum(axis=1) - probs).max()),
        acceptance=float(rule.acceptance(pa, qa, k, replacement=replacement)),
        trace_acceptance=trace_mass(J, tuples),
        optimum=optimum,
        bound=tuple(float(b) for b in rule.bound(pa, qa, k, replacement=replacement)),
        tol=tol,
        opt_tol=opt_tol,
        declared_lossless=bool(rule.lossless),
        distortion=distortion,
        law_err=float(np.abs(out - law).max()),
        optimum_at_distortion=at_distortion,
    )


@dataclass(frozen=True)
class SamplerReport:
    """Chi-square comparison of a sampler with its exact joint (see :func:`check_sampler`)."""

    rule: str
    n: int
    statistic: float
    dof: int
    pvalue: float
    alpha: float

    @property
    def ok(self) -> bool:
        return self.pvalue >= self.alpha


def draw_drafts(q: ArrayLike, k: int, replacement: bool, rng: np.random.Generator) -> np.ndarray:
    """``k`` drafts from ``q``: i.i.d., or distinct by Gumbel-top-k (= successive sampling).

    ``q`` is validated (a distribution), and without replacement it must hold at least ``k``
    tokens of positive probability: a token of probability 0 is never drafted.
    """
    q = as_distribution(q, name="q")
    k, replacement = validate_k(k), validate_replacement(replacement)
    require_generator(rng)
    if not replacement and np.count_nonzero(q) < k:
        raise ValueError(f"cannot draw k={k} distinct tokens without replacement: q has only "
                         f"{np.count_nonzero(q)} token(s) of positive probability")
    return sample_tuple(q, k, replacement, rng)


def check_sampler(
    rule: Rule,
    p: ArrayLike,
    q: ArrayLike,
    k: int = 1,
    *,
    replacement: bool = True,
    n: int = 20_000,
    seed: int = 0,
    alpha: float = 1e-3,
    min_expected: float = 5.0,
    reference: Rule | None = None,
) -> SamplerReport:
    """Pearson chi-square of ``n`` sampled (tuple, output) pairs against the exact joint of
    ``reference`` (default: ``rule`` itself). A negative control passes a broken ``rule``
    with the correct ``reference``: its own joint would agree with its own sampler."""
    pa, qa = check_pair(p, q)
    # n = 0 tests nothing and alpha <= 0 rejects nothing: either would pass a broken rule
    validate_count(n, "n", "number of samples")
    validate_seed(seed)
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must lie in (0, 1) (the test's false-positive rate), got "
                         f"{alpha!r}")
    # NaN or a huge min_expected pools every cell into one (a test of nothing: a broken rule
    # passes); 0 keeps empty cells (0/0: NaN). Pooled cells must leave at least two.
    if not (isinstance(min_expected, (int, float)) and not isinstance(min_expected, bool)
            and 0.0 < min_expected < n):
        raise ValueError(f"min_expected must be a positive number below n={n} (cells expected "
                         f"below it are pooled), got {min_expected!r}")
    rng = np.random.default_rng(seed)
    ref = rule if reference is None else reference
    tuples, _ = ref.draft_law(qa, k, replacement=replacement)
    J = np.asarray(ref.joint(pa, qa, k, replacement=replacement), dtype=np.float64)
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    counts = np.zeros_like(J)
    for _ in range(n):
        d = ref.draw_drafts(qa, k, replacement, rng)
        y = rule.sample(pa, qa, d, rng, replacement=replacement)
        counts[index[tuple(int(x) for x in d)], y] += 1
    expected = (J / J.sum() * n).ravel()
    observed = counts.ravel()
    big = expected >= min_expected
    obs = list(observed[big])
    exp = list(expected[big])
    small_e, small_o = expected[~big].sum(), observed[~big].sum()
    if small_e > 0 or small_o > 0:
        obs.append(small_o)
        exp.append(max(small_e, 1e-300))
    obs_a, exp_a = np.array(obs), np.array(exp)
    if obs_a.size < 2:
        raise ValueError(f"min_expected={min_expected!r} pools every cell into one, which tests "
                         "nothing: lower it, or raise n")
    stat = float(((obs_a - exp_a) ** 2 / exp_a).sum())
    dof = max(1, obs_a.size - 1)
    return SamplerReport(
        rule=rule.name,
        n=n,
        statistic=stat,
        dof=dof,
        pvalue=float(stats.chi2.sf(stat, dof)),
        alpha=alpha,
    )
