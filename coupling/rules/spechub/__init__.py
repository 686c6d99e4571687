r"""``spechub``: the hub draft law with its staged transport plan (Sun, Zhou, Chen, Sun, "SpecHub:
Provable Acceleration to Multi-Draft Speculative Decoding", EMNLP 2024, arXiv 2411.05289).

Source: the algorithm as the authors state it in their code (github.com/MasterGodzilla/
Speculative_decoding_OT: ``sampling_a_and_i`` in ``Sequoia/utils.py`` and the verification
docstring in ``EAGLE/eagle/model/utils.py``), in this package's notation (``p`` target, ``q``
draft); the paper's body was not available here.

Draft law (``k = 2``; what a drafter must do)
---------------------------------------------
The *hub* :math:`a = \arg\max_y q(y)` (ties: the smaller id). Draw :math:`x_1 \sim q`; if
:math:`x_1 \ne a` the second draft is the hub, :math:`x_2 = a`, else
:math:`x_2 \sim q(\cdot \mid \ne a)`. For :math:`i \ne a` the ordered pairs have probabilities

.. math:: Q(i, a) = q_i, \qquad Q(a, i) = c_i = q_a \frac{q_i}{1 - q_a},

so every draft set holds the hub, :math:`\{a, i\}` with mass :math:`m_i = q_i / (1 - q_a)`: a
sparse joint of ``V - 1`` sets. The drafts are distinct (``replacement=False``: in a draft tree
each branch continues as a chain after its first token). :meth:`SpecHub.draft_law` lists the
``2 (V - 1)`` pairs in lexicographic order (rows of probability 0 kept); it needs two tokens
of positive draft probability. ``k = 1`` is one draw from ``q`` and the token rule.

Verifier: a staged fill of the transport plan
---------------------------------------------
1. Rows :math:`(i, a)` send :math:`\min(q_i, p_i)` to ``i``; they keep
   :math:`l^1_i = (q_i - p_i)_+`, the target keeps :math:`p'_i = (p_i - q_i)_+`.
2. Rows :math:`(a, i)` send :math:`\min(c_i, p'_i)` to ``i``; they keep
   :math:`l^2_i = (c_i - p'_i)_+`, the target keeps :math:`p''_i = (p'_i - c_i)_+`.
3. The hub takes the fraction :math:`h_2 = \min(1, p_a / L_2)` of every :math:`l^2_i`
   (:math:`L_2 = \sum_i l^2_i`), leaving :math:`p'_a = (p_a - L_2)_+`, then the fraction
   :math:`h_1 = \min(1, p'_a / L_1)` of every :math:`l^1_i` (:math:`L_1 = \sum_i l^1_i`),
   leaving :math:`p''_a = (p'_a - L_1)_+`.
4. What the rows keep goes to the residual :math:`r = p'' / \sum p''`.

:func:`verify`, with ``u[0]``, ``u[1]`` the coins of ``drafts[0]``, ``drafts[1]`` and ``u[2]``
the emitted-token draw: the non-hub draft ``i`` is tested first with its own coin (row
:math:`(i, a)`: ``u[0] q_i < p_i``; row :math:`(a, i)`: ``u[1] c_i < p'_i``), then the hub
with the other coin (``u[1] L_1 < p'_a``, resp. ``u[0] L_2 < p_a``), then the residual.

Claims and their status
-----------------------
* **Lossless** (derived here: every stage moves equal mass out of rows and into columns, so
  the rows' leftover is the residual's mass; verified exactly by :func:`coupling.check_rule`).
* **Acceptance** (derived here; verified exactly): stages 1-2 give ``i`` the mass
  :math:`\min(p_i, q_i) + \min(c_i, (p_i - q_i)_+) = \min(p_i, m_i)`, and stage 3 gives the hub
  :math:`\min(p_a, L_1 + L_2)` with :math:`L_1 + L_2 = 1 - A`, so

  .. math:: \alpha = \min\big(1,\; p_a + A\big), \qquad A = \sum_{i \ne a} \min(p_i, m_i),

  O(V).
* **Optimal for its draft law** (derived here; verified exactly): a cut holding the hub costs
  at least 1, and for :math:`a \notin H`, :math:`P(\{a, i\} \cap H \ne \emptyset) = m(H)`, so the
  min cut :math:`\min_H p(H^c) + P(S \cap H \ne \emptyset)` equals :math:`\alpha`
  (``proofs/spechub_greedy_law.py``: the plan against that cut, in exact arithmetic).
* **Its set law is the greedy law at k = 2** (derived here; ``proofs/spechub_greedy_law.py``
  symbolically): the hub plus one draw from :math:`q(\cdot \mid \ne a)`, mass :math:`m_i`; only
  the order inside a pair differs. So SpecHub's acceptance equals ``greedy``'s at ``k = 2``, whose
  verifier (one speculative step of the sampled draft against ``m``) is a simpler optimal
  verifier of the same law.
* **Guarantee** :math:`1 - \mathrm{TV}(p, q) \le \alpha` (derived here: :math:`m_i \ge q_i`).
* The paper's "provable acceleration" over SpecInfer does not hold for every pair: exactly,
  ``p = (0, 0, 1)``, ``q = (.4, .4, .2)`` give SpecHub 1/3 < RRS with two i.i.d. drafts 0.36
  (``tests/rules/test_spechub.py``). Its precise theorem statement was not available here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..base import Rule
from ..common import categorical
from ..token import chain_step as token_chain_step
from ..token import joint as token_joint
from ..token import verify as token_verify

__all__ = ["hub", "draft_law", "HubPlan", "hub_plan", "acceptance", "joint", "verify",
           "SpecHub", "RULE"]


def hub(q: np.ndarray) -> int:
    """The hub token: the likeliest draft token, ties broken by the smaller id."""
    return int(np.argmax(q))


def _share(part: float, whole: float) -> float:
    """``min(1, part / whole)`` without a division that could overflow (1 when ``whole`` is 0)."""
    return 1.0 if part >= whole else part / whole


class HubPlan(NamedTuple):
    """The staged plan of one ``(p, q)`` (module doc), computed once per step."""

    hub: int
    c: np.ndarray        # [V] Q(a, i) (0 at the hub)
    p1: np.ndarray       # [V] p'_i = (p_i - q_i)_+ (0 at the hub)
    L1: float            # what the rows (i, a) keep after stage 1
    L2: float            # what the rows (a, i) keep after stage 2
    pa1: float           # p'_a = (p_a - L2)_+
    resid: np.ndarray    # [V] the residual law r


def hub_plan(p: np.ndarray, q: np.ndarray) -> HubPlan:
    """Stages 1-3 of the module doc on validated ``(p, q)`` (``q`` with two positive entries)."""
    a = hub(q)
    off = np.arange(q.size) != a
    rest = float(q[off].sum())          # 1 - q_a, summed over the others: no cancellation
    # q_i / (1 - q_a) <= 1 off the hub; at the hub itself it is not read (and may overflow)
    c = q[a] * np.divide(q, rest, out=np.zeros(q.size), where=off & (rest > 0))
    p1 = np.where(off, np.maximum(p - q, 0.0), 0.0)
    L1 = float(np.where(off, np.maximum(q - p, 0.0), 0.0).sum())
    L2 = float(np.maximum(c - p1, 0.0).sum())
    pa1 = max(float(p[a]) - L2, 0.0)
    pp = np.maximum(p1 - c, 0.0)
    pp[a] = max(pa1 - L1, 0.0)
    z = float(pp.sum())
    return HubPlan(a, c, p1, L1, L2, pa1, pp / z if z > 0 else p.copy())


def draft_law(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(tuples [2 (V - 1), 2], probs)``: the pairs ``(i, a)`` and ``(a, i)``, lexicographic."""
    a = hub(q)
    others = np.flatnonzero(np.arange(q.size) != a)
    first = np.concatenate([others[others < a], np.full(others.size, a), others[others > a]])
    second = np.concatenate([np.full((others < a).sum(), a), others,
                             np.full((others > a).sum(), a)])
    tuples = np.column_stack([first, second]).astype(np.int64)
    rest = float(q[others].sum())
    hub_first = first == a      # (a, i): the draw from q without a; its ratio only where read
    share = np.divide(q[second], rest, out=np.zeros(first.size), where=hub_first & (rest > 0))
    probs = np.where(hub_first, q[a] * share, q[first])
    return tuples, probs


