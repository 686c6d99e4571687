"""Test helpers for verifier authors: hypothesis strategies and a pytest-friendly assertion.

Strategies (``hypothesis`` is needed; it ships with the ``dev`` extra)
----------------------------------------------------------------------
* :func:`distributions` -- probability vectors that include the cases verifiers get wrong:
  exact zeros, point masses, near-ties (entries equal up to ~1e-12), tiny entries;
* :func:`pairs` -- ``(p, q)`` over one vocabulary, including ``q = 0 < p``, ``p = 0 < q``
  and ``p == q``;
* :func:`model_pairs` -- ``(target, draft)`` :class:`coupling.TabularLM` pairs whose rows
  come from :func:`distributions` (context-dependent: order 0 to 2);
* :func:`draft_tuples` -- ``k`` drafts of positive probability under ``q`` (distinct
  without replacement).

Assertions
----------
:func:`assert_lossless` runs :func:`coupling.conformance.check_verifier` and raises
``AssertionError`` with the report's table and the smallest failing case when it finds a
loss; :func:`assert_generation_lossless` does the same for a whole generation loop that
drafts by itself (:func:`coupling.conformance.check_generation`);
:func:`assert_sampler_matches_law` checks that a verifier's sampler draws from the law its
``law`` method states (the exact mode trusts ``law``)::

    from coupling.testing import assert_lossless

    def test_my_verifier_is_lossless():
        assert_lossless(my_verify, gamma=3)
"""

from __future__ import annotations

import numpy as np

try:
    from hypothesis import strategies as st
except ImportError as exc:  # pragma: no cover - exercised only without hypothesis
    raise ImportError(
        "coupling.testing needs hypothesis: pip install hypothesis (or the 'dev' extra)"
    ) from exc

from . import TabularLM
from .conformance import ConformanceReport, check_verifier
from .conformance.stats import likelihood_ratio

__all__ = [
    "assert_generation_lossless",
    "distributions",
    "pairs",
    "model_pairs",
    "draft_tuples",
    "assert_lossless",
    "assert_sampler_matches_law",
]

_KINDS = ("weights", "zeros", "point", "ties", "tiny")


@st.composite
def distributions(draw, size: int, *, kinds: tuple[str, ...] = _KINDS) -> np.ndarray:
    """A float64 probability vector of length ``size`` of one of ``kinds``:

    ``weights`` (random positive weights), ``zeros`` (some entries exactly 0), ``point``
    (a point mass), ``ties`` (two or more entries equal up to a relative 1e-12), ``tiny``
    (entries down to 1e-12 next to large ones).
    """
    kind = draw(st.sampled_from(kinds))
    unit = st.floats(0.01, 1.0, allow_nan=False)
    w = np.array(draw(st.lists(unit, min_size=size, max_size=size)))
    if kind == "point" or size == 1:
        w = np.zeros(size)
        w[draw(st.integers(0, size - 1))] = 1.0
    elif kind == "zeros":
        keep = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        keep[draw(st.integers(0, size - 1))] = True
        w = np.where(keep, w, 0.0)
    elif kind == "ties":
        i, j = draw(st.lists(st.integers(0, size - 1), min_size=2, max_size=2, unique=True))
        w[j] = w[i] * (1.0 + draw(st.sampled_from([0.0, 1e-12, -1e-12])))
    elif kind == "tiny":
        i = draw(st.integers(0, size - 1))
        w[i] = draw(st.sampled_from([1e-12, 1e-9, 1e-6]))
    return w / w.sum()


