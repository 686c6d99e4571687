r"""``gumbel``: the drafter-invariant, communication-free Gumbel-max coupling (Daliri, Musco,
Suresh 2024, "Coupling without Communication and Drafter-Invariant Speculative Decoding").

One position
------------
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

Along a block
-------------
Drafter and verifier share noise :math:`G_i` per absolute position (keyed by a common seed,
so nothing but the drafted tokens is communicated). The drafter emits
:math:`x_i = \arg\max \log q_i + G_i`; the verifier computes
:math:`y_i = \arg\max \log p_i + G_i` along the drafted path, accepts while
:math:`x_i = y_i` and emits :math:`y` at the first disagreement (or the bonus
:math:`y_{\gamma+1}`). Each :math:`y_i` is an exact sample of :math:`p_i` given the accepted
prefix, so the rule is lossless whatever the drafter does, it never needs ``q``, and under a
fixed seed the emitted stream is the target's own Gumbel-max stream: it does not depend on the
drafter (:func:`verify_block`, the torch twin). Per position the drafts survive with the
collision probability :func:`match`, between :math:`(1-\mathrm{TV})/(1+\mathrm{TV})` and
:math:`1 - \mathrm{TV}`: drafter invariance costs acceptance against token verification.

:data:`EMIT_DRAFT` is a deliberately broken variant (emits the draft instead of the target's
token at the first disagreement): a negative control.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...dist import validate_count, validate_seed
from ...lm import check_length, check_models, check_noise, gumbel_block
from ..base import Rule
from ..common import require_generator

__all__ = ["match", "acceptance", "joint", "conditional_noise", "verify", "pair",
           "pair_from_noise", "position_gumbels", "verify_block", "tv_bounds", "Gumbel", "RULE",
           "EMIT_DRAFT"]


def _ratio_order(p: np.ndarray, q: np.ndarray) -> list[int]:
    """Tokens holding mass under both laws, by ``p/q`` decreasing (float or Fraction laws)."""
    both = [i for i in range(len(p)) if p[i] != 0 and q[i] != 0]
    if p.dtype != object and q.dtype != object:
        idx = np.asarray(both, dtype=np.int64)
        with np.errstate(over="ignore"):       # p / (subnormal q) is inf: it sorts first
            return idx[np.argsort(-(p[idx] / q[idx]), kind="stable")].tolist()
    return sorted(both, key=lambda i: p[i] / q[i], reverse=True)


def match(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r"""Per-token collision probabilities :math:`c(b) = P(x = y = b)`, O(V log V).

    :math:`c(b) = 1 / \sum_j \max(p_j/p_b, q_j/q_b)
    = p_b q_b / (q_b P_{\ge}(b) + p_b Q_<(b))`, with :math:`P_{\ge}(b)` the ``p``-mass of the
    tokens whose ratio :math:`p_j/q_j` is at least :math:`p_b/q_b` (``q_j = 0`` counts as
    infinite) and :math:`Q_<(b)` the ``q``-mass of the others; 0 where :math:`p_b q_b = 0`.
    A tied ``j`` contributes :math:`p_j/p_b = q_j/q_b` to either sum, so ties may fall on
    either side. Float64 or exact Fraction laws (both of one kind).
    """
    order = _ratio_order(p, q)
    zero = 0 * p[0]
    out = np.array([zero] * len(p), dtype=p.dtype)
    p_hi = sum((p[j] for j in range(len(p)) if q[j] == 0), zero)   # ratio +inf: above all
    q_lo = sum(q[j] for j in order) + sum((q[j] for j in range(len(p)) if p[j] == 0), zero)
    if p.dtype != object:
        idx = np.asarray(order, dtype=np.int64)
        if idx.size:
            ph = p_hi + np.cumsum(p[idx])
            ql = np.maximum(q_lo - np.cumsum(q[idx]), 0.0)
            with np.errstate(over="ignore"):
                out[idx] = p[idx] * q[idx] / (q[idx] * ph + p[idx] * ql)
        return out
    for b in order:
        p_hi, q_lo = p_hi + p[b], q_lo - q[b]
        out[b] = p[b] * q[b] / (q[b] * p_hi + p[b] * q_lo)
    return out


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    r"""Exact collision probability :math:`\sum_b c(b)` (:func:`match`)."""
    return float(match(p, q).sum())


def tv_bounds(p: np.ndarray, q: np.ndarray) -> tuple[float, float]:
    r"""Daliri et al.'s range :math:`[(1-\mathrm{TV})/(1+\mathrm{TV}), 1-\mathrm{TV}]`."""
    t = 0.5 * float(np.abs(p - q).sum())
    return (1.0 - t) / (1.0 + t), 1.0 - t


