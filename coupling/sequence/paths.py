r"""Exact analysis of speculative decoding over whole sequences, for any rule of the registry.

One call drafts ``k`` branches of ``gamma`` tokens, verifies them with a rule and emits the
accepted prefix plus one token. Every rule knows the exact law of one call's outcomes
(:meth:`~coupling.rules.base.Rule.outcomes`: block verification by enumerating draft paths,
single-step rules by their walk), and this module composes them:

* :func:`accepted_length_law`, :func:`expected_accepted`, :func:`block_efficiency`: the law
  and the mean of the accepted length of one call;
* :func:`stream_law`: the exact law of the first ``length`` generated tokens when the rule
  is iterated; lossless means it equals :func:`target_law`;
* :func:`sample_stream`: the same process, sampled.

Conventions: ``expected_accepted`` counts accepted draft tokens per call (Sun et al.'s
convention: 10/9 and 11/9 on their motivating example); ``block_efficiency =
expected_accepted + 1`` counts tokens produced per target call. Models returning exact
Fraction laws give exact Fraction results.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Iterable, Sequence
from fractions import Fraction

import numpy as np

from ..dist import num_tuples, validate_k, validate_replacement
from ..lm import (
    MAX_PATHS,
    LanguageModel,
    ModelCache,
    check_context,
    check_length,
    check_models,
    is_exact,
)
from ..rules import Rule, get_rule
from ..tree import Tree
from .topology import tree_outcomes

__all__ = [
    "path_law",
    "accepted_length_law",
    "expected_accepted",
    "block_efficiency",
    "constant_acceptance_efficiency",
    "target_law",
    "stream_law",
    "propagate",
    "sample_stream",
]


def _check_strings(V: int, length: int) -> None:
    """An exact law over ``V**length`` strings must fit in memory: ``ValueError`` naming
    ``length`` otherwise."""
    n = num_tuples(V, length)
    if n > MAX_PATHS:
        count = f"{n:.3g}" if np.isfinite(n) else f"{V}**{length}"
        raise ValueError(f"an exact law of length={length} enumerates {count} strings, above "
                         f"{MAX_PATHS}; lower length or the vocabulary size")


def _rule(rule: str | Rule, k: int, replacement: bool) -> tuple[Rule, int, bool]:
    return get_rule(rule, controls=True), validate_k(k), validate_replacement(replacement)


def _calls(r: Rule, gamma: int | None, k: int, replacement: bool, tree: Tree | None):
    """``(depth, outcomes(T, D, ctx))`` of one call: ``k`` chains of ``gamma`` tokens through
    ``r.outcomes``, or a draft tree of any shape (:func:`.topology.tree_outcomes`)."""
    if tree is None:
        if gamma is None:
            raise ValueError("give the draft length gamma (with k and replacement), or a "
                             "draft tree as tree=coupling.Tree(...)")
        gamma, k, replacement = check_length(gamma), validate_k(k), \
            validate_replacement(replacement)
        return gamma, lambda T, D, ctx: r.outcomes(T, D, gamma, ctx, k=k,
                                                   replacement=replacement)
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a coupling.Tree, got {type(tree).__name__}")
    if gamma is not None or k != 1 or replacement is not True:
        raise ValueError("tree= fixes the draft length, the branches and how they are drawn; "
                         "leave gamma, k and replacement out (Tree.from_chains(k, gamma) is "
                         "the tree of k chains)")
    return tree.depth, lambda T, D, ctx: tree_outcomes(r, T, D, tree, ctx)


def path_law(rule: str | Rule, drafts, p_path, q_path) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact law of one call of a chain rule (``token``, ``block``) given the drafted path:
    ``(tau [gamma + 1], next [gamma + 1, V])``, :math:`P(\tau = i \mid x)` and the law of the
    emitted token given :math:`\tau = i`."""
    r = get_rule(rule, controls=True)
    if not hasattr(r, "path_law"):
        raise ValueError(f"path_law is defined for the chain rules token and block, not "
                         f"{r.name!r}; use accepted_length_law for any rule")
    return r.path_law(drafts, p_path, q_path)


