r"""How a single-step rule verifies a block or a draft tree: the walk, and its exact law.

Draft tree
----------
A request has ``k`` draft branches of ``g`` tokens, ``drafts[j, :]``, with the draft and
target laws along each branch, ``q[j, i]`` and ``p[j, i]`` (``p[j, g]`` is the bonus law after
the whole branch). With i.i.d. drafting (``replacement=True``: SpecTr / SpecInfer trees)
branches that share a prefix have i.i.d. continuations after it; without replacement the
``k`` first tokens are distinct (successive sampling) and each branch then continues as a
single chain.

The walk (one request, explicit randomness)
-------------------------------------------
At offset ``i`` the *survivors* are the branches whose first ``i`` tokens equal the emitted
prefix (all ``k`` at ``i = 0``). Their tokens at offset ``i`` are i.i.d. draws from ``q_i``
along that prefix (distinct draws at ``i = 0`` without replacement), so the rule's
single-step coupling applies to them and emits ``y_i`` with law exactly ``p_i``. If some
survivor drafted ``y_i`` the survivors shrink to those branches and the walk goes on (their
unobserved continuations are still i.i.d. given the prefix, because every decision so far
used only earlier tokens and independent coins); otherwise ``y_i`` ends the call. Survivors
at the end get the bonus token from their ``p_g``. Every emitted token has law ``p`` given the
prefix, so the walk is lossless whenever the step is. With one branch it is the familiar
chain: accept while the draft is the rule's output.

Randomness: ``coins[i, j]`` is branch ``j``'s coin at offset ``i`` and ``u[i]`` the draw of the
token emitted at offset ``i`` (residual, plan row or bonus): a rule's step reads
``(coins of the survivors, u[i])`` as its explicit uniforms (:meth:`Rule.verify`'s layout: one
coin per draft, then the emitted-token draw).

Exact law of one call
---------------------
:func:`walk_outcomes` enumerates the walk's outcomes on two language models: at a prefix with
``m`` survivors, the rule's exact joint law ``J[t, y]`` over survivor tuples ``t`` (of its
draft law, :meth:`Rule.draft_law`) and outputs ``y`` (:meth:`Rule.joint`) says how much mass
continues with the ``c(t, y) = #{j : t_j = y}`` branches that drafted ``y``, and how much
stops there. With one survivor only the diagonal of
``J`` and its column sums matter (:meth:`Rule.chain_step`), so chains cost ``O(V^g)`` whatever
the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .common import categorical

__all__ = ["Step", "walk", "walk_outcomes", "survivor_counts"]

# a single-step rule on validated laws: (p_i [V], q_i [V], survivors' tokens [m],
# uniforms [m + 1] = their coins then the emitted-token draw) -> output token
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]


def walk(step: Step, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, coins: np.ndarray,
         u: np.ndarray) -> tuple[int, int, int]:
    """Verify one request's tree: ``(accepted, branch, next_token)``.

    ``drafts [k, g]``, ``p [k, g + 1, V]``, ``q [k, g, V]`` (any float dtype; the rows the walk
    reads are taken in float64), ``coins [g, k]``, ``u [g + 1]``. At each offset the survivors'
    laws are read from the lowest-index survivor (they share the prefix); ``branch`` is the
    lowest survivor at the stop.
    """
    k, g = drafts.shape
    alive = np.ones(k, dtype=bool)
    for i in range(g):
        idx = np.flatnonzero(alive)
        ref = int(idx[0])
        pi = np.asarray(p[ref, i], dtype=np.float64)
        qi = np.asarray(q[ref, i], dtype=np.float64)
        y = step(pi, qi, drafts[idx, i], np.append(coins[i, idx], u[i]))
        hit = alive & (drafts[:, i] == y)
        if not hit.any():
            return i, ref, int(y)
        alive = hit
    ref = int(np.flatnonzero(alive)[0])
    return g, ref, categorical(np.asarray(p[ref, g], dtype=np.float64), float(u[g]))


def survivor_counts(drafts: np.ndarray, branch: int, replacement: bool) -> list[int]:
    """How many branches share the chosen branch's prefix at each offset (``k_0 = k``): the
    number of i.i.d. drafts the step rule judged there. Without replacement the branches
    part after offset 0 (distinct first tokens), so ``k_i = 1`` for ``i >= 1``."""
    k, g = drafts.shape
    if not replacement and k > 1:
        return [k] + [1] * (g - 1)
    return [int((drafts[:, :i] == drafts[branch, :i]).all(-1).sum()) for i in range(g)]


def walk_outcomes(rule, target: Callable, draft: Callable, gamma: int, context: tuple,
                  k: int, replacement: bool) -> Iterator[tuple[tuple[int, ...], int, object]]:
    """Yield ``(emitted tokens, accepted length, probability)`` for every outcome of one call
    of ``rule``'s walk after ``context`` (laws may be exact Fractions where the rule's
    :meth:`~coupling.rules.base.Rule.chain_step` takes them; ``k > 1`` needs float laws).

    ``target`` and ``draft`` are validated, memoised model calls (``ctx -> law``).
    """
    first = target(context)
    one = first.dtype.type(1) if first.dtype != object else type(first[0])(1)

    def rec(pre: tuple[int, ...], m: int, mass) -> Iterator:
        p = target(context + pre)
        if len(pre) == gamma:                         # bonus position: y ~ p
            for y in np.flatnonzero(p != 0):
                yield pre + (int(y),), gamma, mass * p[y]
            return
        q = draft(context + pre)
        repl = replacement or len(pre) > 0 or m == 1
        stay, stop = _step_law(rule, p, q, m, repl)
        for y in np.flatnonzero(stop != 0):
            yield pre + (int(y),), len(pre), mass * stop[y]
        for (y, c), w in stay.items():
            yield from rec(pre + (y,), c, mass * w)

    yield from rec((), k, one)


def _step_law(rule, p: np.ndarray, q: np.ndarray, m: int, replacement: bool):
    """One offset of the walk: ``({(y, survivors): mass}, stop [V])``."""
    if m == 1:
        c, stop = rule.chain_step(p, q)
        return {(int(y), 1): c[y] for y in np.flatnonzero(c != 0)}, stop
    tuples, _ = rule.draft_law(q, m, replacement=replacement)
    J = rule.joint(p, q, m, replacement=replacement)
    counts = (tuples[:, :, None] == np.arange(p.size)).sum(1)          # [T, V]
    stay: dict = {}
    for c in range(1, m + 1):
        w = (J * (counts == c)).sum(0)
        for y in np.flatnonzero(w > 0):
            stay[(int(y), c)] = float(w[y])
    stop = (J * (counts == 0)).sum(0)
    return stay, stop
