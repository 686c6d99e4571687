"""Shared test inputs: hypothesis strategies for probability vectors, seeded sequence models
and drafted paths."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from coupling import TabularLM


@st.composite
def distributions(draw, size, min_zero_frac=0.0, allow_zeros=True):
    """A probability vector of length ``size``: random weights, some zeros, normalised."""
    w = draw(arrays(np.float64, size, elements=st.floats(0.0, 1.0, allow_nan=False)))
    if allow_zeros:
        mask = draw(arrays(np.bool_, size))
        w = np.where(mask & (np.arange(size) > 0), 0.0, w)
    if w.sum() <= 1e-12:
        w = np.zeros(size)
        w[draw(st.integers(0, size - 1))] = 1.0
    return w / w.sum()


@st.composite
def pairs(draw, min_size=1, max_size=6, allow_zeros=True):
    V = draw(st.integers(min_size, max_size))
    return draw(distributions(V, allow_zeros=allow_zeros)), draw(
        distributions(V, allow_zeros=allow_zeros)
    )


@st.composite
def rule_pairs(draw, max_v: int = 6):
    """(p, q) over 2 <= V <= max_v tokens, with zeros, ties, one-hots and p == q mixed in."""
    V = draw(st.integers(2, max_v))
    w = st.lists(st.integers(0, 12), min_size=V, max_size=V).filter(lambda a: sum(a) > 0)
    a = np.array(draw(w), dtype=float)
    kind = draw(st.sampled_from(["free", "free", "free", "equal", "onehot_p", "onehot_q"]))
    if kind == "equal":
        b = a.copy()
    else:
        b = np.array(draw(w), dtype=float)
    p, q = a / a.sum(), b / b.sum()
    if kind == "onehot_p":
        p = np.eye(V)[draw(st.integers(0, V - 1))]
    if kind == "onehot_q":
        q = np.eye(V)[draw(st.integers(0, V - 1))]
    return p, q


def model_pair(V: int, order: int, seed: int, conc: float = 1.0) -> tuple[TabularLM, TabularLM]:
    """A seeded (target, draft) pair of random context-dependent models."""
    return (
        TabularLM(V, order, seed=seed, concentration=conc),
        TabularLM(V, order, seed=seed + 1000, concentration=conc),
    )


def rational_lm(V: int, order: int, seed: int, denom: int = 7, zeros: bool = False):
    """A random context-dependent model with exact Fraction laws (integer weights below
    ``denom``, so ties between ratios are frequent; zero entries with ``zeros``)."""
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

    return lm


def drafted_path(V: int = 4, gamma: int = 3, seed: int = 0, conc: float = 0.7):
    """One block drafted from a seeded model pair after context ``(1,)``:
    ``(drafts [gamma], p_path [gamma + 1, V], q_path [gamma, V])``."""
    t, d = model_pair(V, 2, seed, conc)
    rng = np.random.default_rng(seed)
    ctx = (1,)
    xs: list[int] = []
    for _ in range(gamma):
        xs.append(int(rng.choice(V, p=d(ctx + tuple(xs)))))
    P = np.stack([t(ctx + tuple(xs[:i])) for i in range(gamma + 1)])
    Q = np.stack([d(ctx + tuple(xs[:i])) for i in range(gamma)])
    return np.array(xs), P, Q


def as_tree(x: np.ndarray, P: np.ndarray, Q: np.ndarray):
    """One drafted path as a one-branch tree: ``(drafts [1, g], p [1, g + 1, V], q [1, g, V])``."""
    return x[None], P[None], Q[None]


def drafted_trees(V: int, gamma: int, k: int, n: int, *, replacement: bool = True,
                  seed: int = 0, conc: float = 0.5, order: int = 1):
    """``n`` draft trees drafted from one seeded model pair after context ``(0,)``, stacked:
    ``(drafts [n, k, gamma], p [n, k, gamma + 1, V], q [n, k, gamma, V])``."""
    from coupling.lm import check_models, draft_tree

    T, D, ctx = check_models(*model_pair(V, order, seed, conc), (0,))
    rng = np.random.default_rng(seed)
    trees = [draft_tree(T, D, gamma, rng, ctx, k=k, replacement=replacement) for _ in range(n)]
    return tuple(np.stack(a) for a in zip(*trees, strict=True))
