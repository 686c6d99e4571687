"""Claim: traversal's node invariant on the first path, and hence traversal >= block
verification of the first path.

Node invariant (coupling/rules/traversal, module doc): when the processing of node v's
subtree starts in state (w, r, s), the probability that v is accepted and the token emitted
after it is y equals w r(y), whatever the subtree's shape. The nodes of path 0, x^1, ...,
x^gamma, are processed first, in the initial state: w_i(x^i) is block verification's weight
min_j prod_{l=j+1..i} p(x_l)/q(x_l) and r = p(. | x^i). So, averaged over every tree whose
first path begins with x^i,

    P(tau >= i, accepted prefix begins x^i, next token y | X_0^i = x^i) = w_i(x^i) p(y | x^i),

and summing over y, P(tau >= i | X_0^i = x^i) >= w_i(x^i) = P(tau_block >= i | x^i) (Sun et
al.'s identity), so traversal of k paths accepts at least as many tokens as block verification
of the first path.

Source: derived here (the papers' full texts were not available; coupling/rules/traversal).

Method: exhaustive check in exact rational arithmetic of the package's own code: for every
ordered draft tree (coupling.rules.trie.draft_trees, exact probabilities) the exact law of a
call (coupling.rules.traversal.law); the conditional law above accumulated per prefix x^i of
the first path, for every i = 0..gamma, and compared with block verification's weights
(coupling.rules.block.weights) times the target's law; then E[tau] of traversal against
block's. Cases: V = 2, 3; gamma = 1, 2, 3; k = 2, 3 (at most 729 ordered trees); i.i.d. paths
and distinct first tokens; random rational models of context order 0, 1 (with zeros) and 2.
The check can fail: the plain-residual control (a broken update) must violate the invariant on
some case.
Not a proof for all V, gamma, k, nor for the nodes processed after a rejection (their start
states depend on the rejected siblings).

Status: verified (exhaustive exact check over the stated cases).
"""

from __future__ import annotations

import sys
from fractions import Fraction

import numpy as np
from _tree_common import tree_cases

from coupling import expected_accepted
from coupling.rules import block, traversal
from coupling.rules.trie import draft_trees


def invariant_holds(t, d, gamma: int, k: int, replacement: bool, control=None) -> bool:
    mass: dict = {}          # x^i -> (sum of Q(T), {y: sum of Q(T) P(event | T)})
    for x, pr, P, Q in draft_trees(t, d, gamma, k, replacement=replacement):
        law = traversal.law(x, P, Q, control=control)
        for i in range(gamma + 1):
            key = tuple(int(v) for v in x[0, :i])
            total, by_y = mass.setdefault(key, [Fraction(0), {}])
            mass[key][0] = total + pr
            for prefix, p_stop, nxt in law:
                if len(prefix) < i or prefix[:i] != key:
                    continue
                if len(prefix) > i:
                    by_y[prefix[i]] = by_y.get(prefix[i], 0) + pr * p_stop
                else:
                    for y, v in enumerate(nxt):
                        by_y[y] = by_y.get(y, 0) + pr * p_stop * v
    for key, (total, by_y) in mass.items():
        x = list(key)
        target = t(tuple(x))
        w_i = Fraction(1)
        if x:
            P = np.stack([t(tuple(x[:j])) for j in range(len(x) + 1)])
            Q = np.stack([d(tuple(x[:j])) for j in range(len(x))])
            w_i = block.weights(np.array(x), P, Q)[0][len(x)]
        for y in range(target.size):
            if by_y.get(y, 0) / total != w_i * target[y]:
                return False
    return True


def main() -> int:
    checked = 0
    control_fails = False
    for V, gamma, k, t, d, zeros in tree_cases((2, 3), 4000):
        for rep in (True, False) if k <= V and not zeros else (True,):
            if not invariant_holds(t, d, gamma, k, rep):
                print(f"invariant fails: V={V} gamma={gamma} k={k} rep={rep} {t.describe}")
                return 1
            if expected_accepted("traversal", t, d, gamma, k=k, replacement=rep) \
                    < expected_accepted("block", t, d, gamma):
                print(f"traversal below block: V={V} gamma={gamma} k={k}")
                return 1
            checked += 1
            if gamma == 2 and not control_fails:
                control_fails = not invariant_holds(t, d, gamma, k, rep, "plain_residual")
    print(f"{checked} (models, gamma, k, draft model) cases: the first path's node invariant "
          "holds exactly at every depth, and traversal >= block of the first path")
    if not control_fails:
        print("the plain-residual control never violated the invariant: the check cannot fail")
        return 1
    print("the plain-residual control violates the invariant (the check can fail)")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
