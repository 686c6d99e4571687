r"""Draft trees judged as a whole: the trie of ``k`` drafted paths, the exact law of the trees,
and :class:`TreeRule`, the base of the rules that verify a tree at once (``traversal``,
``gbv``).

Layout (:meth:`coupling.rules.base.Rule.verify_block` and the batched twins)
--------------------------------------------------------------------------
``drafts [k, gamma]``
    path ``j`` drafted ``drafts[j, 0..gamma-1]``;
``p [k, gamma + 1, V]``, ``q [k, gamma, V]``
    ``p[j, i]``, the target law after ``drafts[j, :i]`` (``i = gamma``: the bonus law);
    ``q[j, i]``, the law ``drafts[j, i]`` was drawn from;
``coins [gamma, k]``, ``u [gamma + 1]``
    ``coins[i, j]`` is the coin of the node at depth ``i + 1`` whose lowest path is ``j``
    (each node is judged at most once); ``u[tau]`` draws the emitted token by inverse CDF
    after ``tau`` accepted tokens (:func:`coupling.rules.common.categorical`).

Shared prefixes
---------------
Paths with equal prefixes share the nodes of that prefix: the tree is the *trie* of the
``k`` paths (:func:`build_trie`). A node's laws are read from its lowest-index path
(``branch``), so the rows of other paths at a shared node are never read; its children are
ordered by first appearance along paths ``0..k-1``.

Draft models (``replacement``)
------------------------------
``True``: the ``k`` paths are i.i.d. draws of ``gamma`` tokens from the draft model.
``False``: the ``k`` first tokens are successive draws without replacement from
:math:`q(\cdot \mid c)`, and each path then continues as one independent chain. In both
models the children of every node, in order of first appearance, are successive draws
without replacement from the node's draft law, stopped at a time that depends only on what
was drawn before (the next distinct token among i.i.d. draws, given the earlier ones, has law
:math:`q` restricted to the unseen tokens). :func:`draft_trees` enumerates the ordered trees
with their exact probabilities (Fractions for Fraction models).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import numpy as np

from ..lm import check_tree, path_laws
from .base import Rule

__all__ = ["Trie", "build_trie", "draft_trees", "unit_of", "TreeLaw", "TreeRule",
           "NegativeControl", "MAX_TREES"]

#: Largest number of ordered draft trees an exact enumeration may visit (``V**(gamma k)``).
MAX_TREES = 2_000_000

#: The law of one call given its tree: ``[(accepted prefix, probability, law of the next
#: token)]``, outcomes of probability 0 left out.
TreeLaw = list[tuple[tuple[int, ...], object, np.ndarray]]


@dataclass(frozen=True)
class Trie:
    """The trie of ``k`` drafted paths; node 0 is the root (the empty prefix).

    Attributes
    ----------
    prefix : tuple of tuples
        ``prefix[n]``, the tokens from the root to node ``n``.
    parent : tuple of int
        ``-1`` for the root.
    children : tuple of tuples
        Children of each node, in order of first appearance along paths ``0..k-1``.
    branch : tuple of int
        Lowest index of a path through each node (its laws are read there).
    """

    prefix: tuple[tuple[int, ...], ...]
    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    branch: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.prefix)

    def depth(self, n: int) -> int:
        return len(self.prefix[n])

    def token(self, n: int) -> int:
        """The token that leads into node ``n`` (not defined for the root)."""
        return self.prefix[n][-1]


def build_trie(drafts: np.ndarray) -> Trie:
    """Merge validated ``drafts [k, gamma]`` into their trie (nodes in order of creation)."""
    return _trie(tuple(tuple(int(t) for t in row) for row in drafts))


@functools.lru_cache(maxsize=1 << 16)
def _trie(paths: tuple[tuple[int, ...], ...]) -> Trie:
    # memoised: an exact enumeration meets every tree again after every context
    index: dict[tuple[int, ...], int] = {(): 0}
    prefix: list[tuple[int, ...]] = [()]
    parent, branch = [-1], [0]
    children: list[list[int]] = [[]]
    for j, path in enumerate(paths):
        up = 0
        for i in range(1, len(path) + 1):
            key = path[:i]
            n = index.get(key)
            if n is None:
                n = index[key] = len(prefix)
                prefix.append(key)
                parent.append(up)
                branch.append(j)
                children.append([])
                children[up].append(n)
            up = n
    return Trie(tuple(prefix), tuple(parent), tuple(tuple(c) for c in children), tuple(branch))


def unit_of(law: np.ndarray):
    """``Fraction(1)`` for an exact law (an ``object`` array), ``1.0`` for a float one."""
    return Fraction(1) if np.asarray(law).dtype == object else 1.0


def draft_trees(target: Callable, draft: Callable, gamma: int, k: int, *,
                replacement: bool = True, context: Sequence[int] = ()
                ) -> Iterator[tuple[np.ndarray, object, np.ndarray, np.ndarray]]:
    r"""Yield ``(drafts [k, gamma], prob, p [k, gamma + 1, V], q [k, gamma, V])`` for every
    ordered draft tree of positive probability (exact when the models return Fractions).

    ``replacement=True``: :math:`\mathrm{prob} = \prod_j Q(x_j)`. ``False``: the first tokens
    :math:`a_1..a_k` are ordered successive draws from :math:`q = q(\cdot \mid c)`,
    :math:`\prod_j q(a_j) / (1 - \sum_{l<j} q(a_l))`, times each chain's continuation.
    """

    chains = list(path_laws(target, draft, gamma, context=context))
    X = np.stack([c[0] for c in chains])
    prob = [c[1] for c in chains]
    P, Q = np.stack([c[2] for c in chains]), np.stack([c[3] for c in chains])
    one = unit_of(Q)
    for combo in itertools.product(range(len(chains)), repeat=k):
        if replacement:
            pr = one
            for a in combo:
                pr = pr * prob[a]
        else:
            pr = _successive(combo, X, prob, Q, one)
            if pr is None:
                continue
        idx = np.array(combo)
        yield X[idx], pr, P[idx], Q[idx]


def _successive(combo, X, prob, Q, one):
    """Probability of the ordered tree ``combo`` when its first tokens are successive draws
    without replacement (``None`` if two first tokens are equal)."""
    firsts = [int(X[a, 0]) for a in combo]
    if len(set(firsts)) < len(firsts):
        return None
    pr, used = one, 0 * one
    for a, t in zip(combo, firsts, strict=True):
        pr = pr * prob[a] / (one - used)      # prob[a] = q(t) * the chain's continuation
        used = used + Q[a, 0, t]
    return pr


class TreeRule(Rule):
    """A rule that judges ``k`` drafted paths as a whole (it has no single-step form).

    Subclasses implement :meth:`tree_law` (exact, float or Fraction laws) and
    ``_verify_block`` (the deterministic core); this class derives from them the exact law
    of a call on two models (:meth:`outcomes`, which :func:`coupling.block_efficiency` and
    :func:`coupling.stream_law` compose) and the prediction of a recorded call
    (:meth:`predict`).
    """

    unit = "block"
    max_drafts = None

    def tree_law(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                 replacement: bool) -> TreeLaw:
        """Exact law of one call given its validated tree (module doc, :data:`TreeLaw`)."""
        raise NotImplementedError

    def outcomes(self, target: Callable, draft: Callable, gamma: int, context: tuple, *,
                 k: int = 1, replacement: bool = True):
        """Yield ``(emitted, accepted, probability)`` over every draft tree and outcome."""
        k, replacement = self.require(k, replacement)
        V = target(context).size
        if not replacement and np.count_nonzero(draft(context)) < k:
            raise ValueError(f"cannot draw k={k} distinct first tokens after {context}: the "
                             f"draft gives positive probability to "
                             f"{np.count_nonzero(draft(context))}; lower k or use "
                             "replacement=True")
        if gamma * k * math.log(V) > math.log(MAX_TREES):
            raise ValueError(f"exact enumeration needs up to (V**gamma)**k = ({V}**{gamma})**{k} "
                             f"ordered draft trees, above {MAX_TREES}; lower k, gamma or the "
                             "vocabulary size")
        return self._outcomes(target, draft, gamma, context, k, replacement)

    def _outcomes(self, target, draft, gamma, context, k, replacement):
        for drafts, prob, P, Q in draft_trees(target, draft, gamma, k, replacement=replacement,
                                              context=context):
            for prefix, pr, law in self.tree_law(drafts, P, Q, replacement):
                for y in np.flatnonzero(law != 0):
                    yield prefix + (int(y),), len(prefix), prob * pr * law[y]

    def predict(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, branch: int, *,
                replacement: bool = True) -> list[float]:
        r""":math:`P(\tau \ge i \mid \text{tree})` for ``i = 1..gamma``: with
        :meth:`expected_tokens`, the exact expected tokens of the call given its whole tree
        (``branch`` is not used: the rule chooses the branch itself)."""

        k, g = np.shape(drafts)
        d, P, Q, _, _ = check_tree(drafts, p, q, np.zeros((g, k)), np.zeros(g + 1))
        at_least = np.zeros(g + 1)
        for prefix, pr, _ in self.tree_law(d, P, Q, replacement):
            at_least[: len(prefix) + 1] += float(pr)
        return at_least[1:].tolist()

    def expected_tokens(self, beta: list[float]) -> float:
        r""":math:`1 + \sum_i P(\tau \ge i \mid \text{tree})` from :meth:`predict`."""
        return 1.0 + float(sum(beta))


class NegativeControl:
    """Mixin for a deliberately broken variant of a tree rule (listed first among the bases):
    the harnesses must flag it. ``controls`` maps each mistake's name to what it does."""

    lossless = False
    bound_text = "(broken on purpose: output law != p)"
    controls: ClassVar[dict[str, str]] = {}

    def _break(self, control: str) -> None:
        if control not in self.controls:
            raise ValueError(f"control must be one of {sorted(self.controls)}, got {control!r}")
        self.control = control
        self.title = f"broken on purpose: {self.name} where {self.controls[control]}"
        self.name = f"{self.name}_{control}"

    twin = None  # a negative control has no torch twin