def acceptance(p: np.ndarray, q: np.ndarray) -> float:
    r""":math:`\min(1, p_a + \sum_{i \ne a} \min(p_i, q_i / (1 - q_a)))`."""
    a = hub(q)
    off = np.arange(q.size) != a
    m = q[off] / float(q[off].sum())
    return float(min(1.0, p[a] + np.minimum(p[off], m).sum()))


def joint(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact law ``[2 (V - 1), V]`` of (draft pair, output), rows in :func:`draft_law` order."""
    P = hub_plan(p, q)
    tuples, probs = draft_law(q)
    hub_second = tuples[:, 1] == P.hub
    i = np.where(hub_second, tuples[:, 0], tuples[:, 1])          # the non-hub draft
    sent = np.where(hub_second, np.minimum(q[i], p[i]), np.minimum(P.c[i], P.p1[i]))
    kept = np.maximum(probs - sent, 0.0)
    h = np.where(hub_second, _share(P.pa1, P.L1), _share(p[P.hub], P.L2))
    rows = np.arange(i.size)
    J = np.outer((1.0 - h) * kept, P.resid)
    J[rows, i] += sent
    J[rows, P.hub] += h * kept
    return J


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: np.ndarray,
           plan: HubPlan | None = None) -> int:
    """Deterministic core on validated laws (module doc): ``u[0]``, ``u[1]`` the coins of
    ``drafts[0]``, ``drafts[1]``, ``u[2]`` the emitted-token draw; ``plan`` may be given."""
    P = hub_plan(p, q) if plan is None else plan
    x1, x2 = int(drafts[0]), int(drafts[1])
    if (x1 == P.hub) == (x2 == P.hub):
        raise ValueError(f"drafts {[x1, x2]} are no hub pair: exactly one must be the hub "
                         f"{P.hub} (the likeliest token of q, ties by smaller id)")
    if x2 == P.hub:                            # row (i, a)
        if u[0] * q[x1] < p[x1]:
            return x1
        if u[1] * P.L1 < P.pa1:
            return P.hub
    else:                                      # row (a, i): i with its own coin u[1]
        if u[1] * P.c[x2] < P.p1[x2]:
            return x2
        if u[0] * P.L2 < p[P.hub]:
            return P.hub
    return categorical(P.resid, float(u[2]))


class SpecHub(Rule):
    """Two drafts, one of them the hub (the likeliest draft token), verified by a staged fill of
    the transport plan of that sparse law."""

    name = "spechub"
    twin = "coupling.rules.spechub.torch"
    title = "SpecHub: a hub draft and one sample, staged transport plan"
    reference = "Sun, Zhou, Chen, Sun, EMNLP 2024 (arXiv 2411.05289)"
    max_drafts = 2
    draft_laws = (False,)
    own_draft_law = True
    bound_text = ">= 1 - TV; = OPT of the hub draft law (= the greedy law at k = 2)"

    def _draft_law(self, q, k, replacement):
        return super()._draft_law(q, k, replacement) if k == 1 else draft_law(q)

    def _draw_drafts(self, q, k, replacement, rng):
        if k == 1:
            return super()._draw_drafts(q, k, replacement, rng)
        a = hub(q)
        x1 = categorical(q, float(rng.random()))
        if x1 != a:
            return np.array([x1, a])
        rest = q.copy()
        rest[a] = 0.0
        return np.array([a, categorical(rest, float(rng.random()))])

    def _acceptance(self, p, q, k, replacement):
        return float(np.minimum(p, q).sum()) if k == 1 else acceptance(p, q)

    def _optimum(self, p, q, k, replacement):
        # the staged plan attains its draft law's LP optimum (proofs/spechub_greedy_law.py)
        return self._acceptance(p, q, k, replacement)

    def _joint(self, p, q, k, replacement):
        return token_joint(p, q) if k == 1 else joint(p, q)

    def _verify(self, p, q, drafts, u, replacement):
        if drafts.size == 1:
            return token_verify(p, q, int(drafts[0]), float(u[0]), float(u[1]))
        return verify(p, q, drafts, u)

    def _bound(self, p, q, k, replacement):
        return float(np.minimum(p, q).sum()), self._acceptance(p, q, k, replacement)

    def chain_step(self, p, q):
        return token_chain_step(p, q)


RULE = SpecHub()
