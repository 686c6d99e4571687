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

Structure used (all of it exact)
--------------------------------
* The cost of a row depends only on the *set* of distinct tokens in the tuple, so
  tuples with the same set are merged into one row before solving and the plan is
  split back in proportion to their probabilities.
* With a 0/1 cost, transport equals a maximum bipartite flow on the zero-cost edges
  (:math:`y \in x`); the mass left unmatched is paired arbitrarily at cost 1 (we use
  the product of the leftover marginals). The ``"highs"`` and ``"cvxpy"`` solvers
  solve that sparse flow LP (``sum_{s} |s|`` variables instead of ``|S| * V``) with
  inequality constraints, which cannot turn infeasible through rounding.
* ``"pot"`` (``ot.emd``, network simplex) solves the dense transport problem; it is the
  fastest exact solver here by far.

:func:`solve_transport` is the general dense/sparse transport LP used by other
modules (e.g. the block-level LP in :mod:`coupling.block`). Its equality-constrained
HiGHS form drops the one redundant row and rebalances the marginals first: two
marginals whose sums differ by rounding (4e-16) otherwise make HiGHS report a
feasible problem "infeasible".
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike
from scipy.optimize import linprog

from .dist import as_distribution, check_pair, tuple_law, validate_k

__all__ = ["Coupling", "solve_coupling", "solve_sets", "solve_transport", "SOLVERS",
           "COUPLING_SOLVERS", "SolverError"]

SOLVERS = ("pot", "highs", "cvxpy")
#: :func:`solve_coupling` also takes ``"cut"``: an optimal plan built through the min cut.
COUPLING_SOLVERS = (*SOLVERS, "cut")

# HiGHS's default feasibility tolerances (1e-7) left the flow LP's optimum 8e-8 short of the
# simplex answer; the oracle promises agreement to 1e-8, so run its dual simplex tighter.
_HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


class SolverError(RuntimeError):
    """An LP solver did not certify an optimal solution."""


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
        Draft tuples in :func:`coupling.dist.tuple_law` order.
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
    replacement: bool = True


def _check_solver(solver: str, allowed: tuple[str, ...] = SOLVERS) -> str:
    if solver not in allowed:
        raise ValueError(f"solver must be one of {allowed}, got {solver!r}")
    return solver


