r"""``is``: importance-sampling selection, then single-draft speculative sampling (Khisti et al.,
"Multi-Draft Speculative Sampling: Canonical Architectures and Theoretical Limits",
arXiv 2410.18234, ICLR 2025). Registry key ``"is"``; the folder is ``importance`` because
``is`` is a Python keyword (``import coupling.rules.is`` does not parse).

Setting: ``k`` i.i.d. drafts :math:`x = (x_1, \dots, x_k)`, :math:`x_j \sim q`
(``replacement=True``); a drafter samples them as for ``kseq`` or ``rrs``.

Canonical architecture (what :func:`verify` does)
-------------------------------------------------
1. *Selection.* Pick a position ``J`` with probabilities :math:`s_j(x)`; :math:`Y = x_J` has
   the *induced draft law*
   :math:`\tilde q(y) = \sum_x Q(x) \sum_{j : x_j = y} s_j(x)` (:func:`induced_law`).
2. *Speculative sampling of Y against p with proposal* :math:`\tilde q`: output ``Y`` iff
   ``u[k-1] * q~(Y) < p(Y)``, else the inverse-CDF draw with ``u[k]`` from
   :math:`(p - \tilde q)_+`.

Uniforms: ``k + 1``; with ``k >= 2`` the first draft's coin ``u[0]`` selects ``J`` (inverse
CDF over the positions, in order), the last draft's coin ``u[k-1]`` is the acceptance coin
and ``u[k]`` the residual draw (the other coins are not read). With ``k = 1`` nothing is
selected and the rule is the token rule, coin for coin.

Selections (the parameter ``selection``; a variant is an instance,
``ImportanceSampling("optimal")``, not a registry name):

* ``"weighted"`` (the registry's ``is``): :math:`s_j \propto w(x_j)`, :math:`w = p/q`
  (uniform when every weight is 0), the self-normalised importance weights of the drafts. The
  paper's weighted-IS heuristic selects with token weights; its exact weight rule was not
  available here, so ``w = p/q`` is this package's choice.
* ``"optimal"``: read off an optimal membership-cost plan :math:`\pi^\star` over the i.i.d.
  tuples (:func:`coupling.solve_coupling`): position ``j`` of ``x`` gets
  :math:`(\pi^\star(x, x_j)/Q(x) + \rho(x)/|x|) / \#\{i : x_i = x_j\}`, with
  :math:`\rho(x) = 1 - \sum_{y \in x} \pi^\star(x, y)/Q(x)` the plan's rejected share spread
  evenly over the ``|x|`` distinct drafts (any split is optimal).

Claims and their status
-----------------------
* **Lossless** for every selection (derived here: ``Y ~ q~`` exactly, so step 2 is the token
  rule for :math:`(p, \tilde q)`; verified exactly by :func:`coupling.check_rule`).
* **Canonical decomposition: optimal selection attains the optimum** (Khisti et al.; derived
  here and verified exactly): a lossless rule's accepted mass
  :math:`A(y) = \sum_{x \ni y} \pi(x, y) \le p(y)`; selecting ``y`` with probability at least
  :math:`\pi(x, y)/Q(x)` gives :math:`\tilde q \ge A`, so
  :math:`\sum_y \min(p, \tilde q) \ge \alpha(\pi)`. With :math:`\pi^\star` both acceptances below
  equal :math:`\alpha^\star(p, q, k)` (tests: to 1e-12 against the min cut).
* **Weighted selection beats token verification** (derived here, not from the paper): with
  :math:`w = p/q`, :math:`\tilde q(y) = k\,p(y)\,E[1/(w(y) + W)]`, ``W`` a sum of ``k - 1`` i.i.d.
  weights with :math:`E W \le k - 1`; Jensen gives :math:`\tilde q(y) \ge k\,p(y)/(w(y) + k - 1)`,
  which is :math:`\ge p(y)` where :math:`w \le 1` and :math:`\ge q(y)` where :math:`w \ge 1`, so
  :math:`\min(p, \tilde q) \ge \min(p, q)` token by token and
  :math:`\sum \min(p, \tilde q) \ge 1 - \mathrm{TV}(p, q)` (``proofs/is_weighted_bound.py``:
  exhaustively in exact arithmetic).
* **Figure 2 of the paper** (V = 3, two identical drafts): :mod:`.figure2` computes its curves
  exactly.

Two acceptances, both exact
---------------------------
* :func:`selected_acceptance` :math:`= \sum_y \min(p, \tilde q) = 1 - \mathrm{TV}(p, \tilde q)`,
  P(the *selected* draft is accepted), the paper's :math:`\Pr(\mathrm{accept})`;
* :meth:`ImportanceSampling.acceptance`: P(the output is *one of* the drafts), the package's
  membership acceptance (the trace of :func:`joint`): a rejected selection may still emit
  another draft from the residual. At least the former; equal for ``"optimal"``.

Cost: :math:`\tilde q` enumerates the ``V**k`` tuples, O(k V^k) (``"optimal"`` adds one LP over
the draft sets), computed once per ``(p, q, k)`` and cached: exact and lossless on small or
truncated supports; at ``V = 49152`` even ``k = 2`` is out of reach (2.4e9 tuples).
"""

