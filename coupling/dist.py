"""Distributions over a finite vocabulary: validation, total variation, draft-tuple laws.

Every public function of the package funnels its probability vectors through
:func:`as_distribution`, so a bad input fails here with a message that names the
argument and the fix, instead of producing a silently wrong number downstream.

Conventions
-----------
A distribution is a 1-D ``float64`` array ``p`` of length ``V`` (the vocabulary size)
with ``p >= 0`` and ``sum(p) == 1``. Token ids are ``0 .. V-1``.

Draft tuples
------------
``k`` drafts ``x = (x_1, ..., x_k)`` are drawn from ``q`` either

* with replacement (i.i.d.): :math:`Q(x) = \\prod_i q(x_i)`, or
* without replacement, by successive sampling (equivalently Gumbel-top-k):
  :math:`Q(x) = \\prod_i q(x_i) / (1 - \\sum_{j<i} q(x_j))` over ordered tuples of
  distinct tokens.

:func:`tuple_law` enumerates them in a fixed, documented order that every exact
analysis in the package (LP plans, rule joints) shares.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "as_distribution",
    "check_pair",
    "total_mass",
    "tv",
    "tuple_law",
    "sample_tuple",
    "validate_k",
    "validate_drafts",
    "validate_seed",
    "num_tuples",
    "MAX_TUPLES",
]

#: Largest number of draft tuples an exact enumeration may build (V**k rows).
MAX_TUPLES = 5_000_000


def as_distribution(x: ArrayLike, *, atol: float = 1e-9, name: str = "p") -> np.ndarray:
    """Validate ``x`` as a probability vector and return it as float64 summing to 1.

    Parameters
    ----------
    x : array_like
        Candidate probabilities, one per vocabulary token.
    atol : float
        Largest accepted deviation of ``sum(x)`` from 1. Within it the vector is
        renormalised (so rounding in the caller never propagates); beyond it a
        ``ValueError`` is raised, because a vector that does not sum to 1 is almost
        always logits, counts or a truncated distribution passed by mistake.
    name : str
        The argument's name, used in error messages.

    Raises
    ------
    ValueError
        If ``x`` is empty, not 1-D, not real, contains NaN/inf or negative entries,
        or sums to something farther than ``atol`` from 1.
    """
    if not (isinstance(atol, (int, float)) and math.isfinite(atol) and atol >= 0):
        raise ValueError(f"atol must be a finite non-negative number, got {atol!r}")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name} must be a 1-D array of probabilities: {exc}") from None
    if arr.dtype == object or np.iscomplexobj(arr):
        raise ValueError(f"{name} must be a real 1-D array of probabilities, got dtype {arr.dtype}")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be real numbers, got dtype {arr.dtype}"
                         + (" (booleans are not probabilities)" if arr.dtype.kind == "b" else ""))
    arr = arr.astype(np.float64, copy=True)
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one probability per token), got shape {arr.shape}; "
            "pass one distribution at a time"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty: a distribution needs at least one token")
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.flatnonzero(bad)[:5].tolist()
        raise ValueError(
            f"{name} contains NaN or inf at indices {idx}; probabilities must be finite"
        )
    if (arr < 0).any():
        idx = np.flatnonzero(arr < 0)[:5].tolist()
        raise ValueError(
            f"{name} has negative entries at indices {idx} (min {arr.min():.3g}); "
            "probabilities must be >= 0 (did you pass logits? apply a softmax first)"
        )
    total = total_mass(arr)
    if abs(total - 1.0) > atol:
        raise ValueError(
            f"{name} sums to {total!r}, not 1 (within {atol:g}); normalise it first "
            f"({name} / {name}.sum())"
        )
    return arr / total


def total_mass(arr: np.ndarray) -> float:
    """The sum of a float64 vector as :func:`as_distribution` divides by it: exact (``fsum``)
    up to 4096 entries, pairwise beyond (error ~ eps log V keeps a 49152-token validation at
    microseconds); ``inf`` where it overflows (an entry that large is no probability)."""
    try:
        if arr.size <= 4096:
            return math.fsum(arr.tolist())
        with np.errstate(over="ignore"):
            return float(arr.sum())
    except OverflowError:
        return math.inf


def check_pair(
    p: ArrayLike,
    q: ArrayLike,
    *,
    names: tuple[str, str] = ("p", "q"),
    atol: float = 1e-9,
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a target ``p`` and a draft ``q`` over the same vocabulary."""
    pa = as_distribution(p, atol=atol, name=names[0])
    qa = as_distribution(q, atol=atol, name=names[1])
    if pa.shape != qa.shape:
        raise ValueError(
            f"vocabulary mismatch: {names[0]} has {pa.size} tokens but {names[1]} has {qa.size}; "
            "both must be distributions over the same vocabulary"
        )
    return pa, qa


def tv(p: ArrayLike, q: ArrayLike) -> float:
    """Total-variation distance.

    :math:`\\tfrac12 \\sum_x |p(x) - q(x)| = 1 - \\sum_x \\min(p(x), q(x))`.
    """
    pa, qa = check_pair(p, q)
    return 0.5 * float(np.abs(pa - qa).sum())


def validate_count(value: int, name: str, what: str = "", *, minimum: int = 1) -> int:
    """Return ``value`` as an int >= ``minimum`` (1 by default), else ``ValueError`` naming
    ``name`` (``what`` says what it counts). Bools are refused: ``True`` would read as 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {kind}{' ' + what if what else ''}, got {value!r}")
    return int(value)


def validate_seed(seed: int, name: str = "seed") -> int:
    """Return ``seed`` as an int >= 0, else ``ValueError`` naming ``name`` (bools refused)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {seed!r}")
    return int(seed)