def accepted_length_law(rule: str | Rule, target: LanguageModel, draft: LanguageModel,
                        gamma: int | None = None, *, k: int = 1, replacement: bool = True,
                        tree: Tree | None = None, context: Sequence[int] = ()) -> np.ndarray:
    r"""Exact law of the accepted length, ``[depth + 1]``:
    :math:`P(\tau = i) = \sum_x Q(x) P(\tau = i \mid x)` over the drafted trees: ``k``
    branches of ``gamma`` tokens, or a draft tree of any shape (``tree=``,
    :mod:`coupling.sequence.topology`)."""
    r = get_rule(rule, controls=True)
    depth, outcomes = _calls(r, gamma, k, replacement, tree)
    T, D, ctx = check_models(target, draft, context)
    exact = is_exact(T(ctx))
    total = np.array([Fraction(0) if exact else 0.0] * (depth + 1),
                     dtype=object if exact else np.float64)
    for _, tau, prob in outcomes(T, D, ctx):
        total[tau] += prob
    return total


def expected_accepted(rule: str | Rule, target: LanguageModel, draft: LanguageModel,
                      gamma: int | None = None, *, k: int = 1, replacement: bool = True,
                      tree: Tree | None = None, context: Sequence[int] = ()):
    r"""Exact expected number of accepted draft tokens per call, :math:`E[\tau]` (a float, or a
    Fraction when the models return exact laws); ``tree=`` as in :func:`accepted_length_law`."""
    law = accepted_length_law(rule, target, draft, gamma, k=k, replacement=replacement,
                              tree=tree, context=context)
    s = sum(i * law[i] for i in range(law.size))
    return s if isinstance(s, Fraction) else float(s)


def block_efficiency(rule: str | Rule, target: LanguageModel, draft: LanguageModel,
                     gamma: int | None = None, *, k: int = 1, replacement: bool = True,
                     tree: Tree | None = None, context: Sequence[int] = ()):
    r"""Exact expected tokens produced per target call, :math:`E[\tau] + 1`, with ``k`` draft
    branches (i.i.d., or distinct first tokens with ``replacement=False``), or on a draft tree
    of any shape (``tree=``).

    >>> import coupling
    >>> target, draft = coupling.TabularLM(4, seed=0), coupling.TabularLM(4, seed=1)
    >>> round(coupling.block_efficiency("block", target, draft, 3), 3)
    2.256
    >>> tree = coupling.Tree.from_branching([2, 1])      # two i.i.d. first tokens, one more each
    >>> round(coupling.block_efficiency("rrs", target, draft, tree=tree), 3)
    2.077
    """
    return expected_accepted(rule, target, draft, gamma, k=k, replacement=replacement,
                             tree=tree, context=context) + 1


def constant_acceptance_efficiency(alpha, gamma: int):
    r"""Token verification's tokens per call when every position accepts w.p. :math:`\alpha`:
    :math:`\sum_{i=0}^{\gamma} \alpha^i = (1 - \alpha^{\gamma+1})/(1 - \alpha)`
    (:math:`\gamma + 1` at :math:`\alpha = 1`).

    ``alpha`` is a probability in [0, 1]: a float, or a :class:`fractions.Fraction` for an
    exact result."""
    gamma = check_length(gamma)
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, numbers.Real) \
            or not 0 <= alpha <= 1:  # also rejects NaN
        raise ValueError("alpha must be an acceptance probability in [0, 1] (a float or "
                         f"Fraction), got {alpha!r}")
    return sum(alpha**i for i in range(gamma + 1))