#: below this, an off-diagonal entry (at most min(q_x, p_y)) is left at 0: its integral's
#: coefficients overflow there, and its mass lies far below any float sum's resolution
_NEGLIGIBLE = 1e-290


def _offdiag(p: np.ndarray, q: np.ndarray, x: int, y: int) -> float:
    if min(q[x], p[y]) < _NEGLIGIBLE:
        return 0.0
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


def joint(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact law ``[V, V]`` of (draft, output) under shared Gumbel noise (module doc)."""
    V = p.size
    J = np.zeros((V, V))
    c = match(p, q)
    # a subnormal q_x or p_x sends its ratios to inf: the integral's range is then empty or
    # infinite, which the pieces below read correctly (the mass is below float resolution)
    with np.errstate(over="ignore", divide="ignore"):
        for x in np.flatnonzero(q > 0):
            for y in np.flatnonzero(p > 0):
                J[x, y] = c[x] if x == y else _offdiag(p, q, int(x), int(y))
    return J


def pair_from_noise(p: np.ndarray, q: np.ndarray, G: np.ndarray) -> tuple[int, int]:
    """Deterministic core of the pair: ``(argmax log q + G, argmax log p + G)``."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(q) + G)), int(np.argmax(np.log(p) + G))


def pair(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """(draft, output) from one shared draw of ``V`` standard Gumbels; no communication."""
    return pair_from_noise(p, q, rng.gumbel(size=p.size))


def conditional_noise(q: np.ndarray, x: int, u: np.ndarray) -> np.ndarray:
    """Gumbel noise ``G`` conditioned on ``argmax(log q + G) = x`` from uniforms ``u`` of
    length ``V + 1`` in (0, 1) (steps 1-3 of the module doc)."""
    M = -np.log(-np.log(u[0]))
    G = -np.log(-np.log(u[1:]))  # unconstrained standard Gumbels (used where q == 0)
    pos = q > 0
    pos[x] = False
    lq = np.log(q[pos])
    Z = -np.logaddexp(-M, -(lq + G[pos]))  # Gumbel(log q_j) truncated below M
    G[pos] = Z - lq
    G[x] = M - np.log(q[x])
    return G


def verify(p: np.ndarray, q: np.ndarray, x: int, u: np.ndarray) -> int:
    """Deterministic core: output given draft ``x`` and ``V + 1`` uniforms in (0, 1)."""
    G = conditional_noise(q, x, u)
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + G))


def position_gumbels(seed: int, positions: Sequence[int], vocab_size: int) -> np.ndarray:
    """Standard Gumbel noise rows keyed by (seed, absolute position): ``[len(positions), V]``.

    Drafter and verifier regenerate the same rows from the shared seed, so a drafter-invariant
    block needs no communication beyond the drafted tokens.
    """
    V = validate_count(vocab_size, "vocab_size")
    seed = validate_seed(seed)
    rows = [np.random.default_rng([seed, validate_seed(n, "positions")]).gumbel(size=V)
            for n in positions]
    return np.stack(rows) if rows else np.empty((0, V))


def _argmax_gumbel(law: np.ndarray, g: np.ndarray) -> int:
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(law) + g))


