"""Claim: on one drafted path (k = 1) traversal verification is block verification, coin for
coin, and so is GBV.

For one path x of gamma tokens, traversal's candidates are the depths gamma, gamma - 1, ...,
1, 0 and its acceptance probabilities are block verification's h_gamma, ..., h_1 (then 1 at
the root), where h_i = r_i / (r_i + 1 - w_i) for i < gamma and h_gamma = w_gamma (Sun et al.,
arXiv:2403.10444, Algorithm 2): stopping at the first candidate whose coin succeeds is
tau = max{i : eta_i < h_i}, block verification's decision on the same coins. The emitted
token's law at each stop is block's residual norm((w_i p_{i+1} - q_{i+1})_+). GBV with one
path skews nothing (q* = q) and block-verifies the path.

Source: derived here (coupling/rules/traversal, module doc); the GBV authors' reference code
states that traversal and GBV reduce to block verification for K = 1.

Method: exhaustive check in exact rational arithmetic of the package's own code, on every
draft path of positive probability of:
  * random rational models, V = 2, 3, 4; gamma = 1..4 (V**gamma <= 81); context order 0, 1, 2,
    a third with exact zeros (110 model pairs), from two contexts;
  * every context-independent pair over V = 2 with entries in multiples of 1/5, gamma = 1..3;
comparing traversal's schedule (its acceptance probabilities in order) with block's h, and
traversal's and GBV's exact law given the path (accepted length, next-token law) with
block's coupling.sequence.path_law. The check can fail: traversal's plain-residual control
must differ from block's law on some path.

Status: verified (exhaustive exact check over the stated cases).
"""

from __future__ import annotations

import sys

import numpy as np
from _block_common import constant_lm, rational_lm, simplex_grid

from coupling.lm import path_laws
from coupling.rules import block, gbv, traversal


def same_law(tree_law, tau, nxt) -> bool:
    """A tree law ``[(prefix, prob, next)]`` of one path against block's ``(tau, next)``."""
    got = {len(prefix): (pr, law) for prefix, pr, law in tree_law}
    for i in range(tau.size):
        if tau[i] == 0:
            if i in got:
                return False
            continue
        if i not in got or got[i][0] != tau[i] or not np.array_equal(got[i][1], nxt[i]):
            return False
    return True


def check_path(x, P, Q) -> tuple[bool, bool]:
    """``(claim holds, the plain-residual control differs)`` on one path."""
    d, p, q = x[None], P[None], Q[None]
    _, h = block.weights(x, P, Q)
    accepts = [s.accept for s in traversal.schedule(d, p, q)]
    if accepts != [h[i] for i in range(x.size, 0, -1)] + [1]:
        return False, False
    tau, nxt = block.path_law(x, P, Q)
    ok = same_law(traversal.law(d, p, q), tau, nxt) and same_law(gbv.law(d, p, q), tau, nxt)
    broken = not same_law(traversal.law(d, p, q, control="plain_residual"), tau, nxt)
    return ok, broken


def pairs():
    n = 0
    for V in (2, 3, 4):
        for gamma in range(1, 5):
            if V**gamma > 81:
                continue
            for j in range(10):
                n += 1
                order, zeros = j % 3, j % 3 == 1
                t = rational_lm(V, order, seed=2000 + n, zeros=zeros)
                d = rational_lm(V, order, seed=3000 + n, zeros=zeros)
                for ctx in ((), (V - 1,)):
                    yield t, d, gamma, ctx
    for p in simplex_grid(2, 5):
        for q in simplex_grid(2, 5):
            for gamma in (1, 2, 3):
                yield constant_lm(p), constant_lm(q), gamma, ()


def main() -> int:
    paths = 0
    control_differs = False
    for t, d, gamma, ctx in pairs():
        for x, _, P, Q in path_laws(t, d, gamma, context=ctx):
            ok, broken = check_path(x, P, Q)
            if not ok:
                print(f"k = 1 differs from block: path {x.tolist()}, gamma={gamma}")
                return 1
            control_differs |= broken
            paths += 1
    print(f"{paths} drafted paths: traversal's acceptance probabilities are block's h_gamma..h_1 "
          "in order, and traversal's and GBV's exact laws are block's, exactly")
    if not control_differs:
        print("the plain-residual control never differed: the check cannot fail")
        return 1
    print("the plain-residual control differs from block's law (the check can fail)")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
