import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coupling import as_distribution, check_pair, tuple_law, tv
from coupling.dist import validate_drafts
from tests.strategies import distributions, pairs


@pytest.mark.parametrize(
    "bad, match",
    [
        ([0.5, np.nan, 0.5], "NaN or inf"),
        ([0.5, np.inf], "NaN or inf"),
        ([1.2, -0.2], "negative"),
        ([0.5, 0.4], "sums to"),
        ([[0.5, 0.5]], "1-D"),
        ([], "empty"),
        (0.5, "1-D"),
        (["a", "b"], "must be real numbers, got dtype <U1"),
        ([1 + 0j], "real"),
    ],
)
def test_as_distribution_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        as_distribution(bad)


def test_as_distribution_names_argument():
    with pytest.raises(ValueError, match="^draft"):
        as_distribution([0.3, 0.3], name="draft")


def test_as_distribution_renormalises_within_atol():
    x = np.array([0.5, 0.5 + 1e-12])
    p = as_distribution(x)
    assert math.fsum(p) == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError):
        as_distribution(x, atol=1e-14)


def test_as_distribution_copies():
    x = np.array([0.25, 0.75])
    p = as_distribution(x)
    p[0] = 9
    assert x[0] == 0.25


def test_check_pair_vocabulary_mismatch():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        check_pair([0.5, 0.5], [1 / 3] * 3)


def test_tv_exact_values():
    assert tv([1 / 3, 2 / 3], [2 / 3, 1 / 3]) == pytest.approx(1 / 3, abs=1e-15)
    assert tv([1, 0], [0, 1]) == 1.0
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        tv([1.0], [0.5, 0.5])


@given(pairs())
def test_tv_is_a_metric_in_unit_interval(pq):
    p, q = pq
    d = tv(p, q)
    assert 0.0 <= d <= 1.0
    assert d == pytest.approx(tv(q, p), abs=1e-15)
    assert d == pytest.approx(1.0 - np.minimum(p, q).sum(), abs=1e-12)
    assert tv(p, p) == 0.0


@given(st.integers(1, 5), st.integers(1, 3), st.booleans(), st.data())
def test_tuple_law_is_a_distribution(V, k, replacement, data):
    q = data.draw(distributions(V, allow_zeros=replacement))
    if not replacement and np.count_nonzero(q) < k:
        with pytest.raises(ValueError, match="without replacement"):
            tuple_law(q, k, replacement=False)
        return
    tuples, probs = tuple_law(q, k, replacement=replacement)
    assert tuples.shape == ((V**k if replacement else math.perm(V, k)), k)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert (probs >= 0).all()
    # every draft position's marginal: i.i.d. -> q; without replacement -> first draw ~ q
    first = np.bincount(tuples[:, 0], weights=probs, minlength=V)
    np.testing.assert_allclose(first, q, atol=1e-12)
    if not replacement:
        assert all(len(set(t)) == k for t in tuples.tolist())


def test_tuple_law_without_replacement_exact():
    q = np.array([0.5, 0.3, 0.2])
    tuples, probs = tuple_law(q, 2, replacement=False)
    law = {tuple(t): pr for t, pr in zip(tuples.tolist(), probs, strict=True)}
    assert law[(0, 1)] == pytest.approx(0.5 * 0.3 / 0.5)
    assert law[(2, 1)] == pytest.approx(0.2 * 0.3 / 0.8)


def test_tuple_law_limits():
    with pytest.raises(ValueError, match="positive integer"):
        tuple_law([1.0], 0)
    with pytest.raises(ValueError, match="optimal_acceptance"):
        tuple_law(np.full(1000, 1e-3), 3)


def test_validate_drafts():
    q = np.array([0.5, 0.5, 0.0])
    assert validate_drafts([0, 1], q).tolist() == [0, 1]
    with pytest.raises(ValueError, match="q = 0"):
        validate_drafts([2], q)
    with pytest.raises(ValueError, match="outside"):
        validate_drafts([3], q)
    with pytest.raises(ValueError, match="integer"):
        validate_drafts([0.5], q)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_entries_whose_exact_sum_overflows_are_a_value_error():
    """math.fsum raises OverflowError where the pairwise sum reads inf: the same clear error
    for small and large vocabularies (and no numpy overflow warning on the way)."""
    for p in ([1e308, 1e308], np.full(5000, 1e308)):
        with pytest.raises(ValueError, match="sums to inf"):
            as_distribution(p)
    with pytest.raises(ValueError, match="sums to inf"):
        tv([1e308, 1e308], [0.5, 0.5])


def test_replacement_must_be_a_bool():
    """A string such as "no" is truthy: read as a flag it would run the i.i.d. law without a
    word."""
    from coupling import optimal_acceptance, solve_coupling
    from coupling.rules import RULES

    p, q = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]
    for call in (lambda r: tuple_law(q, 2, replacement=r),
                 lambda r: solve_coupling(p, q, 2, replacement=r),
                 lambda r: optimal_acceptance(p, q, 2, replacement=r),
                 lambda r: RULES["rrs"].acceptance(p, q, 2, replacement=r)):
        with pytest.raises(ValueError, match="replacement must be True"):
            call("no")
        call(np.bool_(False))                        # numpy bools are bools


def test_float_draft_ids_out_of_range_are_named_as_given():
    q = np.array([0.5, 0.5])
    with pytest.raises(ValueError, match=r"outside \[0, 2\): \[1e\+20\]"):
        validate_drafts(np.array([1e20]), q)
    assert validate_drafts(np.array([1.0]), q).tolist() == [1]
