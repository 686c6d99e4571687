r"""``greedy``: the greedy multi-draft law and its optimal verifier (Hu et al., "Towards Optimal
Multi-draft Speculative Decoding", ICLR 2025, arXiv 2502.18779).

Draft law (what a drafter must do)
----------------------------------
Let :math:`T = (t_1, \dots, t_{k-1})` be the ``k - 1`` likeliest tokens of ``q`` in decreasing
order (ties broken by the smaller token id) and :math:`T^c` the other tokens. The drafts are

.. math:: (t_1, \dots, t_{k-1}, x), \qquad x \sim g = \frac{q\,\mathbf 1_{T^c}}{q(T^c)},

``k - 1`` deterministic drafts and one draw from ``q`` restricted to the tokens not already
drafted, so the ``k`` drafts are distinct (``replacement=False``: in a draft tree each branch
continues as a chain after its first token). A drafter takes the top ``k - 1`` tokens of its
law and samples the last first token from the rest, in this order: branch ``k - 1`` holds the
sampled token. ``k = 1`` is one draw from ``q``. :meth:`Greedy.draft_law` enumerates the
``V - k + 1`` tuples, ``x`` increasing (rows of probability 0 kept); it needs ``k`` tokens of
positive draft probability.

Verifier (what :func:`verify` does)
-----------------------------------
Speculative sampling of the sampled draft against ``p`` with its own law ``g`` as proposal:
output ``x`` iff ``u[k-1] * g(x) < p(x)``; otherwise the inverse-CDF draw with ``u[k]`` from
:math:`r = (p - g)_+ / \sum (p - g)_+`. The coins ``u[0..k-2]`` of the deterministic drafts are
not read. As ``g = 0`` on ``T``, the residual keeps all of ``p`` on the top tokens: an output
there is a draft, hence accepted. The verifier reads ``T`` from the first ``k - 1`` drafts and
checks that they are *a* set of ``k - 1`` likeliest tokens of ``q``; it is lossless for any
tie-break that depends on ``q`` alone (given ``T``, ``x ~ g_T``), while the exact laws below use
the smaller-id tie-break.

Claims and their status
-----------------------
* **Lossless** (derived here: the token rule for the pair ``(p, g)``; verified exactly by
  :func:`coupling.check_rule`, TV < 1e-12).
* **Acceptance** (derived here; verified exactly, = the trace of :func:`joint`):

  .. math:: \alpha = p(T) + \sum_{y \notin T} \min(p(y), g(y)),

  since a rejected ``x`` has residual mass 0 at ``x``. One partial sort, O(V).
* **Optimal for its draft law** (stated by Hu et al.; derived here and verified exactly): by
  max-flow/min-cut the best lossless acceptance over the greedy *set* law
  :math:`S = T \cup \{x\}` is :math:`\min_H p(H^c) + P(S \cap H \ne \emptyset)`. A cut meeting
  ``T`` costs at least 1; for :math:`H \subseteq T^c`, :math:`P(S \cap H \ne \emptyset) = g(H)`,
  so the minimum is attained by :math:`H = \{y \notin T : g(y) \le p(y)\}` and equals
  :math:`\alpha`. ``proofs/greedy_optimal.py`` checks the verifier's plan against this cut in
  exact rational arithmetic (every instance of a grid), and :meth:`Rule.optimum` (the LP over
  :meth:`draft_law`) agrees in the tests.
* **Guarantee** :math:`1 - \mathrm{TV}(p, q) \le \alpha` (derived here: :math:`g \ge q` on
  :math:`T^c` and :math:`p \ge \min(p, q)` on ``T``), with equality at ``k = 1`` (the token
  rule).
* **Why the last draft avoids the top tokens** (derived here): drawing it from ``q`` itself
  gives the acceptance :math:`p(T) + \sum_{y \notin T} \min(p, q)`, never more, since
  :math:`g \ge q` off ``T`` (``proofs/greedy_optimal.py``), and it could repeat a top token,
  which leaves two branches on one prefix. Only the distinct law is offered.
* No draft law dominates another: on some laws the greedy law beats the optimum of ``k``
  i.i.d. or distinct draws, on others it loses (``python benchmarks/compare_multidraft.py``).

Whether Hu et al.'s own verifier is this one is not checked (their text was not available
here); every verifier that attains the optimum of the law has this acceptance.
"""

from __future__ import annotations

import numpy as np

from ..base import Rule
from ..common import categorical, residual
from ..token import chain_step as token_chain_step
from ..token import joint as token_joint
from ..token import verify as token_verify

__all__ = ["top_tokens", "last_draft_law", "draft_law", "acceptance", "joint", "verify",
           "Greedy", "RULE"]


