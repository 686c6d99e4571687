"""Claim: the keyed Gumbel clocks built by blocks (coupling.keyed.exponentials) are i.i.d.
standard exponential: of a block of n clocks, the smallest is Exp(n) (E_min = -log(W) / n
with W uniform), it sits at a uniform slot J, and the others exceed it by i.i.d. Exp(1)
amounts (E_v = E_min - log U_v), all independent. Adding the excess to the slot's clock too
(the natural slip) is not i.i.d. Exp(1).

Source: memorylessness of the exponential law (e.g. the exponential-race form of the
Gumbel-max trick); the construction is the package's, for an argmax that hashes only the
blocks that can hold the winner (coupling.torch_backend.rng.gumbel_argmax).

Method:
1. Symbolic (sympy), n = 2..5: the construction's density on the event {J = j} is
   n e^{-n m} (1/n) prod_{i != j} e^{-x_i}; under the map E_j = m, E_i = m + x_i (unit
   Jacobian, onto {E_j < E_i for all i != j}) it equals prod_i e^{-E_i}. The n events
   partition the orthant up to null sets, so E has the i.i.d. Exp(1) density. The slip
   (E_i = m + x_i for every i, x i.i.d. Exp(1)) has E[min E] = 2/n, not 1/n.
2. The package's clocks follow the map bit for bit: on 200 keys and a vocabulary of 150
   (three blocks, the last padded), each block's minimum is -log U(h_b) / 64 at slot
   h_b mod 64 and the others are that minimum plus -log U(seed, position, STREAM_GUMBEL, v).

Status: verified (symbolic for n = 2..5; the package's construction checked exactly).
"""

from __future__ import annotations

import sys

import numpy as np
import sympy as sp

from coupling import keyed


def symbolic(n: int) -> bool:
    m = sp.symbols("m", positive=True)
    E = sp.symbols(f"E0:{n}", positive=True)
    j = 0                                              # every slot alike, by symmetry
    x = {i: E[i] - m for i in range(n) if i != j}
    density = n * sp.exp(-n * m) / n * sp.prod([sp.exp(-x[i]) for i in x])
    density = density.subs(m, E[j])
    jac = sp.Matrix(n, n, lambda r, c: 1 if c == 0 or r == c else 0).det()
    iid = sp.simplify(density - sp.prod([sp.exp(-e) for e in E])) == 0 and jac == 1
    # the slip: every clock m + x_i; min E = m + min x, with m ~ Exp(n), min x ~ Exp(n)
    t = sp.symbols("t", positive=True)
    mean_min = 2 * sp.integrate(t * n * sp.exp(-n * t), (t, 0, sp.oo))
    slip_caught = sp.simplify(mean_min - sp.Rational(1, n)) != 0
    print(f"n={n}: density equals the i.i.d. Exp(1) density: {iid}; "
          f"the slip's E[min] = {mean_min} != 1/{n}: {slip_caught}")
    return bool(iid and slip_caught)


def package_follows_the_map() -> bool:
    seeds = np.arange(200, dtype=np.uint64)
    position, V, n = np.uint64(7), 150, keyed.GUMBEL_BLOCK
    E = keyed.exponentials(seeds, position, np.arange(V), whole=True)
    ok = True
    for b in range((V + n - 1) // n):
        h = keyed.keyed_hash(seeds[:, None], position, keyed.STREAM_GUMBEL_BLOCK, b)[:, 0]
        e_min = -np.log(keyed.to_unit(h)) / n
        slot = (h % np.uint64(n)).astype(np.int64)
        v = np.arange(b * n, min(V, (b + 1) * n))
        excess = -np.log(keyed.uniforms(seeds[:, None], position, keyed.STREAM_GUMBEL, v))
        want = np.where(v % n == slot[:, None], e_min[:, None], excess + e_min[:, None])
        ok &= bool(np.array_equal(E[:, v], want))
    print(f"the package's clocks are the map's, bit for bit: {ok}")
    return ok


def main() -> int:
    ok = all([symbolic(n) for n in (2, 3, 4, 5)]) and package_follows_the_map()
    print("VERIFIED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
