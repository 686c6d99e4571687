r"""The target/draft model pairs a conformance check runs on.

Every pair is two context-dependent :class:`coupling.TabularLM` tables (next-token laws
indexed by the last two tokens, beginning-of-sequence padded), drawn from one seed. Each
pair stresses a different part of a verifier:

==========  ================================================================================
name        what it stresses
==========  ================================================================================
dirichlet   generic laws: Dirichlet(1) rows, target of order 2, draft of order 1
peaked      near-deterministic laws: one token holds 97-99.9% of each row, for target and
            draft independently (drafts the target finds unlikely, ratios far from 1)
flat        high-entropy laws: Dirichlet(50) rows, ratios close to 1
q-zeros     the draft gives zero mass to a token the target allows (one zero per row; the
            rows a top-k filter leaves); the target has full support
p-zeros     the target gives zero mass to tokens the draft proposes (zeros at random,
            including point masses); the draft has full support
same        draft = target: every ratio is 1 and every residual is empty
==========  ================================================================================

Without replacement (``replacement=False``) the first ``k`` drafts must be distinct, so the
draft needs ``k`` tokens of positive mass in every row: ``q-zeros`` then puts a zero in a row
only where ``V - 1 >= k``, and says so in its description.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import TabularLM, as_distribution

__all__ = ["Pair", "PAIR_NAMES", "model_pairs", "as_pairs"]

LanguageModel = Callable[[tuple[int, ...]], np.ndarray]

#: The pairs :func:`model_pairs` builds, in order.
PAIR_NAMES = ("dirichlet", "peaked", "flat", "q-zeros", "p-zeros", "same")

#: Context length the tables depend on (order of the target tables).
ORDER = 2


@dataclass(frozen=True)
class Pair:
    """A named target/draft pair: ``target(context)`` and ``draft(context)`` are laws over V."""

    name: str
    description: str
    target: LanguageModel
    draft: LanguageModel


def _rows(n: int, V: int) -> int:
    return (V + 1) ** n


def _table(rows: np.ndarray, V: int, order: int) -> TabularLM:
    return TabularLM.from_table(rows.reshape((V + 1,) * order + (V,)))


def _dirichlet(rng: np.random.Generator, V: int, order: int, concentration: float) -> TabularLM:
    rows = rng.dirichlet(np.full(V, concentration), size=_rows(order, V))
    return _table(rows / rows.sum(axis=1, keepdims=True), V, order)


def _peaked(rng: np.random.Generator, V: int, order: int) -> TabularLM:
    n = _rows(order, V)
    off = 10.0 ** rng.uniform(-3, np.log10(0.03), size=n)  # mass off the peak: 0.1% .. 3%
    rows = rng.dirichlet(np.ones(V), size=n)
    top = rng.integers(V, size=n)
    rows[np.arange(n), top] = 0.0
    rows *= (off / rows.sum(axis=1))[:, None]
    rows[np.arange(n), top] = 1.0 - off
    return _table(rows, V, order)


def _zeros(rng: np.random.Generator, V: int, order: int, how_many: Callable[[], int]):
    """Dirichlet(1) rows, each with ``how_many()`` tokens set to zero at random."""
    rows = rng.dirichlet(np.ones(V), size=_rows(order, V))
    for row in rows:
        row[rng.choice(V, size=how_many(), replace=False)] = 0.0
        row /= row.sum()
    return _table(rows, V, order)


def model_pairs(
    vocab_size: int, *, k: int = 1, replacement: bool = True, seed: int = 0
) -> tuple[Pair, ...]:
    """The six pairs of the module table, drawn from ``seed`` (same arguments, same models).

    ``k`` and ``replacement`` only matter for ``q-zeros``: without replacement every draft
    row keeps at least ``k`` tokens of positive mass.
    """
    V = int(vocab_size)
    if V < 2:
        raise ValueError(f"vocab_size must be at least 2 for a meaningful check, got {V}")
    rng = np.random.default_rng([int(seed), 36])
    min_support = 1 if replacement else int(k)
    if min_support > V:
        raise ValueError(
            f"k={k} distinct drafts need vocab_size >= {k}; got vocab_size={V}"
        )
    zero_q = V - 1 >= min_support
    shared = _dirichlet(rng, V, ORDER, 1.0)
    return (
        Pair("dirichlet", "Dirichlet(1) rows; target order 2, draft order 1",
             _dirichlet(rng, V, ORDER, 1.0), _dirichlet(rng, V, 1, 1.0)),
        Pair("peaked", "near-deterministic rows (97-99.9% on one token), peaks independent",
             _peaked(rng, V, ORDER), _peaked(rng, V, ORDER)),
        Pair("flat", "high-entropy rows, Dirichlet(50)",
             _dirichlet(rng, V, ORDER, 50.0), _dirichlet(rng, V, ORDER, 50.0)),
        Pair("q-zeros",
             "draft rows with one zero where the target is positive" if zero_q
             else f"draft rows without zeros (k={k} distinct drafts need full support)",
             _dirichlet(rng, V, ORDER, 1.0),
             _zeros(rng, V, ORDER, lambda: 1) if zero_q else _dirichlet(rng, V, ORDER, 1.0)),
        Pair("p-zeros", "target rows with zeros (point masses included) where the draft is "
             "positive", _zeros(rng, V, ORDER, lambda: int(rng.integers(V))),
             _dirichlet(rng, V, ORDER, 1.0)),
        Pair("same", "draft = target: ratios 1, empty residuals", shared, shared),
    )


def as_pairs(pairs: Sequence[Pair | tuple]) -> tuple[Pair, ...]:
    """Accept :class:`Pair` objects or ``(target, draft)`` / ``(name, target, draft)`` tuples."""
    out = []
    for i, item in enumerate(pairs):
        if isinstance(item, Pair):
            out.append(item)
            continue
        if not isinstance(item, tuple) or len(item) not in (2, 3):
            raise TypeError(
                f"pairs[{i}] must be a Pair or a (target, draft) / (name, target, draft) tuple "
                f"of language models, got {type(item).__name__}"
            )
        name, target, draft = item if len(item) == 3 else (f"pair{i}", *item)
        for role, lm in (("target", target), ("draft", draft)):
            if not callable(lm):
                raise TypeError(f"pairs[{i}]: the {role} must be callable as lm(context) -> law")
        as_distribution(target(()), name=f"pairs[{i}] target(())")
        out.append(Pair(str(name), "user-supplied pair", target, draft))
    if not out:
        raise ValueError("pairs is empty: pass at least one (target, draft) pair")
    return tuple(out)
