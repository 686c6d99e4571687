r"""Sequence-level models and the validation of what the rules read along a block.

A *language model* here is any callable ``lm(context) -> np.ndarray`` mapping a context (a
tuple of token ids) to the next-token law over ``V`` tokens. :class:`TabularLM` draws such
models at random (a Dirichlet table indexed by the last ``order`` tokens); any other callable
(e.g. a replay of laws recorded from a real LLM, :class:`TraceLM`) plugs in unchanged. A model
returning ``object`` arrays of :class:`fractions.Fraction` runs every *exact* function of
:mod:`coupling.sequence` in exact rational arithmetic; that is what ``proofs/`` uses.

Every function that takes a model pair validates it here once (:class:`ModelCache`,
:func:`check_models`): laws are distributions, and target and draft share one vocabulary.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from .dist import as_distribution, validate_count

__all__ = [
    "LanguageModel",
    "TabularLM",
    "TraceLM",
    "ModelCache",
    "as_model",
    "check_context",
    "common_prefix",
    "check_models",
    "check_length",
    "as_law",
    "is_exact",
    "check_path",
    "check_tree",
    "check_noise",
    "check_num_paths",
    "path_laws",
    "draft_tree",
    "gumbel_block",
    "MAX_PATHS",
]

LanguageModel = Callable[[tuple[int, ...]], np.ndarray]

#: Largest number of draft paths an exact enumeration may visit (``V**gamma``).
MAX_PATHS = 2_000_000


class TabularLM:
    r"""A seeded random language model whose next-token law depends on the last ``order`` tokens.

    The table has one Dirichlet(:math:`\alpha \mathbf 1_V`) row per context key, where the key
    is the last ``order`` tokens of the context left-padded with a beginning-of-sequence
    symbol (index ``V``), so short contexts have their own laws. ``order=0`` gives a
    context-independent model. Small ``concentration`` gives peaked, sparse-ish laws
    (models that disagree a lot); large ``concentration`` gives near-uniform ones.

    Parameters
    ----------
    vocab_size : int
    order : int, default 1
    seed : int, default 0
        Seeds ``np.random.default_rng``: same arguments, same model.
    concentration : float, default 1.0
        Dirichlet parameter :math:`\alpha > 0`.
    """

    def __init__(self, vocab_size: int, order: int = 1, seed: int = 0, concentration: float = 1.0):
        V = validate_count(vocab_size, "vocab_size")
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 0:
            raise ValueError(f"order must be a non-negative integer, got {order!r}")
        if not (
            isinstance(concentration, (int, float))
            and math.isfinite(concentration)
            and concentration > 0
        ):
            raise ValueError(
                f"concentration must be a finite positive number, got {concentration!r}"
            )
        n_rows = (V + 1) ** int(order)
        if n_rows * V > 20_000_000:
            raise ValueError(
                f"a TabularLM with vocab_size={V}, order={order} needs {n_rows * V} table entries; "
                "lower order or vocab_size"
            )
        rng = np.random.default_rng(seed)
        rows = rng.dirichlet(np.full(V, float(concentration)), size=n_rows)
        # Dirichlet rows with tiny alpha can underflow to exact zeros and even sum to
        # 1 - 1e-16; renormalise so every row is an exact-enough distribution.
        rows /= rows.sum(axis=1, keepdims=True)
        self._init_table(rows.reshape((V + 1,) * int(order) + (V,)))
        self.seed = seed
        self.concentration = float(concentration)

    def _init_table(self, table: np.ndarray) -> None:
        table = np.array(table, dtype=np.float64)
        table.setflags(write=False)
        self.table = table
        self.order = table.ndim - 1
        self.vocab_size = table.shape[-1]

    @classmethod
    def from_table(cls, table: ArrayLike) -> TabularLM:
        """Wrap an explicit table of shape ``(V + 1,) * order + (V,)`` (index ``V`` = BOS)."""
        arr = np.asarray(table, dtype=np.float64)
        if arr.ndim < 1:
            raise ValueError("table must have shape (V + 1,) * order + (V,)")
        V = arr.shape[-1]
        if any(s != V + 1 for s in arr.shape[:-1]):
            raise ValueError(
                f"table must have shape (V + 1,) * order + (V,) with V={V}, got {arr.shape}"
            )
        flat = arr.reshape(-1, V)
        for i, row in enumerate(flat):
            as_distribution(row, name=f"table row {i}")
        obj = cls.__new__(cls)
        obj._init_table((flat / flat.sum(axis=1, keepdims=True)).reshape(arr.shape))
        obj.seed = None
        obj.concentration = None
        return obj

    @classmethod
    def constant(cls, p: ArrayLike) -> TabularLM:
        """A context-independent model that always returns ``p``."""
        return cls.from_table(as_distribution(p, name="p"))

    def key(self, context: Sequence[int]) -> tuple[int, ...]:
        ctx = check_context(context, self.vocab_size)
        tail = ctx[-self.order :] if self.order else ()
        return (self.vocab_size,) * (self.order - len(tail)) + tuple(tail)

    def __call__(self, context: Sequence[int] = ()) -> np.ndarray:
        return self.table[self.key(context)]

    def __repr__(self) -> str:
        return (
            f"TabularLM(vocab_size={self.vocab_size}, order={self.order}, seed={self.seed}, "
            f"concentration={self.concentration})"
        )


class TraceLM:
    """Replay next-token laws recorded along one path (e.g. from a real LLM).

    ``TraceLM(prompt, tokens, dists)`` answers ``context = prompt + tokens[:i]`` with
    ``dists[i]`` (``dists`` has ``len(tokens) + 1`` rows or ``len(tokens)`` rows). Any other
    context raises ``KeyError``: a replay knows nothing off its recorded path, so analyses
    that enumerate all drafts cannot run on it, but the rules' ``path_law`` and ``verify_block``
    can.
    """

    def __init__(self, prompt: Sequence[int], tokens: Sequence[int], dists: ArrayLike):
        d = np.asarray(dists, dtype=np.float64)
        if d.ndim != 2 or d.shape[0] not in (len(tokens), len(tokens) + 1):
            raise ValueError(
                f"dists must have shape [len(tokens) or len(tokens)+1, V], got {d.shape} "
                f"for {len(tokens)} tokens"
            )
        self.vocab_size = d.shape[1]
        self.prompt = check_context(prompt, None)
        self.tokens = check_context(tokens, self.vocab_size)
        self.dists = np.stack([as_distribution(r, name=f"dists[{i}]") for i, r in enumerate(d)])

    def __call__(self, context: Sequence[int]) -> np.ndarray:
        ctx = check_context(context)
        n = len(self.prompt)
        i = len(ctx) - n
        if ctx[:n] != self.prompt or i < 0 or i >= len(self.dists) or ctx[n:] != self.tokens[:i]:
            raise KeyError(f"context {ctx} is not on the recorded trace")
        return self.dists[i]


def _token_id(t: object) -> int | None:
    """``t`` as a token id, or None if it is not an integer (integral floats count, bools not).

    ``int(t)`` would silently truncate 0.9 to token 0; bools are rejected as in
    :func:`coupling.dist.validate_drafts`.
    """
    if isinstance(t, (bool, np.bool_)):
        return None
    if isinstance(t, (float, np.floating)):
        return int(t) if math.isfinite(t) and float(t).is_integer() else None
    try:
        return operator.index(t)
    except TypeError:
        return None


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists.

    Bisects on slice equality (compared in C) rather than walking the lists in Python: a
    step's caches agree with the committed text on all but the last few of some hundreds of
    tokens, and the walk cost 0.1-0.2 ms per call.

    >>> common_prefix([5, 1, 2], [5, 1, 3, 4])
    2
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n                 # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def check_context(context: Sequence[int], V: int | None = None) -> tuple[int, ...]:
    try:
        ids = [_token_id(t) for t in context]
    except TypeError:  # not iterable
        ids = [None]
    if any(t is None for t in ids):
        raise ValueError(
            f"context must be a sequence of integer token ids, got {context!r}; "
            "pass ints (bools and non-integral numbers are not token ids)"
        )
    ctx = tuple(ids)
    if V is not None and any(t < 0 or t >= V for t in ctx):
        raise ValueError(f"context {ctx} has token ids outside [0, {V})")
    return ctx


# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Laws: float64, or exact Fractions
# --------------------------------------------------------------------------------------


def is_exact(arr: np.ndarray) -> bool:
    """Whether ``arr`` holds exact Fractions (an ``object`` array)."""
    return arr.dtype == object


def as_law(x: ArrayLike, name: str) -> np.ndarray:
    """One next-token law: float64 via :func:`coupling.as_distribution`, or an exact Fraction
    array (entries ``int``/``Fraction``, non-negative, summing to exactly 1)."""
    arr = np.asarray(x)
    if arr.dtype == object:
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
        if not all(isinstance(v, (int, Fraction)) and not isinstance(v, bool) for v in arr):
            raise ValueError(f"{name}: exact laws must hold int or fractions.Fraction entries")
        if any(v < 0 for v in arr) or sum(arr) != 1:
            raise ValueError(f"{name} is not an exact probability vector (entries >= 0, sum == 1)")
        return arr
    return as_distribution(arr, name=name)


def check_length(n: int, name: str = "gamma") -> int:
    """A positive integer count; ``name`` is the caller's argument (``gamma``, ``length``)."""
    return validate_count(n, name, "block length" if name == "gamma" else "number of tokens")