def top_tokens(q: np.ndarray, k: int) -> np.ndarray:
    """The ``k - 1`` deterministic drafts: the likeliest tokens of ``q``, ties by smaller id."""
    return np.argsort(-q, kind="stable")[: k - 1].astype(np.int64)


def last_draft_law(q: np.ndarray, top: np.ndarray) -> np.ndarray:
    r"""``g``: ``q`` on the tokens outside ``top``, renormalised by their own sum (``1 - q(T)``
    would cancel when ``T`` holds almost all the mass)."""
    g = q.copy()
    g[top] = 0.0
    return g / g.sum()


def draft_law(q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tuples [V - k + 1, k], probs)``: rows ``(t_1, ..., t_{k-1}, x)``, ``x`` increasing over
    the tokens outside the top ``k - 1`` (validated ``q`` with ``k`` positive entries)."""
    top = top_tokens(q, k)
    rest = np.setdiff1d(np.arange(q.size), top)
    tuples = np.column_stack([np.broadcast_to(top, (rest.size, k - 1)), rest])
    return tuples.astype(np.int64), last_draft_law(q, top)[rest]


def acceptance(p: np.ndarray, q: np.ndarray, k: int) -> float:
    r""":math:`p(T) + \sum_{y \notin T} \min(p(y), g(y))`."""
    top = top_tokens(q, k)
    g = last_draft_law(q, top)
    off = np.ones(p.size, dtype=bool)
    off[top] = False
    return float(p[top].sum() + np.minimum(p, g)[off].sum())


def joint(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    r"""Exact law ``[V - k + 1, V]`` of (draft tuple, output), rows in :func:`draft_law` order:
    the row of ``x`` is the token rule's row for ``(p, g)``,
    :math:`\min(p(x), g(x))\,\delta_x + (g(x) - p(x))_+\, r`."""
    tuples, _ = draft_law(q, k)
    g = last_draft_law(q, tuples[0, :-1])
    return token_joint(p, g)[tuples[:, -1]]


def is_top_set(q: np.ndarray, top: np.ndarray) -> bool:
    """Whether ``top`` lists distinct tokens that are *a* set of ``len(top)`` likeliest tokens of
    ``q`` (any tie-break)."""
    if np.unique(top).size != top.size:
        return False
    rest = np.ones(q.size, dtype=bool)
    rest[top] = False
    return not top.size or not rest.any() or q[top].min() >= q[rest].max()


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u_accept: float,
           u_resid: float) -> int:
    """Deterministic core on validated laws: ``drafts = (t_1, ..., t_{k-1}, x)``, the coin
    ``u_accept`` of ``x`` and the residual draw ``u_resid``."""
    top, x = drafts[:-1], int(drafts[-1])
    if not is_top_set(q, top) or x in top:
        raise ValueError(f"drafts {drafts.tolist()} are no greedy draft tuple: the first "
                         f"{top.size} must be likeliest tokens of q (e.g. "
                         f"{top_tokens(q, drafts.size).tolist()}) and the last one another token")
    g = last_draft_law(q, top)
    if u_accept * g[x] < p[x]:
        return x
    r, mass = residual(p, g)
    return x if mass <= 0.0 else categorical(r, u_resid)


class Greedy(Rule):
    """The greedy draft law (top ``k - 1`` tokens of ``q`` and one draw from the rest) with the
    verifier that attains its LP optimum."""

    name = "greedy"
    twin = "coupling.rules.greedy.torch"
    title = "greedy drafts (top k-1 tokens + one sample) with their optimal verifier"
    reference = "Hu et al., ICLR 2025 (arXiv 2502.18779)"
    draft_laws = (False,)
    own_draft_law = True
    attains_optimum = True
    bound_text = ">= 1 - TV; = OPT of the greedy draft law (Hu et al. 2025)"

    def _draft_law(self, q, k, replacement):
        return draft_law(q, k)

    def _draw_drafts(self, q, k, replacement, rng):
        top = top_tokens(q, k)
        x = categorical(last_draft_law(q, top), float(rng.random()))
        return np.append(top, x)

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k)

    def _optimum(self, p, q, k, replacement):
        # the verifier attains its draft law's LP optimum (proofs/greedy_optimal.py)
        return acceptance(p, q, k)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k)

    def _verify(self, p, q, drafts, u, replacement):
        if drafts.size == 1:
            return token_verify(p, q, int(drafts[0]), float(u[0]), float(u[1]))
        return verify(p, q, drafts, float(u[-2]), float(u[-1]))

    def _bound(self, p, q, k, replacement):
        return float(np.minimum(p, q).sum()), acceptance(p, q, k)

    def chain_step(self, p, q):
        return token_chain_step(p, q)


RULE = Greedy()