def verify_block(drafts: np.ndarray, p: np.ndarray, noise: np.ndarray, *,
                 emit_draft: bool = False) -> tuple[int, int, int]:
    """One request's tree (validated ``drafts [k, g]``, ``p [k, g + 1, V]``, finite
    ``noise [g + 1, V]``): ``(accepted, branch, next_token)``.

    The target's Gumbel-max token :math:`y_i` at each offset, read on the lowest survivor's
    law; the survivors are the branches that drafted it. ``emit_draft`` is the negative
    control's bug (it emits the lowest survivor's draft at the first disagreement).
    """
    k, g = drafts.shape
    alive = np.ones(k, dtype=bool)
    for i in range(g + 1):
        ref = int(np.flatnonzero(alive)[0])
        y = _argmax_gumbel(np.asarray(p[ref, i], dtype=np.float64), noise[i])
        if i == g:
            return g, ref, y
        hit = alive & (drafts[:, i] == y)
        if not hit.any():
            return i, ref, int(drafts[ref, i]) if emit_draft else y
        alive = hit
    raise AssertionError("unreachable")


class Gumbel(Rule):
    """Shared-noise Gumbel-max coupling: draft and output are the Gumbel-max samples of ``q``
    and ``p`` under one noise vector."""

    name = "gumbel"
    twin = "coupling.rules.gumbel.torch"
    title = "Gumbel-max coupling (drafter-invariant)"
    reference = "Daliri, Musco, Suresh 2024"
    max_drafts = 1
    drafter_invariant = True
    shared_noise = True
    open_uniforms = True
    bound_text = "in [(1 - TV)/(1 + TV), 1 - TV] (Daliri, Musco, Suresh 2024)"
    #: the negative control's bug (:data:`EMIT_DRAFT`)
    emits_draft = False

    def n_uniforms(self, k: int, V: int) -> int:
        """The conditional noise of the ``V`` tokens and its maximum: ``V + 1`` uniforms."""
        return V + 1

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q)

    def _joint(self, p, q, k, replacement):
        return joint(p, q)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, int(drafts[0]), u)

    def _bound(self, p, q, k, replacement):
        return tv_bounds(p, q)

    def chain_step(self, p, q):
        c = match(p, q)
        return c, p - c

    def verify_block(self, drafts, p, q, noise, *, replacement: bool = True,
                     validate: bool = True) -> tuple[int, int, int]:
        """Verify one request's drafts with the shared noise ``noise [gamma + 1, V]`` (the
        rows of the drafted positions and of the bonus position); ``q`` is only validated
        (``None`` skips it): the output never reads it."""

        d, P, G = check_noise(drafts, p, q, noise, values=validate)
        return verify_block(d, P, G, emit_draft=self.emits_draft)

    def sample_call(self, target: Callable, draft: Callable, gamma: int,
                    rng: np.random.Generator, context: tuple, *, k: int = 1,
                    replacement: bool = True) -> list[int]:

        gamma, _ = check_length(gamma), self.require(k, replacement)
        target, draft, context = check_models(target, draft, context)
        drafts, P, G = gumbel_block(target, draft, gamma, require_generator(rng), context)
        n, _, y = verify_block(drafts[None], P[None], G, emit_draft=self.emits_draft)
        return [int(t) for t in drafts[:n]] + [int(y)]


class EmitDraft(Gumbel):
    """Negative control: emits the draft, not the target's token, at the first disagreement."""

    name = "gumbel_emit_draft"
    title = "broken on purpose: emits the draft at the first disagreement"
    lossless = False
    emits_draft = True
    bound_text = "(broken on purpose: output law != p)"

    def chain_step(self, p, q):
        c = match(p, q)
        return c, q - c

    twin = None  # a negative control has no torch twin


RULE = Gumbel()
#: Deliberately NOT lossless: the harnesses must flag it.
EMIT_DRAFT = EmitDraft()