class ModelCache:
    """Memoised, validated calls of one model (models are pure functions of the context)."""

    def __init__(self, lm: LanguageModel, name: str):
        if isinstance(lm, ModelCache):
            lm = lm.lm
        if not callable(lm):
            raise TypeError(f"{name} must be a language model: a callable context -> law, got "
                            f"{type(lm).__name__}")
        self.lm, self.name, self.memo = lm, name, {}

    def __call__(self, ctx: tuple[int, ...]) -> np.ndarray:
        v = self.memo.get(ctx)
        if v is None:
            v = as_law(self.lm(ctx), f"{self.name}({ctx})")
            self.memo[ctx] = v
        return v


def as_model(lm: LanguageModel, name: str) -> ModelCache:
    """``lm`` memoised and validated; a :class:`ModelCache` is returned as it is (its memo
    kept)."""
    return lm if isinstance(lm, ModelCache) else ModelCache(lm, name)


def check_models(target: LanguageModel, draft: LanguageModel,
                 context: Sequence[int] = ()) -> tuple[ModelCache, ModelCache, tuple[int, ...]]:
    """``(target, draft, context)`` memoised and validated: the first laws are distributions
    over one vocabulary (``ValueError`` naming both sizes otherwise), and the context holds
    token ids of it. Every function of :mod:`coupling.sequence` that takes a model pair
    starts here."""
    T, D = as_model(target, "target"), as_model(draft, "draft")
    ctx = check_context(context)
    p, q = T(ctx), D(ctx)
    if p.size != q.size:
        raise ValueError(f"vocabulary mismatch: target has {p.size} tokens but draft has "
                         f"{q.size}; both models must share one vocabulary")
    check_context(ctx, p.size)
    return T, D, ctx


