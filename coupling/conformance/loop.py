r"""Whole generation loops around a verifier: sampled (for the statistical test) and exact.

Draft trees
-----------
One verification step after a context ``c`` verifies ``k`` branches of ``gamma`` drafted
tokens each, ``drafts[j, i]``, as the package's batched torch twins define them:

* with replacement, the ``k`` branches are independent chains from the draft model,
  :math:`x_{j,i} \sim q(\cdot \mid c, x_{j,<i})`;
* without replacement, the first tokens :math:`x_{1,0}, \dots, x_{k,0}` are distinct, drawn
  by successive sampling from :math:`q(\cdot \mid c)`, and each branch then continues as an
  independent chain.

The verifier receives ``p[j, i] = target(c + drafts[j, :i])`` for ``i = 0..gamma`` and
``q[j, i] = draft(c + drafts[j, :i])`` for ``i < gamma``, and returns the tokens it emits:
``drafts[j, :n]`` for some branch ``j`` and ``0 <= n <= gamma``, then one more token. The
loop appends them to the context and verifies again until ``length`` tokens are out.

Exactly
-------
:func:`exact_law` computes the law of the first ``length`` tokens by enumerating every
draft tree of positive probability after every reachable context, weighting the verifier's
conditional law of its emission given the tree (a ``law`` function, see
:mod:`coupling.conformance`), and merging outcomes by context, shortest context first (the
models depend on the context only).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .. import as_distribution, tuple_law
from ..sequence.paths import propagate

__all__ = [
    "Laws",
    "sample_tree",
    "tree_laws",
    "enumerate_trees",
    "check_emission",
    "sample_counts",
    "Counts",
    "pad_trees",
    "is_greedy",
    "exact_law",
    "MAX_TREES",
]

#: Largest number of draft trees :func:`exact_law` may enumerate after one context.
MAX_TREES = 200_000

Step = Callable[[np.ndarray, np.ndarray, np.ndarray, np.random.Generator], list]
Law = Callable[[np.ndarray, np.ndarray, np.ndarray], Mapping]


class Laws:
    """Memoised, validated calls of one model (a pure function of the context)."""

    def __init__(self, lm: Callable, name: str):
        self.lm, self.name, self.memo, self.cdfs = lm, name, {}, {}

    def __call__(self, ctx: tuple[int, ...]) -> np.ndarray:
        law = self.memo.get(ctx)
        if law is None:
            law = as_distribution(np.asarray(self.lm(ctx), dtype=np.float64),
                                  name=f"{self.name}({ctx})")
            law.setflags(write=False)
            self.memo[ctx] = law
        return law

    def draw(self, ctx: tuple[int, ...], u: float) -> int:
        """Inverse-CDF draw from the law after ``ctx`` (never a token of zero mass)."""
        c = self.cdfs.get(ctx)
        if c is None:                     # plain lists: bisect beats numpy on a few tokens
            law = self(ctx)
            c = self.cdfs[ctx] = (np.cumsum(law).tolist(), (law > 0).tolist(),
                                  int(np.flatnonzero(law > 0)[-1]))
        cdf, positive, last = c
        i = bisect.bisect_right(cdf, u * cdf[-1])
        return i if i < len(cdf) and positive[i] else last


def _distinct_first(q: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    """``k`` distinct tokens by successive sampling from ``q``."""
    w = q.copy()
    out = []
    for _ in range(k):
        c = np.cumsum(w)
        i = min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), w.size - 1)
        while w[i] <= 0:  # rounding at the top of the cumulative sum
            i -= 1
        out.append(i)
        w[i] = 0.0
    return out


def sample_tree(ctx: tuple[int, ...], draft: Laws, k: int, gamma: int, replacement: bool,
                rng: np.random.Generator) -> np.ndarray:
    """One draft tree ``[k, gamma]`` after ``ctx`` (see the module doc)."""
    out = np.empty((k, gamma), dtype=np.int64)
    first = None if replacement else _distinct_first(draft(ctx), k, rng)
    u = rng.random((k, gamma))
    for j in range(k):
        branch = ctx
        for i in range(gamma):
            t = first[j] if (i == 0 and first is not None) else draft.draw(branch, u[j, i])
            out[j, i] = t
            branch = branch + (t,)
    return out


def tree_laws(ctx: tuple[int, ...], drafts: np.ndarray, target: Laws, draft: Laws):
    """``p [k, gamma + 1, V]`` and ``q [k, gamma, V]`` along the branches of ``drafts``."""
    k, gamma = drafts.shape
    V = target(ctx).size
    if draft(ctx).size != V:
        raise ValueError(f"vocabulary mismatch: target has {V} tokens, draft {draft(ctx).size}")
    rows = [tuple(r) for r in drafts.tolist()]
    p = np.array([[target(ctx + r[:i]) for i in range(gamma + 1)] for r in rows])
    q = np.array([[draft(ctx + r[:i]) for i in range(gamma)] for r in rows]).reshape(
        k, gamma, V)
    return p, q


def _chains(ctx: tuple[int, ...], draft: Laws, n: int) -> list[tuple[tuple[int, ...], float]]:
    """Every continuation of ``n`` tokens after ``ctx`` with its positive probability."""
    out = [((), 1.0)]
    for _ in range(n):
        out = [(s + (t,), pr * w) for s, pr in out
               for t, w in enumerate(draft(ctx + s)) if w > 0]
    return out


def enumerate_trees(ctx: tuple[int, ...], draft: Laws, k: int, gamma: int,
                    replacement: bool) -> Iterator[tuple[np.ndarray, float]]:
    """Every draft tree of positive probability after ``ctx``, with its probability."""
    firsts, probs = tuple_law(draft(ctx), k, replacement=replacement)
    tails = {t: _chains(ctx + (t,), draft, gamma - 1) for t in np.unique(firsts).tolist()}
    for first, pr in zip(firsts.tolist(), probs.tolist(), strict=True):
        if pr <= 0:
            continue
        count = 1
        for t in first:
            count *= len(tails[t])
        if count > MAX_TREES:
            raise ValueError(
                f"the exact mode would enumerate {count} draft trees after one context; "
                "lower vocab_size, gamma or k"
            )
        for combo in itertools.product(*(tails[t] for t in first)):
            drafts = np.array([(t,) + s for t, (s, _) in zip(first, combo, strict=True)],
                              dtype=np.int64)
            yield drafts, pr * float(np.prod([w for _, w in combo]))


def check_emission(out, drafts: np.ndarray, V: int) -> tuple[int, ...]:
    """Validate a verifier's emission against its draft tree; return it as a tuple."""
    k, gamma = drafts.shape
    arr = np.asarray(out)
    if arr.ndim != 1 or not 1 <= arr.size <= gamma + 1 or arr.dtype.kind not in "iu":
        raise ValueError(
            f"verify must return a 1-D integer array of 1 to gamma+1 = {gamma + 1} tokens (the "
            f"accepted drafts, then one token), got {arr!r}"
        )
    em = tuple(arr.tolist())
    if min(em) < 0 or max(em) >= V:
        raise ValueError(f"verify returned token ids outside [0, {V}): {list(em)}")
    n = len(em) - 1
    if n and not any(tuple(row[:n]) == em[:n] for row in drafts.tolist()):
        raise ValueError(
            f"verify emitted {list(em)}, whose first {n} tokens are not the first {n} drafts of "
            f"any branch of {drafts.tolist()}: a verifier may only accept drafted tokens"
        )
    return em