def _rebalance(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Make two marginals sum to exactly the same float (both to 1 up to one ulp).

    The difference is moved onto the largest entry of ``b``, where it is relatively
    smallest.
    """
    a = np.clip(a, 0.0, None)
    b = np.clip(b, 0.0, None)
    a = a / a.sum()
    b = b / b.sum()
    j = int(np.argmax(b))
    b[j] += a.sum() - b.sum()
    return a, b


# --------------------------------------------------------------------------------------
# General transport LP
# --------------------------------------------------------------------------------------


def _emd(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    import ot  # POT

    n, m = cost.shape
    # POT's default limit (1e5) stops early on large problems and only *warns*:
    # raise it, and turn its warnings into errors below.
    max_iter = int(max(1_000_000, 50 * (n + m) * min(n, m)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, log = ot.emd(a, b, np.ascontiguousarray(cost), numItermax=max_iter, log=True)
    code = int(log.get("result_code", -1))
    msgs = [
        str(w.message)
        for w in caught
        if "numItermax" in str(w.message) or "emd" in str(w.message).lower()
    ]
    if code != 1 or msgs:
        raise SolverError(
            f"POT ot.emd did not reach an optimal solution (result_code={code}, "
            f"warning={msgs[:1]}, message={log.get('warning')!r})"
        )
    return np.asarray(plan, dtype=np.float64), f"optimal (POT result_code={code})"


def _transport_highs(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    n, m = cost.shape
    rows = sp.kron(sp.eye(n, format="csr"), np.ones((1, m)), format="csr")  # sum_j P_ij = a_i
    cols = sp.kron(np.ones((1, n)), sp.eye(m, format="csr"), format="csr")  # sum_i P_ij = b_j
    # one equality row is implied by the others (total mass): drop it
    A = sp.vstack([rows, cols[:-1]], format="csr")
    rhs = np.concatenate([a, b[:-1]])
    res = linprog(
        cost.ravel(),
        A_eq=A,
        b_eq=rhs,
        bounds=(0, None),
        method="highs-ds",
        options=_HIGHS_OPTIONS,
    )
    if res.status != 0:
        raise SolverError(f"HiGHS transport LP failed: status={res.status} ({res.message})")
    return np.clip(res.x.reshape(n, m), 0.0, None), f"optimal (HiGHS status={res.status})"


def _transport_cvxpy(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    import cvxpy as cp

    n, m = cost.shape
    P = cp.Variable((n, m), nonneg=True)
    prob = cp.Problem(
        cp.Minimize(cp.sum(cp.multiply(cost, P))),
        [cp.sum(P, axis=1) == a, cp.sum(P[:, :-1], axis=0) == b[:-1]],
    )
    status = _cvxpy_solve(prob)
    return np.clip(np.asarray(P.value), 0.0, None), status


def _cvxpy_solve(prob) -> str:
    """Solve with cvxpy's default LP solver (Clarabel) at tight tolerances.

    An interior-point method may stop at "optimal_inaccurate" on larger instances; then
    the same model is handed to cvxpy's HiGHS interface. Anything else is an error.
    """
    import cvxpy as cp

    installed = cp.installed_solvers()
    attempts = []
    if "CLARABEL" in installed:
        # tight tolerances: the oracle's answers must agree with the simplex to 1e-8
        attempts.append(
            ("CLARABEL", dict(tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10, max_iter=500))
        )
    if "HIGHS" in installed:
        attempts.append(
            (
                "HIGHS",
                dict(
                    primal_feasibility_tolerance=1e-10,
                    dual_feasibility_tolerance=1e-10,
                    output_flag=False,
                ),
            )
        )
    if not attempts:
        attempts.append((None, {}))
    tried = []
    for solver, opts in attempts:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "may be inaccurate": status decides
                prob.solve(solver=solver, **opts)
        except (cp.error.SolverError, ValueError) as exc:   # ValueError: "Cannot unpack
            tried.append(f"{solver}: {exc}")                 # invalid solution" and kin
            continue
        if prob.status == cp.OPTIMAL:
            name = prob.solver_stats.solver_name if prob.solver_stats else str(solver)
            return f"optimal (cvxpy/{name} status={prob.status})"
        tried.append(f"{solver}: status={prob.status}")
    raise SolverError(f"cvxpy did not certify optimality: {'; '.join(tried)}")


def solve_transport(
    a: ArrayLike, b: ArrayLike, cost: ArrayLike, *, solver: str = "pot"
) -> tuple[np.ndarray, float, str]:
    r"""Solve the transport LP :math:`\min_{P \ge 0} \langle C, P\rangle`.

    Subject to :math:`P\mathbf 1 = a` and :math:`P^\top \mathbf 1 = b`.

    Parameters
    ----------
    a, b : array_like
        Row and column marginals (probability vectors; validated and rebalanced so
        their sums agree exactly).
    cost : array_like, shape [len(a), len(b)]
        Finite cost matrix.
    solver : {"pot", "highs", "cvxpy"}

    Returns
    -------
    plan, value, status
    """
    _check_solver(solver)
    a = as_distribution(a, name="a")
    b = as_distribution(b, name="b")
    C = np.asarray(cost)
    if np.iscomplexobj(C):   # a cast would drop the imaginary part with only a warning
        raise ValueError("cost must be real; got a complex array")
    C = C.astype(np.float64)
    if C.shape != (a.size, b.size):
        raise ValueError(
            f"cost must have shape (len(a), len(b)) = {(a.size, b.size)}, got {C.shape}"
        )
    if not np.isfinite(C).all():
        raise ValueError("cost contains NaN or inf; use a large finite cost for forbidden pairs")
    a, b = _rebalance(a, b)
    # HiGHS reads a cost of magnitude >= 1e20 as infinite: huge costs are scaled down for the
    # LP solvers (a positive scale leaves the optimal plans unchanged), never for POT
    top = float(np.abs(C).max()) if C.size else 0.0
    C_lp = C / top if top > 1e12 else C
    if solver == "pot":
        plan, status = _emd(a, b, C)
    elif solver == "highs":
        plan, status = _transport_highs(a, b, C_lp)
    else:
        plan, status = _transport_cvxpy(a, b, C_lp)
    return plan, float((C * plan).sum()), status


# --------------------------------------------------------------------------------------
# Membership-cost coupling of k drafts
# --------------------------------------------------------------------------------------


def _group_by_set(tuples: np.ndarray, probs: np.ndarray, V: int):
    """Merge tuples with the same set of distinct tokens.

    Returns ``(set_index [T], set_mass [S], members)`` where ``members`` is a boolean
    matrix [S, V] with ``members[s, y] = y in set s``.
    """
    T = tuples.shape[0]
    member = np.zeros((T, V), dtype=bool)
    member[np.arange(T)[:, None], tuples] = True
    # One opaque key per row (its bits packed, column 0 first) instead of np.unique(axis=0)
    # on booleans: the same sets in the same (lexicographic) order, 10-100x faster, which is
    # most of the optimal rule's per-call cost on real laws.
    packed = np.ascontiguousarray(np.packbits(member, axis=1))
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, set_index = np.unique(keys, return_index=True, return_inverse=True)
    uniq = member[first]
    set_index = set_index.reshape(-1)
    mass = np.bincount(set_index, weights=probs, minlength=uniq.shape[0])
    return set_index, mass, uniq


def _flow_lp(mass: np.ndarray, p: np.ndarray, members: np.ndarray, solver: str):
    """Max flow on membership edges: max sum f_e, row sums <= mass, column sums <= p."""
    S, V = members.shape
    s_idx, y_idx = np.nonzero(members)
    E = s_idx.size
    A_row = sp.csr_matrix((np.ones(E), (s_idx, np.arange(E))), shape=(S, E))
    A_col = sp.csr_matrix((np.ones(E), (y_idx, np.arange(E))), shape=(V, E))
    if solver == "highs":
        res = linprog(
            -np.ones(E),
            A_ub=sp.vstack([A_row, A_col], format="csr"),
            b_ub=np.concatenate([mass, p]),
            bounds=(0, None),
            method="highs-ds",
            options=_HIGHS_OPTIONS,
        )
        if res.status != 0:
            raise SolverError(f"HiGHS flow LP failed: status={res.status} ({res.message})")
        f = res.x
        status = f"optimal (HiGHS status={res.status})"
    else:
        import cvxpy as cp

        x = cp.Variable(E, nonneg=True)
        prob = cp.Problem(cp.Maximize(cp.sum(x)), [A_row @ x <= mass, A_col @ x <= p])
        status = _cvxpy_solve(prob)
        f = np.asarray(x.value)
    f = np.clip(f, 0.0, None)
    # an interior-point answer may overshoot a capacity by ~1e-12: scale back into the box
    for A, cap in ((A_row, mass), (A_col, p)):
        load = A @ f
        over = load > cap
        if over.any():
            scale = np.ones_like(load)
            scale[over] = np.divide(
                cap[over], load[over], out=np.zeros(over.sum()), where=load[over] > 0
            )
            f = _scale_edges(f, A, scale)
    plan = np.zeros((S, V))
    plan[s_idx, y_idx] = f
    # complete the unmatched mass at cost 1 with the product of the leftovers
    ra = np.clip(mass - plan.sum(axis=1), 0.0, None)
    rb = np.clip(p - plan.sum(axis=0), 0.0, None)
    left = 0.5 * (ra.sum() + rb.sum())
    if left > 0 and ra.sum() > 0 and rb.sum() > 0:
        plan += np.outer(ra / ra.sum(), rb / rb.sum()) * left
    return plan, float(f.sum()), status


def _scale_edges(f: np.ndarray, A: sp.csr_matrix, scale: np.ndarray) -> np.ndarray:
    """Multiply each edge flow by the scale of the (unique) row of ``A`` it belongs to."""
    owner = np.asarray(A.argmax(axis=0)).ravel()  # each column of A has exactly one 1
    return f * scale[owner]


def padded_sets(members: np.ndarray) -> np.ndarray:
    """``[S, m]`` token lists of the sets in ``members [S, V]`` (``-1`` pads, ``m`` the largest
    set), the form :func:`coupling.optimal.cut_plan` reads."""
    rows, cols = np.nonzero(members)
    n = members.sum(axis=1)
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    out = np.full((members.shape[0], max(int(n.max(initial=0)), 1)), -1, dtype=np.int64)
    out[rows, np.arange(rows.size) - start[rows]] = cols
    return out


def solve_sets(
    p: np.ndarray,
    q: np.ndarray,
    k: int,
    replacement: bool,
    mass: np.ndarray,
    members: np.ndarray,
    *,
    solver: str = "pot",
) -> tuple[np.ndarray, float, str]:
    """The membership-cost transport over draft *sets* (the core of :func:`solve_coupling`).

    ``members [S, V]`` (bool) and ``mass [S]`` are the law of the set of distinct drafted
    tokens (any order of the sets; ``k``, ``replacement`` and ``q`` are only read by
    ``solver="cut"``, for the min cut). ``p`` and ``q`` are validated distributions.
    Returns ``(plan_s [S, V], acceptance, status)``.
    """
    _check_solver(solver, COUPLING_SOLVERS)
    mass, pa_bal = _rebalance(mass, p)
    if solver == "cut":
        from .optimal import cut_plan

        cut = cut_plan(pa_bal, q, k, replacement, padded_sets(members), mass)
        plan_s, status = cut.dense(), cut.status
    elif solver == "pot":
        plan_s, status = _emd(mass, pa_bal, (~members).astype(np.float64))
    else:
        return _flow_lp(mass, pa_bal, members, solver)
    return plan_s, float(plan_s[members].sum()), status


def solve_coupling(
    p: ArrayLike,
    q: ArrayLike,
    k: int = 1,
    *,
    replacement: bool = True,
    solver: str = "pot",
) -> Coupling:
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
        ``"pot"`` (network simplex on the dense transport problem),
        ``"highs"`` and ``"cvxpy"`` (sparse max-flow LP; cross-checks), ``"cut"`` (an optimal plan
        built through the min cut, :func:`coupling.optimal.cut_plan`: closed forms, POT on a
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
    """
    _check_solver(solver, COUPLING_SOLVERS)
    pa, qa = check_pair(p, q)
    k = validate_k(k)
    tuples, probs = tuple_law(qa, k, replacement=replacement)
    V = pa.size
    set_index, mass, members = _group_by_set(tuples, probs, V)
    plan_s, acceptance, status = solve_sets(pa, qa, k, replacement, mass, members, solver=solver)
    # split each set's row back over its tuples, in proportion to their probabilities
    share = np.divide(probs, mass[set_index], out=np.zeros_like(probs), where=mass[set_index] > 0)
    plan = plan_s[set_index] * share[:, None]
    return Coupling(
        acceptance=min(1.0, max(0.0, acceptance)),
        plan=plan,
        tuples=tuples,
        tuple_probs=probs,
        solver=solver,
        status=status,
        k=k,
        replacement=replacement,
    )