from __future__ import annotations

import functools

import numpy as np

from ...dist import tuple_law
from ...lp.solve import solve_coupling
from ..base import Rule
from ..common import categorical, residual
from ..optimal import optimal_acceptance

__all__ = ["SELECTIONS", "weighted_selection", "optimal_selection", "selection_probs",
           "induced_law", "selected_acceptance", "joint", "membership_acceptance", "verify",
           "decide", "ImportanceSampling", "RULE"]

#: the selection rules (module doc)
SELECTIONS = ("weighted", "optimal")


def weighted_selection(p: np.ndarray, q: np.ndarray, tuples: np.ndarray) -> np.ndarray:
    """``[T, k]`` selection probabilities proportional to ``p/q`` at each draft (uniform where
    every weight is 0), formed in logs so that no ratio overflows."""
    px, qx = p[tuples], q[tuples]
    with np.errstate(divide="ignore", invalid="ignore"):
        lw = np.where((px > 0) & (qx > 0), np.log(px) - np.log(qx), -np.inf)
    top = lw.max(axis=1, keepdims=True)
    w = np.exp(lw - np.where(np.isfinite(top), top, 0.0))
    total = w.sum(axis=1, keepdims=True)
    return np.where(total > 0, w / np.where(total > 0, total, 1.0), 1.0 / tuples.shape[1])