def _check_law_rows(rows: np.ndarray, name: str, exact: bool) -> np.ndarray:
    if exact:
        return np.stack([as_law(rows[i].astype(object), f"{name}[{i}]")
                         for i in range(rows.shape[0])])
    return np.stack([as_distribution(rows[i], name=f"{name}[{i}]") for i in range(rows.shape[0])])


def _check_ids(x: np.ndarray, name: str, V: int) -> np.ndarray:
    if x.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer token ids, got dtype {x.dtype}")
    if (x < 0).any() or (x >= V).any():
        raise ValueError(f"{name} has token ids outside [0, {V}): {x.tolist()}")
    return x.astype(np.int64)


def check_path(drafts: ArrayLike, p_path: ArrayLike,
               q_path: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One drafted path: ``drafts [gamma]``, ``p_path [gamma + 1, V]``, ``q_path [gamma, V]``,
    validated (float64, or exact Fractions if either law array is an object array)."""
    P, Q, x = np.asarray(p_path), np.asarray(q_path), np.asarray(drafts)
    if P.ndim != 2 or Q.ndim != 2:
        raise ValueError(f"p_path must be [gamma+1, V] and q_path [gamma, V]; got shapes "
                         f"{P.shape} and {Q.shape}")
    if x.ndim != 1:
        raise ValueError(f"drafts must be a 1-D array of gamma token ids, got shape {x.shape}")
    gamma = x.size
    if gamma < 1:
        raise ValueError("drafts is empty: a block needs gamma >= 1 drafted tokens")
    if Q.shape[0] != gamma or P.shape[0] != gamma + 1 or P.shape[1] != Q.shape[1]:
        raise ValueError(f"shape mismatch: {gamma} drafts need p_path of shape [{gamma + 1}, V] "
                         f"and q_path of shape [{gamma}, V]; got {P.shape} and {Q.shape}")
    x = _check_ids(x, "drafts", P.shape[1])
    exact = is_exact(P) or is_exact(Q)
    P, Q = _check_law_rows(P, "p_path", exact), _check_law_rows(Q, "q_path", exact)
    for i, t in enumerate(x.tolist()):
        if Q[i, t] == 0:
            raise ValueError(f"drafts[{i}] = {t} has draft probability q_path[{i}][{t}] = 0: it "
                             "cannot have been drafted; pass the laws the drafts were sampled "
                             "from")
    return x, P, Q


def _check_tree_shapes(drafts, p, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, P = np.asarray(drafts), np.asarray(p)
    if d.ndim != 2 or d.shape[0] < 1 or d.shape[1] < 1:
        raise ValueError(f"drafts must be [k, gamma] token ids with k, gamma >= 1, got shape "
                         f"{d.shape}")
    k, g = d.shape
    if P.ndim != 3 or P.shape[:2] != (k, g + 1) or P.shape[2] < 1:
        raise ValueError(f"p must be [k, gamma + 1, V] = [{k}, {g + 1}, V], got shape {P.shape}")
    Q = None if q is None else np.asarray(q)
    if Q is not None and Q.shape != (k, g, P.shape[2]):
        raise ValueError(f"q must be [k, gamma, V] = [{k}, {g}, {P.shape[2]}], got shape "
                         f"{Q.shape}")
    return _check_ids(d, "drafts", P.shape[2]), P, Q


def _check_rows(x: np.ndarray, name: str) -> None:
    """Every row of ``x [..., V]`` a distribution (finite, >= 0, sums within 1e-6 in float32 or
    1e-9 in float64, the tolerance of a softmax over a large vocabulary)."""
    if x.dtype.kind != "f":
        raise ValueError(f"{name} must be a float array of probabilities, got dtype {x.dtype}")
    sums = x.sum(-1, dtype=np.float64)
    if not (np.isfinite(sums).all() and np.isfinite(x.min())):
        raise ValueError(f"{name} contains NaN or inf; probabilities must be finite")
    if x.min() < 0:
        raise ValueError(f"{name} has negative entries; probabilities must be >= 0 (did you "
                         "pass logits? apply a softmax first)")
    # a softmax over ~1e5 tokens sums to 1 within ~1e-5 in float32; half precision far worse
    tol = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4}.get(x.dtype, 2e-2)
    dev = float(np.abs(sums - 1.0).max())
    if dev > tol:
        raise ValueError(f"{name} rows must sum to 1 over the vocabulary (last axis); the worst "
                         f"row is off by {dev:.3g} > {tol:g}")


def check_tree(drafts: ArrayLike, p: ArrayLike, q: ArrayLike, coins: ArrayLike, u: ArrayLike,
               *, values: bool = True):
    """One request's draft tree and its randomness: ``drafts [k, gamma]``,
    ``p [k, gamma + 1, V]``, ``q [k, gamma, V]``, ``coins [gamma, k]``, ``u [gamma + 1]``;
    ``values=False`` checks shapes only (the caller vouches for the laws)."""
    d, P, Q = _check_tree_shapes(drafts, p, q)
    if Q is None:
        raise TypeError("q must be an array [k, gamma, V] of draft laws, got None")
    k, g = d.shape
    C, U = np.asarray(coins, dtype=np.float64), np.asarray(u, dtype=np.float64)
    if C.shape != (g, k) or U.shape != (g + 1,):
        raise ValueError(f"coins must be [gamma, k] = [{g}, {k}] and u [gamma + 1] = [{g + 1}], "
                         f"got {C.shape} and {U.shape}")
    if values:
        _check_rows(P, "p")
        _check_rows(Q, "q")
        if not (((C >= 0) & (C < 1)).all() and ((U >= 0) & (U < 1)).all()):
            raise ValueError("coins and u must lie in [0, 1)")
        if (np.take_along_axis(Q, d[..., None], -1) <= 0).any():
            raise ValueError("drafts contains token(s) with draft probability q = 0: they cannot "
                             "have been drafted from q; pass the law the drafts were sampled "
                             "from")
    return d, _normalised(P), _normalised(Q), C, U


def _normalised(x: np.ndarray) -> np.ndarray:
    """Rows in float64, each divided by its float64 sum: laws given in float32 or half
    precision sum to 1 only within their rounding (1e-4, 2e-2), and every rule's arithmetic
    then runs on exact distributions, so the output law is exactly the normalised target's."""
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum(-1, keepdims=True)


def check_noise(drafts: ArrayLike, p: ArrayLike, q: ArrayLike | None, noise: ArrayLike, *,
                values: bool = True):
    """A drafter-invariant rule's inputs: the tree as :func:`check_tree` (``q`` may be None)
    and finite Gumbel noise ``[gamma + 1, V]``."""
    d, P, Q = _check_tree_shapes(drafts, p, q)
    G = np.asarray(noise, dtype=np.float64)
    if G.shape != (d.shape[1] + 1, P.shape[2]):
        raise ValueError(f"noise must be [gamma + 1, V] = [{d.shape[1] + 1}, {P.shape[2]}], got "
                         f"{G.shape}")
    if values:
        _check_rows(P, "p")
        if Q is not None:
            _check_rows(Q, "q")
        if not np.isfinite(G).all():
            raise ValueError("noise must be finite standard Gumbel noise")
    return d, P, G


# --------------------------------------------------------------------------------------
# Drafting
# --------------------------------------------------------------------------------------


def check_num_paths(V: int, gamma: int) -> None:
    """``ValueError`` unless the ``V**gamma`` draft paths of an exact enumeration fit
    :data:`MAX_PATHS`."""
    if V**gamma > MAX_PATHS:
        raise ValueError(f"exact enumeration needs {V}**{gamma} = {V**gamma} draft paths, above "
                         f"{MAX_PATHS}; lower gamma or the vocabulary size")


def path_laws(target: LanguageModel, draft: LanguageModel, gamma: int, *,
              context: Sequence[int] = ()) -> Iterator:
    r"""Yield ``(path, prob, p_path, q_path)`` for every draft block of positive probability.

    ``prob`` is :math:`Q(x) = \prod_i q_i(x_i)`; laws are exact if the models return
    Fractions. Paths come in lexicographic order; zero-probability prefixes are pruned.
    """
    gamma = check_length(gamma)
    T, D, ctx = check_models(target, draft, context)
    V = T(ctx).size
    check_num_paths(V, gamma)

    def rec(prefix: tuple[int, ...], prob, qs: list):
        if len(prefix) == gamma:
            P = np.stack([T(ctx + prefix[:i]) for i in range(gamma + 1)])
            yield np.array(prefix, dtype=np.int64), prob, P, np.stack(qs)
            return
        q = D(ctx + prefix)
        for t in range(V):
            if q[t] > 0:
                yield from rec(prefix + (t,), prob * q[t], qs + [q])

    one = Fraction(1) if is_exact(T(ctx)) else 1.0
    yield from rec((), one, [])


def _inverse_cdf(law: np.ndarray, u: float) -> int:
    c = np.cumsum(np.asarray(law, dtype=np.float64))
    y = int(np.searchsorted(c, u * c[-1], side="right"))
    return min(y, int(np.flatnonzero(np.asarray(law, dtype=np.float64) > 0)[-1]))


def draft_tree(target: Callable, draft: Callable, gamma: int, rng: np.random.Generator,
               context: tuple[int, ...], *, k: int = 1, replacement: bool = True,
               roots: Sequence[int] | None = None):
    """Draft ``k`` branches of ``gamma`` tokens from validated, memoised models: i.i.d.
    branches, or ``k`` distinct first tokens (successive sampling) each continued as a chain.
    ``roots`` (``[k]``) gives the first tokens instead, drawn by the caller from a rule's own
    draft law (:meth:`coupling.rules.base.Rule.draw_drafts`).
    Returns float64 ``(drafts [k, gamma], p [k, gamma + 1, V], q [k, gamma, V])``."""
    rows = []
    first: list[int] = []
    for j in range(k):
        q0 = np.asarray(draft(context), dtype=np.float64)
        if not replacement and first:
            q0 = q0.copy()
            q0[first] = 0.0
            q0 = q0 / q0.sum()
        xs = [_inverse_cdf(q0, float(rng.random())) if roots is None else int(roots[j])]
        first.append(xs[0])
        qs = [np.asarray(draft(context), dtype=np.float64)]
        for _ in range(1, gamma):
            q = np.asarray(draft(context + tuple(xs)), dtype=np.float64)
            xs.append(_inverse_cdf(q, float(rng.random())))
            qs.append(q)
        ps = [np.asarray(target(context + tuple(xs[:i])), dtype=np.float64)
              for i in range(gamma + 1)]
        rows.append((xs, ps, qs))
    drafts = np.array([r[0] for r in rows], dtype=np.int64)
    return (drafts, np.stack([np.stack(r[1]) for r in rows]),
            np.stack([np.stack(r[2]) for r in rows]))


def gumbel_block(target: Callable, draft: Callable, gamma: int, rng: np.random.Generator,
                 context: tuple[int, ...]):
    """Draft ``gamma`` tokens by Gumbel-max with fresh noise from ``rng``: ``(drafts [gamma],
    p [gamma + 1, V], noise [gamma + 1, V])`` (the noise rows of the drafted positions and of
    the bonus position)."""
    V = target(context).size
    G = rng.gumbel(size=(gamma + 1, V))
    xs: list[int] = []
    for i in range(gamma):
        with np.errstate(divide="ignore"):
            xs.append(int(np.argmax(np.log(np.asarray(draft(context + tuple(xs)),
                                                      dtype=np.float64)) + G[i])))
    P = np.stack([np.asarray(target(context + tuple(xs[:i])), dtype=np.float64)
                  for i in range(gamma + 1)])
    return np.array(xs, dtype=np.int64), P, G