def validate_k(k: int, *, name: str = "k") -> int:
    """Return ``k`` as an int >= 1 or raise ``ValueError``."""
    return validate_count(k, name, "number of drafts")


def validate_replacement(replacement: bool) -> bool:
    """Return ``replacement`` or raise ``ValueError`` unless it is a bool: a string such as
    ``"no"`` would otherwise be read as True (i.i.d. drafts)."""
    if not isinstance(replacement, (bool, np.bool_)):
        raise ValueError(f"replacement must be True (i.i.d. drafts) or False (distinct drafts), "
                         f"got {replacement!r}")
    return bool(replacement)


def validate_drafts(drafts: ArrayLike, q: np.ndarray, *, name: str = "drafts") -> np.ndarray:
    """Check drafted token ids against ``q``: integer, in range, and ``q[x] > 0``.

    A drafted token of probability zero cannot have been sampled from ``q``; accepting
    it would divide by zero in any ratio ``p(x)/q(x)``, so it is an error.
    """
    arr = np.asarray(drafts)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"{name} must be a non-empty 1-D array of token ids, got shape {arr.shape}"
        )
    V = q.size
    if arr.dtype.kind not in "iu" and not (
        arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))
    ):
        raise ValueError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    # in range before the int64 cast, which would wrap a float id of 1e20
    if (arr < 0).any() or (arr >= V).any():
        raise ValueError(f"{name} has token ids outside [0, {V}): {arr.tolist()}")
    arr = arr.astype(np.int64)
    zero = q[arr] == 0
    if zero.any():
        raise ValueError(
            f"{name} contains token(s) {arr[zero].tolist()} with draft probability q = 0: "
            "they cannot have been drafted from q; pass the law the drafts were sampled from"
        )
    return arr


def num_tuples(V: int, k: int, replacement: bool = True) -> float:
    """How many draft tuples an exact enumeration visits (``V**k``, or ``V!/(V-k)!`` without
    replacement), as a float (``inf`` past its range): safe to compare and to format, where the
    exact integer for a large ``k`` has thousands of digits."""
    if not replacement and k > V:
        return 0.0
    if k * math.log2(max(V, 2)) > 1000:
        return math.inf
    return float(V**k if replacement else math.perm(V, k))


def tuple_law(
    q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Enumerate the law of ``k`` drafts from ``q``.

    Returns
    -------
    tuples : int64 array, shape [T, k]
        ``replacement=True``: all ``V**k`` tuples in ``itertools.product`` order.
        ``replacement=False``: all ordered k-permutations of distinct tokens in
        ``itertools.permutations`` order.
    probs : float64 array, shape [T]
        ``prod_i q[x_i]`` (i.i.d.), or the successive-sampling probability
        ``prod_i q[x_i] / (1 - sum_{j<i} q[x_j])`` (without replacement).
    """
    qa = as_distribution(q, name="q")
    k = validate_k(k)
    replacement = validate_replacement(replacement)
    V = qa.size
    if not replacement and np.count_nonzero(qa) < k:
        raise ValueError(
            f"cannot draw k={k} distinct tokens without replacement: q has only "
            f"{np.count_nonzero(qa)} token(s) of positive probability; "
            "lower k or use replacement=True"
        )
    T = num_tuples(V, k, replacement)
    if T > MAX_TUPLES:
        count = f"{T:.3g}" if math.isfinite(T) else f"{V}**{k}"
        raise ValueError(
            f"exact enumeration needs {count} draft tuples (V={V}, k={k}), above the limit "
            f"{MAX_TUPLES}; use coupling.optimal_acceptance for large vocabularies"
        )
    T = int(T)
    it: Sequence = (
        itertools.product(range(V), repeat=k)
        if replacement
        else itertools.permutations(range(V), k)
    )
    tuples = np.fromiter(itertools.chain.from_iterable(it), dtype=np.int64, count=T * k)
    tuples = tuples.reshape(T, k)
    qt = qa[tuples]  # [T, k]
    if replacement:
        probs = qt.prod(axis=1)
    else:
        # successive sampling: each draw renormalises over the tokens not yet drawn
        used = np.concatenate([np.zeros((T, 1)), np.cumsum(qt, axis=1)[:, :-1]], axis=1)
        remaining = np.clip(1.0 - used, 0.0, None)
        # 1 - used cancels catastrophically when the drawn tokens hold almost all the mass
        # (q = (1 - 1e-38, 1e-38)): sum the tokens still available instead, where it matters
        risky = np.nonzero(remaining < 1e-3)
        if risky[0].size:
            for t, i in zip(*risky, strict=True):
                avail = np.ones(V, dtype=bool)
                avail[tuples[t, :i]] = False
                remaining[t, i] = math.fsum(qa[avail].tolist())
        ratio = np.divide(qt, remaining, out=np.zeros_like(qt), where=(qt > 0) & (remaining > 0))
        probs = ratio.prod(axis=1)
    return tuples, probs


def sample_tuple(q: np.ndarray, k: int, replacement: bool,
                 rng: np.random.Generator) -> np.ndarray:
    """One draw from :func:`tuple_law` on a validated ``q``: ``k`` i.i.d. tokens, or ``k``
    distinct ones by Gumbel-top-k (the same law as successive sampling), ``[k]`` int64."""
    if replacement:
        return rng.choice(q.size, size=k, p=q)
    with np.errstate(divide="ignore"):
        keys = np.log(q) + rng.gumbel(size=q.size)
    return np.argsort(-keys, kind="stable")[:k]