def optimal_selection(p: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """``[V**k, k]`` selection probabilities read off an optimal plan (module doc), rows in
    :func:`coupling.dist.tuple_law` order."""
    c = solve_coupling(p, q, k)
    tuples, probs = c.tuples, c.tuple_probs
    T = tuples.shape[0]
    members = np.zeros((T, p.size), dtype=bool)
    members[np.arange(T)[:, None], tuples] = True
    share = np.divide(c.plan, probs[:, None], out=np.zeros_like(c.plan),
                      where=probs[:, None] > 0)
    share = np.where(members, share, 0.0)
    spread = np.clip(1.0 - share.sum(axis=1), 0.0, None) / members.sum(axis=1)
    beta = np.where(members, share + spread[:, None], 0.0)
    mult = (tuples[:, :, None] == tuples[:, None, :]).sum(axis=2)
    s = np.take_along_axis(beta, tuples, axis=1) / mult
    return s / s.sum(axis=1, keepdims=True)


@functools.lru_cache(maxsize=16)
def _architecture(pb: bytes, qb: bytes, k: int, selection: str) -> tuple[np.ndarray, np.ndarray]:
    """``(s [V**k, k], q~ [V])`` of one ``(p, q, k)``, cached (a sampler reads them every call
    with the same laws; the arrays are read-only)."""
    p, q = np.frombuffer(pb), np.frombuffer(qb)
    tuples, probs = tuple_law(q, k)
    s = weighted_selection(p, q, tuples) if selection == "weighted" \
        else optimal_selection(p, q, k)
    qt = np.bincount(tuples.ravel(), weights=(probs[:, None] * s).ravel(), minlength=p.size)
    for arr in (s, qt):
        arr.flags.writeable = False
    return s, qt


def selection_probs(p: np.ndarray, q: np.ndarray, k: int, selection: str) -> np.ndarray:
    """``[V**k, k]``: the selection probabilities of every i.i.d. tuple (validated laws)."""
    return _architecture(p.tobytes(), q.tobytes(), k, selection)[0]


def induced_law(p: np.ndarray, q: np.ndarray, k: int, selection: str) -> np.ndarray:
    r""":math:`\tilde q`, the law of the selected draft (validated laws; exact, O(k V^k))."""
    return _architecture(p.tobytes(), q.tobytes(), k, selection)[1]


def selected_acceptance(p: np.ndarray, q: np.ndarray, k: int, selection: str) -> float:
    r""":math:`\sum_y \min(p(y), \tilde q(y))`: P(the selected draft is accepted)."""
    return float(np.minimum(p, induced_law(p, q, k, selection)).sum())


def _accept_prob(p: np.ndarray, qt: np.ndarray) -> np.ndarray:
    r""":math:`\min(1, p/\tilde q)` per token (0 where :math:`\tilde q = 0`), no overflow."""
    ok = qt > 0
    return np.where(ok, np.divide(p, qt, out=np.ones_like(p), where=ok & (p < qt)), 0.0)


def joint(p: np.ndarray, q: np.ndarray, k: int, selection: str) -> np.ndarray:
    r"""Exact law ``[V**k, V]`` of (draft tuple, output), rows in ``tuple_law`` order:
    :math:`Q(x) \sum_j s_j(x) [a(x_j) \delta_{x_j} + (1 - a(x_j))\, r]`,
    :math:`a = \min(1, p/\tilde q)`, ``r`` the residual of :math:`(p, \tilde q)`."""
    tuples, probs = tuple_law(q, k)
    s, qt = _architecture(p.tobytes(), q.tobytes(), k, selection)
    a = _accept_prob(p, qt)[tuples]                                 # [T, k]
    mass = probs[:, None] * s                                       # P(x, J = j)
    rows = np.arange(tuples.shape[0])
    J = np.outer((mass * (1.0 - a)).sum(axis=1), residual(p, qt)[0])
    for j in range(k):
        np.add.at(J, (rows, tuples[:, j]), mass[:, j] * a[:, j])
    return J


def membership_acceptance(p: np.ndarray, q: np.ndarray, k: int, selection: str) -> float:
    """P(the output is one of the drafts), the trace of :func:`joint`: the selected draft is
    accepted, or the residual draw lands on one of the drafts."""
    tuples, probs = tuple_law(q, k)
    s, qt = _architecture(p.tobytes(), q.tobytes(), k, selection)
    a = _accept_prob(p, qt)[tuples]
    first = np.ones(tuples.shape, dtype=bool)      # each drafted token counted once
    for j in range(1, k):
        first[:, j] = (tuples[:, :j] != tuples[:, j:j + 1]).all(axis=1)
    on_drafts = (residual(p, qt)[0][tuples] * first).sum(axis=1)   # r(set of x)
    accepted = (s * a).sum(axis=1)
    return float((probs * (accepted + (1.0 - accepted) * on_drafts)).sum())


def verify(p: np.ndarray, qt: np.ndarray, drafts: np.ndarray, s: np.ndarray,
           u: np.ndarray) -> int:
    """Deterministic core: induced law ``qt``, the drafts' selection probabilities ``s [k]`` and
    ``k + 1`` uniforms (module doc: ``u[0]`` selects, ``u[k-1]`` accepts, ``u[k]`` draws)."""
    k = drafts.size
    y = int(drafts[categorical(s, float(u[0]))]) if k > 1 else int(drafts[0])
    if u[k - 1] * qt[y] < p[y]:
        return y
    r, mass = residual(p, qt)
    return y if mass <= 0.0 else categorical(r, float(u[k]))


def decide(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u, selection: str) -> int:
    """One step on validated laws: the drafts' selection probabilities and :math:`\tilde q` from
    the cached architecture of ``(p, q, k)``, then :func:`verify` (the numpy core and the rows
    the torch twin hands back to it)."""
    k = drafts.size
    s, qt = _architecture(p.tobytes(), q.tobytes(), k, selection)
    row = int(np.ravel_multi_index(tuple(int(d) for d in drafts), (p.size,) * k))
    return verify(p, qt, drafts, s[row], np.asarray(u, dtype=np.float64))


class ImportanceSampling(Rule):
    """Select one of ``k`` i.i.d. drafts (importance weights, or an optimal plan's weights),
    then speculative sampling against the selected draft's induced law."""

    name = "is"
    twin = "coupling.rules.importance.torch"
    title = "importance-sampling selection, then speculative sampling"
    reference = "Khisti et al., ICLR 2025 (arXiv 2410.18234)"
    draft_laws = (True,)

    def __init__(self, selection: str = "weighted"):
        if selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {selection!r}")
        self.selection = selection
        self.bound_text = ("= OPT (optimal selection: Khisti et al.'s canonical decomposition)"
                           if selection == "optimal" else
                           ">= 1 - TV (weights p/q, Jensen) and <= OPT")

    def _acceptance(self, p, q, k, replacement):
        return membership_acceptance(p, q, k, self.selection)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k, self.selection)

    def _verify(self, p, q, drafts, u, replacement):
        return decide(p, q, drafts, u, self.selection)

    def selected_acceptance(self, p, q, k: int = 1) -> float:
        """P(the selected draft is accepted), :func:`selected_acceptance` (validated)."""
        pa, qa, k, _ = self.prepare(p, q, k, True)
        return selected_acceptance(pa, qa, k, self.selection)

    def _bound(self, p, q, k, replacement):
        opt = optimal_acceptance(p, q, k, replacement=True)
        return (opt if self.selection == "optimal" else float(np.minimum(p, q).sum())), opt

    def __repr__(self) -> str:
        return f"<rule 'is' ({self.selection} selection): {self.title}>"


RULE = ImportanceSampling()