@st.composite
def pairs(draw, *, min_size: int = 2, max_size: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """A target ``p`` and a draft ``q`` over one vocabulary (sometimes ``q = p``)."""
    V = draw(st.integers(min_size, max_size))
    p = draw(distributions(V))
    q = p.copy() if draw(st.integers(0, 9)) == 0 else draw(distributions(V))
    return p, q


@st.composite
def model_pairs(draw, *, min_size: int = 2, max_size: int = 4,
                max_order: int = 2) -> tuple[TabularLM, TabularLM]:
    """A context-dependent ``(target, draft)`` pair of :class:`coupling.TabularLM` models."""
    V = draw(st.integers(min_size, max_size))

    def table(order: int) -> TabularLM:
        rows = [draw(distributions(V)) for _ in range((V + 1) ** order)]
        return TabularLM.from_table(np.array(rows).reshape((V + 1,) * order + (V,)))

    return table(draw(st.integers(0, max_order))), table(draw(st.integers(0, max_order)))


@st.composite
def draft_tuples(draw, q: np.ndarray, k: int, *, replacement: bool = True) -> np.ndarray:
    """``k`` drafted tokens of positive probability under ``q`` (distinct without
    replacement; ``q`` needs ``k`` positive entries then)."""
    support = np.flatnonzero(np.asarray(q) > 0).tolist()
    if not replacement and len(support) < k:
        raise ValueError(f"q has {len(support)} tokens of positive mass; k={k} distinct drafts "
                         "need at least k")
    token = st.sampled_from(support)
    drafts = st.lists(token, min_size=k, max_size=k, unique=not replacement)
    return np.array(draw(drafts), dtype=np.int64)


def assert_lossless(verify, **kwargs) -> ConformanceReport:
    """Assert that ``verify`` passes :func:`coupling.conformance.check_verifier`.

    ``kwargs`` go to the check (``gamma``, ``k``, ``replacement``, ``draws``, ``seed``,
    ``alpha``, ``exact``, ...). Returns the report when it passes; raises
    ``AssertionError`` carrying the report's table and the smallest failing case
    (:func:`coupling.conformance.minimal_counterexample`, with a script that reproduces it)
    when it does not.
    """
    from .conformance import minimal_counterexample

    report = check_verifier(verify, **kwargs)
    if not report.ok:
        found = None
        if "pairs" not in kwargs:            # the search runs on the checker's own pairs
            keys = ("vocab_size", "gamma", "k", "replacement", "seed", "alpha", "exact",
                    "draws", "id_space")
            found = minimal_counterexample(verify, **{k: kwargs[k] for k in keys
                                                      if k in kwargs})
        raise AssertionError(f"verifier is not lossless:\n{report.table()}"
                             + (f"\n\n{found}" if found is not None else ""))
    return report


def assert_generation_lossless(generate, **kwargs) -> ConformanceReport:
    """Assert that a whole generation loop passes :func:`coupling.conformance.
    check_generation` (loop mode: ``generate(target, draft, context, max_new_tokens, rng)``
    drafts by itself; ``kwargs``: ``processing``, ``length``, ``draws``, ...). Returns the
    report; raises ``AssertionError`` with its table when it finds a loss."""
    from .conformance import check_generation

    report = check_generation(generate, **kwargs)
    if not report.ok:
        raise AssertionError(f"generation loop is not lossless:\n{report.table()}")
    return report


def assert_sampler_matches_law(verify, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *,
                               n: int = 20_000, seed: int = 0, alpha: float = 1e-6) -> None:
    """Assert that ``verify(drafts, p, q, rng)`` samples ``verify.law(drafts, p, q)``.

    ``n`` emissions are compared with the stated law by the check's likelihood-ratio test
    at level ``alpha``; an emission the law gives probability 0 fails at once.
    """
    law = dict(verify.law(drafts, p, q))
    keys = list(law)
    index = {e: i for i, e in enumerate(keys)}
    counts = np.zeros(len(keys) + 1, dtype=np.int64)  # last cell: emissions outside the law
    rng = np.random.default_rng(seed)
    for _ in range(n):
        e = tuple(int(t) for t in np.asarray(verify(drafts, p, q, rng)).tolist())
        counts[index.get(e, len(keys))] += 1
    probs = np.append([float(law[e]) for e in keys], 0.0)
    result = likelihood_ratio(counts, probs)
    if result.p_value < alpha:
        worst = np.argsort(-np.abs(counts[:-1] / n - probs[:-1]))[:3]
        detail = ", ".join(f"{keys[i]}: sampled {counts[i] / n:.4f}, law {probs[i]:.4f}"
                           for i in worst)
        raise AssertionError(
            f"sampler and law disagree (p = {result.p_value:.3g}; {counts[-1]} emissions "
            f"outside the law; {detail})"
        )
