r"""The LP oracle: optimal couplings between draft tuples and the target.

Membership-cost transport
-------------------------
Let :math:`Q` be the law of a tuple :math:`x = (x_1, \dots, x_k)` of drafts from ``q``
(see :func:`coupling.dist.tuple_law`) and ``p`` the target. A verification rule that
outputs a token :math:`y` with law exactly ``p`` is a coupling :math:`\pi` of
:math:`(Q, p)`; it *accepts* when :math:`y \in x`. The best any rule can do is

.. math::

    \alpha^\star(p, q, k) = \max_{\pi \in \Pi(Q, p)} \pi\{y \in x\}
                          = 1 - \min_{\pi \in \Pi(Q, p)} \langle C, \pi \rangle,
    \qquad C(x, y) = \mathbf 1[y \notin x],

an optimal-transport problem with the 0/1 *membership cost* (SpecTr, Sun et al. 2023).
For ``k = 1`` it is the maximal coupling, :math:`\alpha^\star = 1 - \mathrm{TV}(p, q)`.

A *lossy* rule outputs some law :math:`\nu \ne p`; the best acceptance at its distortion
:math:`D = \mathrm{TV}(\nu, p)` is the same LP with the output marginal free inside the TV
ball, :func:`optimal_lossy_acceptance` (the oracle a lossy rule is measured against).

Structure used (all of it exact)
--------------------------------
* The cost of a row depends only on the *set* of distinct tokens in the tuple, so
  tuples with the same set are merged into one row before solving and the plan is
  split back in proportion to their probabilities.
* With a 0/1 cost, transport equals a maximum bipartite flow on the zero-cost edges
  (:math:`y \in x`); the mass left unmatched is paired arbitrarily at cost 1 (the product
  of the leftover marginals). The ``"highs"`` and ``"cvxpy"`` solvers solve that sparse flow
  LP (:func:`coupling.lp.solvers.max_flow`).
* ``"pot"`` (``ot.emd``, network simplex) solves the dense transport problem; it is the
  fastest exact solver here by far.

:func:`solve_transport` is the general transport LP, a thin front over
:func:`coupling.lp.solvers.transport` (validation here; rebalancing, cost normalisation and
status checks there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from ..dist import as_distribution, check_pair, tuple_law, validate_k
from .draftsets import group_by_set, padded_sets
from .plan import cut_plan
from .solvers import (
    SOLVERS,
    SolverError,
    check_solver,
    highs_lp,
    max_flow,
    rebalance,
    transport,
)

__all__ = ["Coupling", "solve_coupling", "solve_draft_law", "solve_sets", "solve_transport",
           "optimal_lossy_acceptance", "SOLVERS", "COUPLING_SOLVERS", "SolverError"]

#: Largest dense plan (draft tuples times vocabulary) an LP here builds: 160 MB of float64.
MAX_PLAN_ENTRIES = 20_000_000

#: :func:`solve_coupling` also takes ``"cut"``: an optimal plan built through the min cut.
COUPLING_SOLVERS = (*SOLVERS, "cut")


@dataclass(frozen=True)
class Coupling:
    """An optimal coupling between ``k`` drafts from ``q`` and the target ``p``.

    Attributes
    ----------
    acceptance : float
        Optimal probability that the output token is one of the drafts.
    plan : ndarray [T, V]
        Transport plan; row ``t`` is draft tuple ``tuples[t]``, column ``y`` the output token.
        Row sums equal ``tuple_probs``, column sums equal ``p``.
    tuples : int64 ndarray [T, k]
        Draft tuples in :func:`coupling.dist.tuple_law` order (:func:`solve_coupling`), or
        the given law's (:func:`solve_draft_law`).
    tuple_probs : ndarray [T]
    solver : str
    status : str
        The solver's own status ("optimal" after the checks passed, with its code).
    """

    acceptance: float
    plan: np.ndarray = field(repr=False)
    tuples: np.ndarray = field(repr=False)
    tuple_probs: np.ndarray = field(repr=False)
    solver: str
    status: str
    k: int = 1
    replacement: bool | None = True  # None: a rule's own draft law (solve_draft_law)


def solve_transport(a: ArrayLike, b: ArrayLike, cost: ArrayLike, *,
                    solver: str = "pot") -> tuple[np.ndarray, float, str]:
    r"""Solve the transport LP :math:`\min_{P \ge 0} \langle C, P\rangle` subject to
    :math:`P\mathbf 1 = a` and :math:`P^\top \mathbf 1 = b`.

    Parameters
    ----------
    a, b : array_like
        Row and column marginals (probability vectors).
    cost : array_like, shape [len(a), len(b)]
        Finite real cost matrix; any offset or scale (optimal plans do not depend on them).
    solver : {"pot", "highs", "cvxpy"}

    Returns
    -------
    plan, value, status

    >>> plan, value, status = solve_transport([0.5, 0.5], [0.5, 0.5], [[0.0, 1.0], [1.0, 0.0]])
    >>> value
    0.0
    """
    check_solver(solver)
    a = as_distribution(a, name="a")
    b = as_distribution(b, name="b")
    C = np.asarray(cost)
    if C.dtype == object or C.dtype.kind not in "biuf":
        raise ValueError(f"cost must be a real numeric array, got dtype {C.dtype}")
    C = C.astype(np.float64)
    if C.shape != (a.size, b.size):
        raise ValueError(f"cost must have shape (len(a), len(b)) = {(a.size, b.size)}, got "
                         f"{C.shape}")
    if not np.isfinite(C).all():
        raise ValueError("cost contains NaN or inf; use a large finite cost for forbidden pairs")
    plan, status = transport(a, b, C, solver)
    return plan, float((C * plan).sum()), status


def solve_sets(p: np.ndarray, q: np.ndarray, k: int, replacement: bool, mass: np.ndarray,
               members: np.ndarray, *, solver: str = "pot") -> tuple[np.ndarray, float, str]:
    """The membership-cost transport over draft *sets* (the core of :func:`solve_coupling`).

    ``members [S, V]`` (bool) and ``mass [S]`` are the law of the set of distinct drafted
    tokens (:mod:`coupling.lp.draftsets`; ``k``, ``replacement`` and ``q`` are only read by
    ``solver="cut"``, for the min cut). ``p`` and ``q`` are validated distributions.
    Returns ``(plan_s [S, V], acceptance, status)``.
    """
    check_solver(solver, COUPLING_SOLVERS)
    mass, pa_bal = rebalance(mass, p)
    if solver != "cut":
        return _solve_members(pa_bal, mass, members, solver)

    cut = cut_plan(pa_bal, q, k, replacement, padded_sets(members), mass)
    plan_s = cut.dense()
    return plan_s, float(plan_s[members].sum()), cut.status


def solve_coupling(p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True,
                   solver: str = "pot") -> Coupling:
    r"""Optimal coupling of ``k`` drafts from ``q`` with the target ``p`` (membership cost).

    Solves :math:`\alpha^\star = \max_{\pi \in \Pi(Q_k, p)} \pi\{y \in x\}` exactly,
    where :math:`Q_k` is the law of ``k`` i.i.d. drafts (``replacement=True``) or of
    ``k`` distinct drafts by successive sampling (``replacement=False``).

    Parameters
    ----------
    p : array_like [V]
        Target distribution.
    q : array_like [V]
        Draft distribution.
    k : int
        Number of drafts.
    replacement : bool
        i.i.d. drafts (True) or distinct drafts without replacement (False).
    solver : {"pot", "highs", "cvxpy", "cut"}
        ``"pot"`` (network simplex on the dense transport problem), ``"highs"`` and
        ``"cvxpy"`` (sparse max-flow LP; cross-checks), ``"cut"`` (an optimal plan built
        through the min cut, :class:`coupling.rules.optimal.CutPlan`: closed forms, POT on a
        part only where they fail; fastest, and what the ``optimal`` rule samples).

    Returns
    -------
    Coupling
        ``acceptance`` is the optimum; ``plan`` rows follow :func:`coupling.dist.tuple_law`.

    Raises
    ------
    ValueError
        Invalid distributions, mismatched vocabularies, bad ``k``/``solver``, or an
        enumeration too large to build (use :func:`coupling.optimal_acceptance`).
    SolverError
        The solver did not certify optimality.

    >>> c = solve_coupling([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], k=2)
    >>> round(c.acceptance, 6), c.plan.shape
    (0.84, (9, 3))
    """
    check_solver(solver, COUPLING_SOLVERS)
    pa, qa = check_pair(p, q)
    k = validate_k(k)
    tuples, probs = tuple_law(qa, k, replacement=replacement)
    _check_plan_size(tuples.shape[0], pa.size)
    set_index, mass, members = group_by_set(tuples, probs, pa.size)
    plan_s, acceptance, status = solve_sets(pa, qa, k, replacement, mass, members, solver=solver)
    return _on_tuples(plan_s, acceptance, status, tuples, probs, set_index, mass, solver,
                      replacement)


def solve_draft_law(p: ArrayLike, tuples: ArrayLike, probs: ArrayLike, *,
                    solver: str = "pot") -> Coupling:
    r"""The membership-cost optimum over any law of draft tuples: the LP oracle of a rule whose
    drafts are not i.i.d. or successive samples of ``q`` (e.g. the greedy draft law, whose
    ``k - 1`` first drafts are deterministic), :meth:`coupling.rules.base.Rule.optimum`.

    Solves :math:`\max_{\pi \in \Pi(Q, p)} \pi\{y \in x\}` with ``Q`` the law that puts
    ``probs[t]`` on ``tuples[t]``; tuples with the same set of tokens are merged first
    (:func:`coupling.lp.draftsets.group_by_set`).

    Parameters
    ----------
    p : array_like [V]
        Target distribution.
    tuples : int array_like [T, k]
        Draft tuples, token ids in ``[0, V)``.
    probs : array_like [T]
        Their probabilities (a distribution; zero rows are allowed).
    solver : {"pot", "highs", "cvxpy"}
        The min-cut plan (``"cut"``) is built for i.i.d. and successive drafts only.

    Returns
    -------
    Coupling
        ``plan`` rows follow ``tuples``; ``k`` is ``tuples.shape[1]``; ``replacement`` is
        ``None`` (the law is given, not drawn by one of the two rules).

    >>> c = solve_draft_law([0.5, 0.3, 0.2], [[0, 1], [0, 2]], [0.5, 0.5])
    >>> round(c.acceptance, 6)
    1.0
    """
    check_solver(solver, SOLVERS)
    pa = as_distribution(p, name="p")
    probs_a = as_distribution(probs, name="probs")
    t = np.asarray(tuples)
    if t.dtype.kind not in "iu" or t.ndim != 2 or t.shape[0] != probs_a.size or t.shape[1] < 1:
        raise ValueError(f"tuples must be an integer array [T, k] with T = len(probs) = "
                         f"{probs_a.size} rows of token ids, got shape {t.shape} of dtype "
                         f"{t.dtype}")
    if (t < 0).any() or (t >= pa.size).any():
        raise ValueError(f"tuples has token ids outside [0, V) = [0, {pa.size})")
    t = t.astype(np.int64)
    _check_plan_size(t.shape[0], pa.size)
    set_index, mass, members = group_by_set(t, probs_a, pa.size)
    mass, pa_bal = rebalance(mass, pa)
    plan_s, acceptance, status = _solve_members(pa_bal, mass, members, solver)
    return _on_tuples(plan_s, acceptance, status, t, probs_a, set_index, mass, solver, None)


def _check_plan_size(T: int, V: int) -> None:
    if T * V > MAX_PLAN_ENTRIES:
        raise ValueError(f"the exact plan has {T} draft tuples x {V} tokens = {T * V:.3g} "
                         f"entries, above {MAX_PLAN_ENTRIES:.3g}; use the closed forms "
                         "(coupling.optimal_acceptance, Rule.optimum) at this size")


def _solve_members(p: np.ndarray, mass: np.ndarray, members: np.ndarray,
                   solver: str) -> tuple[np.ndarray, float, str]:
    """The membership-cost transport from set masses to ``p`` (both balanced) by LP."""
    if solver == "pot":
        plan_s, status = transport(mass, p, (~members).astype(np.float64), "pot")
        return plan_s, float(plan_s[members].sum()), status
    return max_flow(mass, p, members, solver)


def _on_tuples(plan_s, acceptance, status, tuples, probs, set_index, mass, solver,
               replacement) -> Coupling:
    """Split each set's row of the plan back over its tuples, in proportion to their
    probabilities."""
    share = np.divide(probs, mass[set_index], out=np.zeros_like(probs), where=mass[set_index] > 0)
    plan = plan_s[set_index] * share[:, None]
    return Coupling(acceptance=min(1.0, max(0.0, acceptance)), plan=plan, tuples=tuples,
                    tuple_probs=probs, solver=solver, status=status, k=int(tuples.shape[1]),
                    replacement=replacement)


def optimal_lossy_acceptance(p: ArrayLike, q: ArrayLike, k: int = 1, *, distortion: float,
                             replacement: bool = True) -> float:
    r"""Best acceptance of any coupling of ``k`` drafts from ``q`` whose output law
    :math:`\nu` lies within ``distortion`` of ``p`` in total variation.

    .. math::

        \alpha^\star_D = \max \{\pi\{y \in x\} : \pi \in \Pi(Q_k, \nu),\
                         \mathrm{TV}(\nu, p) \le D\},

    the optimum a lossy rule of distortion ``D`` is compared with (``D = 0``: the lossless
    optimum of :func:`solve_coupling`). Over draft sets ``s`` (mass :math:`m_s`) the LP has a
    flow :math:`f_{s,y}` on every membership edge (``y`` in ``s``), the unmatched output mass
    :math:`g_y \ge 0`, and :math:`a_y, b_y \ge 0` with
    :math:`\sum_{s \ni y} f_{s,y} + g_y - p_y = a_y - b_y`,
    :math:`\sum_y (a_y + b_y) \le 2D`, :math:`\sum_y f_{s,y} \le m_s`,
    :math:`\sum f + \sum g = 1`; it maximises :math:`\sum f`. Leaving the unmatched mass's
    output free loses nothing: any placement of it is a coupling whose acceptance is at
    least :math:`\sum f`. Solved by HiGHS (:func:`coupling.lp.solvers.highs_lp`, status
    checked); enumerates the set law, so small ``V``.
    """
    pa, qa = check_pair(p, q)
    k = validate_k(k)
    if isinstance(distortion, bool) or not isinstance(distortion, (int, float, np.floating)) \
            or not np.isfinite(distortion) or distortion < 0:
        raise ValueError(f"distortion must be a finite number >= 0 (a total-variation "
                         f"distance), got {distortion!r}")
    tuples, probs = tuple_law(qa, k, replacement=replacement)
    V = pa.size
    _, mass, members = group_by_set(tuples, probs, V)
    mass, pa = rebalance(mass, pa)
    S = mass.size
    set_of, token_of = np.nonzero(members)                     # the membership edges
    E = set_of.size
    n = E + 3 * V + S + 1                                      # f, g, a, b, set slacks, D slack
    rows = [set_of, S + token_of, np.full(E, S + V), np.arange(S), S + np.arange(V),
            np.full(V, S + V), S + np.arange(V), np.full(V, S + V + 1), S + np.arange(V),
            np.full(V, S + V + 1), np.array([S + V + 1])]
    cols = [np.arange(E), np.arange(E), np.arange(E), E + 3 * V + np.arange(S),
            E + np.arange(V), E + np.arange(V), E + V + np.arange(V), E + V + np.arange(V),
            E + 2 * V + np.arange(V), E + 2 * V + np.arange(V), np.array([n - 1])]
    vals = [np.ones(E), np.ones(E), np.ones(E), np.ones(S), np.ones(V), np.ones(V), -np.ones(V),
            np.ones(V), np.ones(V), np.ones(V), np.ones(1)]
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(S + V + 2, n))
    b = np.concatenate([mass, pa, [1.0, 2.0 * min(float(distortion), 1.0)]])
    c = np.zeros(n)
    c[:E] = -1.0
    x, _ = highs_lp(c, A, b, what="lossy coupling LP")
    return float(min(1.0, max(0.0, x[:E].sum())))