def _index(strings: np.ndarray, V: int) -> np.ndarray:
    """Lexicographic index of each row of ``strings [n, L]`` among the ``V**L`` strings."""
    return np.ravel_multi_index(strings.T, (V,) * strings.shape[1]) if strings.size else \
        np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Counts:
    """What :func:`sample_counts` observed: ``counts [2, V**length]`` of the sampled loops'
    first ``length`` tokens (alternate batches), verification calls and emitted tokens of
    those loops, and the greedy loops run beside them with how many strayed from the
    target's greedy decoding."""

    counts: np.ndarray
    calls: int
    emitted: int
    greedy_loops: int = 0
    greedy_wrong: int = 0


def is_greedy(target: Laws, string: tuple[int, ...]) -> bool:
    """Whether every token of ``string`` is a likeliest token of the target after the ones
    before it (any of them on a tie)."""
    return all(target(string[:i])[t] == target(string[:i]).max() for i, t in enumerate(string))


def pad_trees(trees: list[np.ndarray], laws: list, draft: Laws, rng: np.random.Generator):
    """Stack trees of different ``gamma`` as an engine pads a ragged batch: ``drafts
    [B, k, G]``, ``p [B, k, G + 1, V]``, ``q [B, k, G, V]`` with ``G`` the largest gamma, and
    ``num_drafts [B]``. The padding is adversarial: each padded draft is a random token and
    both laws at a padded position are a point mass on it, so a verifier that reads past a
    row's own drafts accepts tokens that were never drafted (a protocol error the checker
    names) or takes its bonus token from the wrong row (a distortion of the law)."""
    num = np.array([t.shape[1] for t in trees], dtype=np.int64)
    B, (k, _), G, V = len(trees), trees[0].shape, int(num.max()), draft(()).size
    drafts = rng.integers(V, size=(B, k, G))
    p = np.zeros((B, k, G + 1, V))
    q = np.zeros((B, k, G, V))
    hot = np.eye(V)
    for b, (tree, (pb, qb)) in enumerate(zip(trees, laws, strict=True)):
        g = num[b]
        drafts[b, :, :g] = tree
        p[b, :, :g + 1], q[b, :, :g] = pb, qb
        p[b, :, g + 1:] = hot[drafts[b, :, g:]]
        q[b, :, g:] = hot[drafts[b, :, g:]]
    return drafts, p, q, num


