r"""``gumbel`` and ``minhash``: drafter-invariant, communication-free couplings
(Daliri, Musco, Suresh 2024, "Coupling without Communication and Drafter-Invariant
Speculative Decoding").

Gumbel coupling (``gumbel``)
----------------------------
Shared noise :math:`G_1, \dots, G_V` i.i.d. standard Gumbel. Draft
:math:`x = \arg\max_j \log q_j + G_j`, output :math:`y = \arg\max_j \log p_j + G_j`.
Each side is a Gumbel-max sample, so :math:`x \sim q`, :math:`y \sim p`, and the output is
a function of ``p`` and the noise only (*drafter invariance*).

Exact laws (exponential race: :math:`E_j = e^{-G_j} \sim \mathrm{Exp}(1)`,
:math:`x = \arg\min E_j/q_j`, :math:`y = \arg\min E_j/p_j`):

* collision :math:`P(x = y = i) = 1 / \sum_j \max(p_j/p_i, q_j/q_i)`, so
  :math:`\alpha = \sum_i p_i q_i / (q_i P_{\ge}(i) + p_i Q_{<}(i))` with
  :math:`P_{\ge}(i)` the ``p``-mass of tokens whose ratio :math:`p_j/q_j \ge p_i/q_i` and
  :math:`Q_<(i)` the ``q``-mass of the others: O(V log V) after one sort.
* off-diagonal, :math:`x \ne y`: conditioning on :math:`E_x = a`, :math:`E_y = s a`,

  .. math:: P(x, y) = \int_{q_y/q_x}^{p_y/p_x} \frac{ds}{c(s)^2},\qquad
            c(s) = \sum_j \max\Big(\frac{q_j}{q_x}, s\,\frac{p_j}{p_y}\Big),

  ``c`` is piecewise linear in ``s`` with breakpoints :math:`q_j p_y/(q_x p_j)`, and on a
  piece :math:`\int_a^b (\alpha + \beta s)^{-2} ds = (b-a)/((\alpha+\beta a)(\alpha+\beta b))`:
  :func:`joint` is exact (O(V^3 log V), small V).

Guarantee (Daliri et al. 2024): :math:`\alpha \ge (1-\mathrm{TV})/(1+\mathrm{TV})`; any
coupling has :math:`\alpha \le 1 - \mathrm{TV}`.

Sampling given the draft (:func:`verify`, top-down Gumbel, Maddison et al. 2014):
conditioned on :math:`\arg\max(\log q + G) = x`, the maximum
:math:`M = \max_j \log q_j + G_j` is ``Gumbel(logsumexp(log q)) = Gumbel(0)`` independent of
``x``; every other ``j`` with :math:`q_j > 0` has :math:`\log q_j + G_j` distributed as
``Gumbel(log q_j)`` truncated to ``< M``; entries with :math:`q_j = 0` are unconstrained.
Steps, with uniforms ``u_0, u_1..u_V`` (open interval (0, 1)):

1. :math:`M = -\log(-\log u_0)`; set :math:`G_x = M - \log q_x`.
2. For ``j != x`` with :math:`q_j > 0`: :math:`g = \log q_j - \log(-\log u_j)`,
   :math:`Z_j = -\mathrm{logaddexp}(-M, -g)` (truncation below ``M``),
   :math:`G_j = Z_j - \log q_j`.
3. For :math:`q_j = 0`: :math:`G_j = -\log(-\log u_j)`.
4. Output :math:`\arg\max_{j: p_j > 0} \log p_j + G_j`.

Weighted MinHash (``minhash``)
------------------------------
Shared darts :math:`(i_t, u_t)` uniform on :math:`[V] \times [0,1)`; each side outputs the
token of its first dart under its own graph (:math:`u_t < p(i_t)`, resp. :math:`u_t < q(i_t)`).
:func:`minhash_pair` throws the darts literally (vectorised, in blocks), which is exact.
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
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ..dist import validate_count
from ._base import (
    Rule,
    categorical,
    prepare,
    require_generator,
    require_supported,
    sample_uniform,
)

__all__ = [
    "acceptance",
    "joint",
    "sample",
    "verify",
    "bound",
    "gumbel_pair",
    "gumbel_pair_from_noise",
    "minhash_acceptance",
    "minhash_joint",
    "minhash_pair",
    "minhash_sample",
    "RULE",
    "MINHASH_RULE",
]

BOUND_TEXT = "in [(1 - TV)/(1 + TV), 1 - TV] (Daliri, Musco, Suresh 2024)"


def _supports(k: int, replacement: bool) -> bool:
    return k == 1


def _tv_bounds(p: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    t = 0.5 * float(np.abs(p - q).sum())
    return ((1.0 - t) / (1.0 + t), 1.0 - t)


# ------------------------------------------------------------------------------ gumbel
def acceptance(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> float:
    r"""Exact collision probability :math:`\sum_i 1/\sum_j \max(p_j/p_i, q_j/q_i)`, O(V log V)."""
    require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    both = (pa > 0) & (qa > 0)
    if not both.any():
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(qa > 0, pa / np.where(qa > 0, qa, 1.0), np.inf)
    ratio[(pa == 0) & (qa == 0)] = 0.0
    order = np.argsort(-ratio, kind="stable")  # ratio decreasing
    ps, qs = pa[order], qa[order]
    p_hi = np.cumsum(ps)  # p-mass of tokens ranked at or above (ratio >= own)
    q_lo = qa.sum() - np.cumsum(qs)  # q-mass ranked strictly below
    # ties: a tied j contributes p_j/p_i = q_j/q_i to either sum, so the split does not matter
    m = (ps > 0) & (qs > 0)
    den = qs[m] * p_hi[m] + ps[m] * np.maximum(q_lo[m], 0.0)
    return float(np.sum(ps[m] * qs[m] / den))


def _offdiag(p: np.ndarray, q: np.ndarray, x: int, y: int) -> float:
    s_lo = q[y] / q[x]
    s_hi = np.inf if p[x] == 0 else p[y] / p[x]
    if not s_hi > s_lo:
        return 0.0
    # breakpoints s_j = (q_j/q_x) / (p_j/p_y); j with p_j = 0 never switch (alpha side)
    a_coef = q / q[x]
    b_coef = p / p[y]
    with np.errstate(divide="ignore", invalid="ignore"):
        sj = np.where(b_coef > 0, a_coef / np.where(b_coef > 0, b_coef, 1.0), np.inf)
    cuts = np.unique(sj[(sj > s_lo) & (sj < s_hi)])
    edges = np.concatenate([[s_lo], cuts, [s_hi]])
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        mid = a + 0.5 * (b - a) if np.isfinite(b) else a + 1.0
        on_b = sj <= mid  # s >= s_j on this piece: the p-term is the max
        alpha = float(a_coef[~on_b].sum())
        beta = float(b_coef[on_b].sum())
        ca = alpha + beta * a
        if np.isfinite(b):
            total += (b - a) / ca / (alpha + beta * b)  # divide twice: no overflow
        else:
            total += 1.0 / beta / ca
    return total


def joint(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True) -> np.ndarray:
    """Exact law ``[V, V]`` of (draft, output) under shared Gumbel noise (see module doc)."""
    require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    V = pa.size
    J = np.zeros((V, V))
    for x in np.flatnonzero(qa > 0):
        for y in np.flatnonzero(pa > 0):
            if x == y:
                with np.errstate(divide="ignore", invalid="ignore"):
                    d = np.maximum(pa / pa[x], qa / qa[x])
                J[x, y] = 1.0 / d.sum()
            else:
                J[x, y] = _offdiag(pa, qa, int(x), int(y))
    return J


def gumbel_pair_from_noise(p: np.ndarray, q: np.ndarray, G: np.ndarray) -> tuple[int, int]:
    """Deterministic core of the pair: ``(argmax log q + G, argmax log p + G)``."""
    with np.errstate(divide="ignore"):
        x = int(np.argmax(np.log(q) + G))
        y = int(np.argmax(np.log(p) + G))
    return x, y


def gumbel_pair(p: ArrayLike, q: ArrayLike, rng: np.random.Generator) -> tuple[int, int]:
    """(draft, output) from one shared draw of ``V`` standard Gumbels; no communication."""
    pa, qa, _ = prepare(p, q)
    require_generator(rng)
    return gumbel_pair_from_noise(pa, qa, rng.gumbel(size=pa.size))


def conditional_noise(q: np.ndarray, x: int, u: np.ndarray) -> np.ndarray:
    """Gumbel noise ``G`` conditioned on ``argmax(log q + G) = x`` from uniforms ``u`` of
    length ``V + 1`` in (0, 1) (steps 1-3 of the module doc)."""
    V = q.size
    M = -np.log(-np.log(u[0]))
    G = -np.log(-np.log(u[1:]))  # unconstrained standard Gumbels (used where q == 0)
    pos = q > 0
    pos[x] = False
    lq = np.log(q[pos])
    g = lq + G[pos]
    Z = -np.logaddexp(-M, -g)  # Gumbel(log q_j) truncated below M
    G = G.copy()
    G[pos] = Z - lq
    G[x] = M - np.log(q[x])
    assert G.size == V
    return G


def verify(p: np.ndarray, q: np.ndarray, x: int, u: np.ndarray) -> int:
    """Deterministic core: output given draft ``x`` and ``V + 1`` uniforms in (0, 1)."""
    G = conditional_noise(q, x, u)
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + G))


def _open_uniforms(rng: np.random.Generator, n: int) -> np.ndarray:
    require_generator(rng)
    u = rng.random(n)
    # (0, 1): a zero would make -log(-log u) = -inf; it has probability 2**-53 per draw
    return np.where(u > 0, u, np.nextafter(0.0, 1.0))


def sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    """Output given the draft: noise resampled conditionally on ``argmax(log q + G) = draft``."""
    pa, qa, d = prepare(p, q, drafts)
    require_supported(RULE, d.size, replacement)
    return verify(pa, qa, int(d[0]), _open_uniforms(rng, pa.size + 1))


def bound(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, float]:
    require_supported(RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    return _tv_bounds(pa, qa)


RULE = Rule(
    name="gumbel",
    support_text="the Gumbel coupling takes exactly one draft (k = 1)",
    bound_text=BOUND_TEXT,
    _supports=_supports,
    _acceptance=acceptance,
    _joint=joint,
    _sample=sample,
    _bound=bound,
)


# ----------------------------------------------------------------------------- minhash
def minhash_acceptance(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> float:
    r""":math:`\sum_i \min(p_i,q_i)(1 + |p_i - q_i|) / \sum_i \max(p_i, q_i)`."""
    require_supported(MINHASH_RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    mn = np.minimum(pa, qa)
    return float(np.sum(mn * (1.0 + np.abs(pa - qa))) / np.maximum(pa, qa).sum())


def minhash_joint(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> np.ndarray:
    """Exact law ``[V, V]`` of (draft, output) under shared darts (see module doc)."""
    require_supported(MINHASH_RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    S = float(np.maximum(pa, qa).sum())
    J = np.outer(qa, np.maximum(pa - qa, 0.0)) + np.outer(np.maximum(qa - pa, 0.0), pa)
    J[np.diag_indices_from(J)] += np.minimum(pa, qa)
    return J / S


def minhash_pair(
    p: ArrayLike, q: ArrayLike, rng: np.random.Generator, *, block: int | None = None
) -> tuple[int, int]:
    """(draft, output) by literally throwing shared darts, ``block`` at a time (exact)."""
    pa, qa, _ = prepare(p, q)
    require_generator(rng)
    V = pa.size
    if block is not None:
        validate_count(block, "block", "number of darts per round (or None for max(64, 2 V))")
    n = block or max(64, 2 * V)
    x = y = -1
    while x < 0 or y < 0:
        i = rng.integers(0, V, size=n)
        u = rng.random(n)
        if x < 0:
            hit = np.flatnonzero(u < qa[i])
            if hit.size:
                x = int(i[hit[0]])
        if y < 0:
            hit = np.flatnonzero(u < pa[i])
            if hit.size:
                y = int(i[hit[0]])
    return x, y


def minhash_verify(p: np.ndarray, q: np.ndarray, x: int, u: float) -> int:
    """Deterministic core: output given draft ``x`` by inverse CDF of row ``x`` of the law."""
    row = q[x] * np.maximum(p - q, 0.0) + max(q[x] - p[x], 0.0) * p
    row[x] += min(p[x], q[x])
    return categorical(row, u)


def minhash_sample(
    p: ArrayLike,
    q: ArrayLike,
    drafts: ArrayLike,
    rng: np.random.Generator,
    *,
    replacement: bool = True,
) -> int:
    """Output given the draft, from the exact conditional law of the dart coupling."""
    pa, qa, d = prepare(p, q, drafts)
    require_supported(MINHASH_RULE, d.size, replacement)
    return minhash_verify(pa, qa, int(d[0]), sample_uniform(rng))


def minhash_bound(
    p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True
) -> tuple[float, float]:
    require_supported(MINHASH_RULE, k, replacement)
    pa, qa, _ = prepare(p, q)
    return _tv_bounds(pa, qa)


MINHASH_RULE = Rule(
    name="minhash",
    support_text="the weighted-MinHash coupling takes exactly one draft (k = 1)",
    bound_text=BOUND_TEXT,
    _supports=_supports,
    _acceptance=minhash_acceptance,
    _joint=minhash_joint,
    _sample=minhash_sample,
    _bound=minhash_bound,
)
