r"""One request's draft tree verified position by position, in numpy: the reference walk.

The tree, the walk and why it is lossless are described in :mod:`coupling.torch_backend.multi`
(whose :func:`~coupling.torch_backend.multi.walk_tree` is the batched torch twin). Here the
single-step rule at each offset is the reference's own deterministic core, fed the surviving
branches' tokens and acceptance coins in branch order:

* ``rrs``: :func:`coupling.rules.rrs.verify` (with or without replacement);
* ``kseq``: :func:`coupling.rules.kseq.verify` (``rho`` computed only where a test needs it);
* ``optimal``: the token rule (:func:`coupling.rules.rrs.verify` with one draft) for one
  survivor, else the exact LP-plan row of the tuple (:func:`coupling.rules.optimal.verify`).

Randomness is passed in: ``coins[i, j]``, branch ``j``'s coin at offset ``i``, and
``u_sample[i]``, the draw of the token emitted at offset ``i`` (residual, LP row or bonus).
With the keyed uniforms of :mod:`coupling.torch_backend.rng` this is what the torch backend
runs for a single request on a CPU, where a scalar step costs about a microsecond against
5-15 for a tensor operation. Both walks apply the same rules to the same numbers, so they
decide alike; they may differ only where a float sum, taken in a different order by numpy and
torch, lands within an ulp of a coin or of an inverse-CDF threshold.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import kseq, optimal, rrs
from ._base import categorical

__all__ = ["walk", "step_for"]

# a single-step rule: (p_i [V], q_i [V], survivors' tokens [m], their coins [m], u) -> token
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float], int]
# the laws along the tree: law(branch, offset) -> float64 [V]
Laws = Callable[[int, int], np.ndarray]


def _optimal_step(replacement: bool) -> Step:
    def step(p, q, x, coins, u):
        if x.size == 1:  # one survivor: optimal's k = 1 rule is the token rule
            return rrs.verify(p, q, x, coins, u)
        return optimal.verify(p, q, x, u, replacement=replacement)   # renormalises itself

    return step


def step_for(rule: str, replacement: bool = True) -> Step:
    """The single-step core of ``rule`` (``rrs``, ``kseq`` or ``optimal``)."""
    if rule == "rrs":
        return lambda p, q, x, coins, u: rrs.verify(p, q, x, coins, u, replacement=replacement)
    if rule == "kseq":
        if not replacement:
            raise ValueError("kseq is defined for i.i.d. drafts only; use replacement=True")
        return lambda p, q, x, coins, u: kseq.verify(p, q, x, coins, u)
    if rule == "optimal":
        return _optimal_step(replacement)
    raise ValueError(f"no numpy tree walk for rule {rule!r}; use rrs, kseq or optimal")


def walk(step: Step, drafts: np.ndarray, p: Laws, q: Laws, coins: np.ndarray,
         u_sample: np.ndarray) -> tuple[int, int, int]:
    """Verify one request's tree ``drafts [k, g]``: ``(accepted, branch, next_token)``.

    ``p(j, i)`` / ``q(j, i)`` return the target / draft law along branch ``j`` at offset ``i``
    (float64 ``[V]``; called only where the walk reads them, so a caller holding tensors
    converts only those rows); ``coins [g, k]``, ``u_sample [g + 1]``. At each offset the
    survivors' laws are read from the lowest-index survivor (they share the prefix); the
    walk stops at the first emitted token no survivor drafted, or emits the bonus token from
    the last survivor's ``p(j, g)`` by inverse CDF with ``u_sample[g]``. ``branch`` is the
    lowest survivor at the stop (as in the torch walk).
    """
    k, g = drafts.shape
    alive = np.ones(k, dtype=bool)
    for i in range(g):
        idx = np.flatnonzero(alive)
        ref = int(idx[0])
        y = step(p(ref, i), q(ref, i), drafts[idx, i], coins[i, idx], float(u_sample[i]))
        hit = alive & (drafts[:, i] == y)
        if not hit.any():
            return i, ref, int(y)
        alive = hit
    ref = int(np.flatnonzero(alive)[0])
    return g, ref, categorical(p(ref, g), float(u_sample[g]))
