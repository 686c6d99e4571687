"""Shared helpers for the block-level proofs: exact rational language models."""

from __future__ import annotations

import itertools
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def exact(values) -> np.ndarray:
    return np.array([Fraction(v) for v in values], dtype=object)


def rational_lm(V: int, order: int, seed: int, denom: int = 6, zeros: bool = False):
    """A random model with exact Fraction laws depending on the last ``order`` tokens.

    Weights are integers in [0 or 1, denom); with ``zeros=True`` some tokens get
    probability exactly 0 (never all of them).
    """
    rng = np.random.default_rng(seed)
    table = {}
    for key in itertools.product(range(V + 1), repeat=order):
        w = rng.integers(0 if zeros else 1, denom, size=V)
        if w.sum() == 0:
            w[rng.integers(V)] = 1
        table[key] = np.array([Fraction(int(v), int(w.sum())) for v in w], dtype=object)

    def lm(ctx=()):
        tail = tuple(ctx[-order:]) if order else ()
        return table[(V,) * (order - len(tail)) + tail]

    lm.describe = f"rational_lm(V={V}, order={order}, seed={seed}, zeros={zeros})"
    return lm


def constant_lm(p):
    law = exact(p)

    def lm(ctx=()):
        return law

    return lm


def simplex_grid(V: int, n: int):
    """All laws over V tokens whose entries are multiples of 1/n."""
    for c in itertools.product(range(n + 1), repeat=V - 1):
        if sum(c) <= n:
            yield exact([Fraction(k, n) for k in c] + [Fraction(n - sum(c), n)])