def target_law(target: LanguageModel, length: int, *, context: Sequence[int] = ()) -> np.ndarray:
    """Exact law of the target's first ``length`` tokens: ``V**length`` probabilities, strings
    in lexicographic order."""
    length = check_length(length, "length")
    T = ModelCache(target, "target")
    ctx = check_context(context)
    V = T(ctx).size
    check_context(ctx, V)
    _check_strings(V, length)
    exact = is_exact(T(ctx))
    out = np.zeros(V**length, dtype=object if exact else np.float64)
    for n, s in enumerate(itertools.product(range(V), repeat=length)):
        pr = Fraction(1) if exact else 1.0
        for i in range(length):
            pr = pr * T(ctx + s[:i])[s[i]]
            if pr == 0:
                break
        out[n] = pr
    return out


def stream_law(rule: str | Rule, target: LanguageModel, draft: LanguageModel,
               gamma: int | None, length: int, *, k: int = 1, replacement: bool = True,
               tree: Tree | None = None, context: Sequence[int] = ()) -> np.ndarray:
    r"""Exact law of the first ``length`` generated tokens when iterating ``rule``.

    From each generated prefix shorter than ``length`` it enumerates every outcome of one call,
    merging outcomes by prefix (the models depend on the context only), until every branch has
    at least ``length`` tokens. Returns a ``V**length`` array in lexicographic order; lossless
    means it equals :func:`target_law`. ``gamma=None, tree=...`` iterates a draft tree of any
    shape.
    """
    r = get_rule(rule, controls=True)
    _, outcomes = _calls(r, gamma, k, replacement, tree)
    length = check_length(length, "length")
    T, D, ctx = check_models(target, draft, context)
    V = T(ctx).size
    _check_strings(V, length)

    def step(pre: tuple[int, ...]):
        return ((emitted, prob) for emitted, _, prob in outcomes(T, D, ctx + pre))

    return propagate(step, V, length, exact=is_exact(T(ctx)))


def propagate(step: Callable[[tuple[int, ...]], Iterable[tuple[tuple[int, ...], object]]],
              V: int, length: int, *, exact: bool = False) -> np.ndarray:
    """Exact law (``V**length``, lexicographic) of the first ``length`` tokens of a loop whose
    call after the generated prefix ``pre`` emits each ``(emission, probability)`` of
    ``step(pre)``. A call depends on its prefix only, so mass is merged by prefix and each
    prefix is expanded once; ``exact`` keeps Fractions.

    >>> coin = lambda pre: [((0,), 0.5), ((1, 1), 0.5)]
    >>> propagate(coin, 2, 2).tolist()
    [0.25, 0.25, 0.0, 0.5]
    """
    one = Fraction(1) if exact else 1.0
    frontier = {(): one}
    done: dict = {}
    while frontier:
        pre = min(frontier, key=len)  # shortest first: every merge into it has already happened
        mass = frontier.pop(pre)
        for emitted, prob in step(pre):
            new = (pre + tuple(emitted))[:length]
            bucket = done if len(new) == length else frontier
            bucket[new] = bucket.get(new, 0 * one) + mass * prob
    out = np.zeros(V**length, dtype=object if exact else np.float64)
    for s, w in done.items():
        out[int(np.ravel_multi_index(s, (V,) * length))] = w
    return out


def sample_stream(rule: str | Rule, target: LanguageModel, draft: LanguageModel, gamma: int,
                  length: int, rng: np.random.Generator, *, k: int = 1,
                  replacement: bool = True, context: Sequence[int] = ()) -> np.ndarray:
    """Run speculative decoding with ``rule`` until at least ``length`` tokens; the first
    ``length``."""
    r, k, replacement = _rule(rule, k, replacement)
    gamma = check_length(gamma)
    length = check_length(length, "length")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    r.require(k, replacement)
    T, D, ctx = check_models(target, draft, context)
    out: list[int] = []
    while len(out) < length:
        out.extend(r.sample_call(T, D, gamma, rng, ctx + tuple(out), k=k,
                                 replacement=replacement))
    return np.array(out[:length], dtype=np.int64)