def _round(step: Step, layout: str, ctxs: list, greedy: np.ndarray | None, target: Laws,
           draft: Laws, gammas: tuple[int, ...], k: int, replacement: bool,
           draft_rng: np.random.Generator, verify_rng: np.random.Generator):
    """One verification round of the active loops: their trees and emissions."""
    if len(gammas) == 1:
        g = np.full(len(ctxs), gammas[0])
    elif layout == "call":
        g = np.repeat(draft_rng.choice(gammas), len(ctxs))
    else:
        g = draft_rng.choice(gammas, size=len(ctxs))
    trees = [sample_tree(c, draft, k, int(n), replacement, draft_rng)
             for c, n in zip(ctxs, g, strict=True)]
    laws = [tree_laws(c, d, target, draft) for c, d in zip(ctxs, trees, strict=True)]
    extra = {} if greedy is None else {"greedy": greedy}
    if layout == "rows":
        emitted = step(trees, [p for p, _ in laws], [q for _, q in laws], verify_rng)
    elif layout == "call":
        emitted = step(np.stack(trees), np.stack([p for p, _ in laws]),
                       np.stack([q for _, q in laws]), verify_rng, **extra)
    else:
        drafts, p, q, num = pad_trees(trees, laws, draft, draft_rng)
        emitted = step(drafts, p, q, verify_rng, num_drafts=num, **extra)
    if len(emitted) != len(ctxs):
        raise ValueError(f"a batched verifier returned {len(emitted)} emissions for "
                         f"{len(ctxs)} requests")
    return trees, emitted


def sample_counts(step: Step, target: Laws, draft: Laws, *, n: int, length: int,
                  gammas: tuple[int, ...], k: int, replacement: bool,
                  rng: np.random.Generator, batch: int = 256, layout: str = "rows",
                  greedy: int = 0, progress: Callable[[int], None] | None = None) -> Counts:
    """Run ``n`` generation loops and count the first ``length`` tokens (:class:`Counts`).

    Loops advance in batches of ``batch``: each round drafts a tree for every unfinished
    loop and hands them to ``step`` together. Every tree's gamma is drawn uniformly from
    ``gammas``: per loop where ``layout`` is ``"rows"`` (``step`` takes lists of trees of
    any shape) or ``"ragged"`` (one padded batch, :func:`pad_trees`, with ``num_drafts``),
    once per call where it is ``"call"`` (stacked arrays). ``greedy`` more loops per batch
    run beside the sampled ones, flagged by a boolean ``greedy [B]`` keyword (batched layouts
    only; every call of such a run gets the flags, all ``False`` once the greedy loops are
    done); they must decode greedily (:func:`is_greedy`) and are not counted.
    """
    V = target(()).size
    draft_rng, verify_rng = rng.spawn(2)
    counts = np.zeros((2, V**length), dtype=np.int64)
    calls = emitted_total = g_loops = g_wrong = 0
    for start in range(0, n, batch):
        m = min(batch, n - start)
        flags = np.r_[np.zeros(m, bool), np.ones(greedy, bool)]
        out: list[list[int]] = [[] for _ in flags]
        active = list(range(flags.size))
        while active:
            trees, emitted = _round(step, layout, [tuple(out[a]) for a in active],
                                    flags[active] if greedy else None, target, draft,
                                    gammas, k, replacement,
                                    draft_rng, verify_rng)
            for a, d, em in zip(active, trees, emitted, strict=True):
                em = check_emission(em, d, V)
                out[a].extend(em)
                if not flags[a]:
                    calls, emitted_total = calls + 1, emitted_total + len(em)
            active = [a for a in active if len(out[a]) < length]
        strings = np.array([o[:length] for o in out[:m]], dtype=np.int64)
        np.add.at(counts[(start // batch) % 2], _index(strings, V), 1)
        g_loops += greedy
        g_wrong += sum(not is_greedy(target, tuple(o[:length])) for o in out[m:])
        if progress is not None:
            progress(m)
    return Counts(counts, calls, emitted_total, g_loops, g_wrong)


def _checked_law(law: Law, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                 V: int) -> list[tuple[tuple[int, ...], float]]:
    items = list(dict(law(drafts, p, q)).items())
    total = sum(float(w) for _, w in items)
    if any(float(w) < 0 for _, w in items) or abs(total - 1.0) > 1e-9:
        raise ValueError(
            f"law(drafts, p, q) must return probabilities that are >= 0 and sum to 1, got a "
            f"total of {total!r} for drafts {drafts.tolist()}"
        )
    return [(check_emission(np.array(e, dtype=np.int64), drafts, V), float(w))
            for e, w in items if float(w) > 0]


def exact_law(law: Law, target: Laws, draft: Laws, *, length: int, gammas: tuple[int, ...],
              k: int, replacement: bool) -> np.ndarray:
    """Exact law (``V**length``, lexicographic) of the first ``length`` emitted tokens, each
    step's gamma uniform over ``gammas``."""
    V = target(()).size

    def step(ctx: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], float]]:
        for gamma in gammas:
            for drafts, pr in enumerate_trees(ctx, draft, k, gamma, replacement):
                p, q = tree_laws(ctx, drafts, target, draft)
                for em, w in _checked_law(law, drafts, p, q, V):
                    yield em, pr * w / len(gammas)

    return propagate(step, V, length)
