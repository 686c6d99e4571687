r"""This package's single-step rules as block verifiers, sampled and exact.

A rule of :data:`coupling.RULES` turns ``m`` drafts of one position into one output token.
:func:`from_rule` walks it along a draft tree the way the package's batched torch twins do:
at offset ``i`` the *survivors* are the branches whose first ``i`` tokens were emitted; the
rule sees their tokens at offset ``i`` (i.i.d. draws from ``q_i`` along the shared prefix,
or the ``k`` distinct first drafts without replacement) and emits ``y``; if a survivor drafted
``y`` the walk continues with those survivors, otherwise it stops. A survivor at the end gets
the bonus token from its ``p_gamma``. Lossless because each step is, given the prefix.

The exact form (``law``) replaces each step's sample by the rule's conditional law of the
output given the drafted tuple, a row of ``rule.joint`` divided by the tuple's probability.

A rule that judges the drafted block as a whole (``rule.unit == "block"``: ``block``,
``traversal``, ``gbv``) is called on the whole tree instead: it samples through
``rule.verify_block`` with uniforms from the generator, and its exact law is the rule's own law
given the tree (``rule.tree_law``, or ``rule.path_law`` for one branch).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import RULES, tuple_law

__all__ = ["RuleVerifier", "from_rule", "chain_law", "tree_law_emissions"]


def chain_law(x: np.ndarray, tau: np.ndarray, nxt: np.ndarray) -> dict[tuple[int, ...], float]:
    """Law of the emission of a one-branch verifier from its accepted-length law.

    ``x [gamma]`` drafts, ``tau [gamma + 1]`` with ``tau[n] = P(n accepted)``, ``nxt
    [gamma + 1, V]`` the law of the next token given ``n``: returns
    ``{x[:n] + (y,): tau[n] * nxt[n, y]}`` over the positive terms.
    """
    out: dict[tuple[int, ...], float] = {}
    head = tuple(int(t) for t in x)
    for n, pn in enumerate(tau):
        if pn <= 0:
            continue
        for y, w in enumerate(nxt[n]):
            if w > 0:
                out[head[:n] + (y,)] = out.get(head[:n] + (y,), 0.0) + float(pn * w)
    return out


def tree_law_emissions(law) -> dict[tuple[int, ...], float]:
    """``{emitted tokens: probability}`` from a rule's law given a tree, ``(accepted prefix,
    probability, law of the next token)`` triples (:data:`coupling.rules.trie.TreeLaw`).

    >>> tree_law_emissions([((2,), 0.5, np.array([0.0, 1.0])), ((), 0.5, np.array([0.5, 0.5]))])
    {(2, 1): 0.5, (0,): 0.25, (1,): 0.25}
    """
    out: dict[tuple[int, ...], float] = {}
    for prefix, pr, nxt in law:
        for y in np.flatnonzero(np.asarray(nxt) > 0).tolist():
            e = tuple(int(t) for t in prefix) + (y,)
            out[e] = out.get(e, 0.0) + float(pr) * float(nxt[y])
    return out


class RuleVerifier:
    """``RULES[name]`` walked along the draft tree: call it to sample, ``law`` for the exact
    conditional law of its emission (see the module doc)."""

    def __init__(self, rule, *, replacement: bool = True, cache_size: int = 4096):
        self.rule = RULES[rule] if isinstance(rule, str) else rule
        self.replacement = bool(replacement)
        self.name = f"{self.rule.name}" + ("" if replacement else " (without replacement)")
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_size

    def __repr__(self) -> str:
        return f"from_rule({self.rule.name!r}, replacement={self.replacement})"

    def __call__(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
        k, g = drafts.shape
        if self.rule.unit != "token":
            coins, u = rng.random((g, k)), rng.random(g + 1)
            n, j, y = self.rule.verify_block(drafts, p, q, coins, u,
                                             replacement=self.replacement, validate=False)
            return np.append(drafts[j, :n], y)
        alive = np.ones(k, dtype=bool)
        for i in range(g):
            idx = np.flatnonzero(alive)
            ref = int(idx[0])
            # the checker's laws and drafts are checked where it builds them
            y = int(self.rule.sample(p[ref, i], q[ref, i], drafts[idx, i], rng,
                                     replacement=self.replacement, validate=False))
            hit = alive & (drafts[:, i] == y)
            if not hit.any():
                return np.append(drafts[ref, :i], y)
            alive = hit
        ref = int(np.flatnonzero(alive)[0])
        return np.append(drafts[ref], rng.choice(p.shape[-1], p=p[ref, g]))

    def step_law(self, p: np.ndarray, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Law of the rule's output given the drafted tuple ``x`` (one position)."""
        key = (p.tobytes(), q.tobytes(), x.size)
        hit = self._cache.get(key)
        if hit is None:
            tuples, _ = tuple_law(q, x.size, replacement=self.replacement)
            J = np.asarray(self.rule.joint(p, q, x.size, replacement=self.replacement))
            hit = self._cache[key] = (tuples, J)
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        tuples, J = hit
        row = J[int(np.flatnonzero((tuples == x).all(axis=1))[0])]
        return row / row.sum()

    def law(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray):
        """``{emitted tokens: probability}`` given the draft tree (exactly, from ``joint``)."""
        k, g = drafts.shape
        if self.rule.unit != "token":
            return self._block_law(drafts, p, q)
        out: dict[tuple[int, ...], float] = {}

        def walk(i: int, alive: np.ndarray, mass: float) -> None:
            idx = np.flatnonzero(alive)
            ref = int(idx[0])
            head = tuple(int(t) for t in drafts[ref, :i])
            law = p[ref, g] if i == g else self.step_law(p[ref, i], q[ref, i], drafts[idx, i])
            for y, w in enumerate(law):
                if w <= 0:
                    continue
                hit = alive & (drafts[:, i] == y) if i < g else np.zeros(k, dtype=bool)
                if hit.any():
                    walk(i + 1, hit, mass * w)
                else:
                    out[head + (y,)] = out.get(head + (y,), 0.0) + mass * float(w)

        walk(0, np.ones(k, dtype=bool), 1.0)
        return out


    def _block_law(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray):
        """The law of a rule that judges the tree as a whole (module doc)."""
        self.rule.require(drafts.shape[0], self.replacement)
        if drafts.shape[0] == 1 and hasattr(self.rule, "path_law"):
            return chain_law(drafts[0], *self.rule.path_law(drafts[0], p[0], q[0]))
        # rounding leaves some outcomes at -1e-17, which the loop's check refuses
        return tree_law_emissions(o for o in self.rule.tree_law(drafts, p, q, self.replacement)
                                  if float(o[1]) > 0)


def from_rule(rule, *, replacement: bool = True) -> RuleVerifier:
    """A verifier ``verify(drafts, p, q, rng)`` (with an exact ``law``) from a rule of
    :data:`coupling.RULES`, given by name or as the rule object."""
    if isinstance(rule, str) and rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(RULES)}")
    return RuleVerifier(rule, replacement=replacement)
