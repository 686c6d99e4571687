"""Shared by the draft-tree proofs: the small instances they enumerate exhaustively."""

from __future__ import annotations

from collections.abc import Iterator

from _block_common import rational_lm


def tree_cases(ks: tuple[int, ...], seed: int, *, max_trees: int = 729,
               denom: int = 6) -> Iterator[tuple[int, int, int, object, object, bool]]:
    """``(V, gamma, k, target, draft, zeros)`` for V = 2, 3, gamma = 1..3 and ``k`` in ``ks``
    with at most ``max_trees`` ordered draft trees, each with a pair of random rational models
    of context order 0, 1 (with exact zeros) and 2, weights below ``denom``."""
    n = 0
    for V in (2, 3):
        for gamma in (1, 2, 3):
            for k in ks:
                if V ** (gamma * k) > max_trees:
                    continue
                for order in (0, 1, 2):
                    n += 1
                    zeros = order == 1
                    yield (V, gamma, k,
                           rational_lm(V, order, seed=seed + n, denom=denom, zeros=zeros),
                           rational_lm(V, order, seed=seed + 500 + n, denom=denom, zeros=zeros),
                           zeros)
