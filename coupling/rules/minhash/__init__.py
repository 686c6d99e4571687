r"""``minhash``: the drafter-invariant weighted-MinHash coupling (Daliri, Musco, Suresh 2024,
"Coupling without Communication and Drafter-Invariant Speculative Decoding").

Shared darts :math:`(i_t, u_t)` uniform on :math:`[V] \times [0,1)`; each side outputs the
token of its first dart under its own graph (:math:`u_t < p(i_t)`, resp. :math:`u_t < q(i_t)`).
:func:`pair` throws the darts literally (vectorised, in blocks), which is exact.
Exact law: the first dart under *either* graph lands on token ``i`` with probability
:math:`\max(p_i, q_i)/\Sigma` (:math:`\Sigma = \sum \max(p, q) = 1 + \mathrm{TV}`); it is
under both graphs with conditional probability :math:`\min/\max`; otherwise only one side
has decided and, darts being i.i.d., the other side's output is a fresh draw from its own
law. Hence (rows: draft ``x``, columns: output ``y``)

.. math:: \pi(x, y) = \big(\mathbf 1[x=y]\min(p_x,q_x) + (p_y - q_y)_+ q_x
          + (q_x - p_x)_+ p_y\big) / \Sigma,
          \qquad
          \alpha = \frac{\sum_i \min(p_i, q_i)\,(1 + |p_i - q_i|)}{1 + \mathrm{TV}} .

Note the collision probability is *at least* :math:`\sum\min/\sum\max =
(1-\mathrm{TV})/(1+\mathrm{TV})` (the paper's bound), not equal to it: the side that has
not yet decided can still land on the same token later.

Along a block the rule is applied position by position, accepting while the draft is the
output (:mod:`coupling.rules.walk`); per position the drafts survive with the diagonal of the
law above.
"""

from __future__ import annotations

import numpy as np

from ...dist import validate_count
from ..base import Rule
from ..common import categorical
from ..gumbel import tv_bounds

__all__ = ["acceptance", "joint", "verify", "pair", "WeightedMinHash", "RULE"]


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    r""":math:`\sum_i \min(p_i,q_i)(1 + |p_i - q_i|) / \sum_i \max(p_i, q_i)`."""
    mn = np.minimum(p, q)
    return float(np.sum(mn * (1.0 + np.abs(p - q))) / np.maximum(p, q).sum())


def joint(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact law ``[V, V]`` of (draft, output) under shared darts (module doc)."""
    S = float(np.maximum(p, q).sum())
    J = np.outer(q, np.maximum(p - q, 0.0)) + np.outer(np.maximum(q - p, 0.0), p)
    J[np.diag_indices_from(J)] += np.minimum(p, q)
    return J / S


def pair(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, *,
         block: int | None = None) -> tuple[int, int]:
    """(draft, output) by literally throwing shared darts, ``block`` at a time (exact)."""
    V = p.size
    if block is not None:
        validate_count(block, "block", "number of darts per round (or None for max(64, 2 V))")
    n = block or max(64, 2 * V)
    x = y = -1
    while x < 0 or y < 0:
        i = rng.integers(0, V, size=n)
        u = rng.random(n)
        if x < 0:
            hit = np.flatnonzero(u < q[i])
            if hit.size:
                x = int(i[hit[0]])
        if y < 0:
            hit = np.flatnonzero(u < p[i])
            if hit.size:
                y = int(i[hit[0]])
    return x, y


def verify(p: np.ndarray, q: np.ndarray, x: int, u: float) -> int:
    """Deterministic core: output given draft ``x`` by inverse CDF of row ``x`` of the law."""
    row = q[x] * np.maximum(p - q, 0.0) + max(q[x] - p[x], 0.0) * p
    row[x] += min(p[x], q[x])
    return categorical(row, u)


class WeightedMinHash(Rule):
    """Shared darts: each side outputs the token of the first dart under its own graph."""

    name = "minhash"
    twin = "coupling.rules.minhash.torch"
    title = "weighted-MinHash dart coupling (drafter-invariant)"
    reference = "Daliri, Musco, Suresh 2024"
    max_drafts = 1
    drafter_invariant = True
    bound_text = "in [(1 - TV)/(1 + TV), 1 - TV] (Daliri, Musco, Suresh 2024)"

    def n_uniforms(self, k: int, V: int) -> int:
        """One draw from the drafted row of the law."""
        return 1

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q)

    def _joint(self, p, q, k, replacement):
        return joint(p, q)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, int(drafts[0]), float(u[-1]))

    def _bound(self, p, q, k, replacement):
        return tv_bounds(p, q)


RULE = WeightedMinHash()
