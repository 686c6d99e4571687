r"""The one solver layer: every LP of the package goes through here.

Three exact solvers, one status discipline:

* ``"pot"``: :func:`ot.emd` (POT's network simplex) on a dense transport problem, the
  fastest exact solver here;
* ``"highs"``: :func:`scipy.optimize.linprog` (HiGHS), on the transport problem or the sparse
  max-flow form of a 0/1 cost, and on the equality LPs of :mod:`coupling.sequence.lp` and
  :mod:`coupling.sequence.tree_lp` (:func:`certified_lp`: status, primal and dual feasibility
  and duality gap checked);
* ``"cvxpy"``: the same models through cvxpy (Clarabel at tight tolerances, HiGHS if the
  interior-point answer is only "optimal_inaccurate"): an independent cross-check.

Every call checks the solver's own status and raises :class:`SolverError` unless it certifies
an optimum; no function here returns an unchecked plan. The tolerances live in
:data:`TOLERANCES`, and the two input normalisations every solver needs are done once:

* marginals are **rebalanced** (:func:`rebalance`) so their sums agree to the last bit: two
  marginals whose sums differ by rounding (4e-16) make HiGHS call a feasible problem
  infeasible;
* costs are **shifted and scaled** to ``[0, 1]`` (:func:`normalise_cost`): adding a constant
  to every cost, or multiplying all by a positive one, leaves the optimal plans unchanged
  (every plan has total mass 1), while POT's network simplex reports "Problem infeasible" on
  costs that are all negative (``ot.emd([1], [1], [[-2]])``) and HiGHS reads a cost of
  magnitude ``1e20`` as infinite. The objective value is always recomputed from the caller's
  costs.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

__all__ = [
    "SolverError",
    "SOLVERS",
    "TOLERANCES",
    "Tolerances",
    "check_solver",
    "rebalance",
    "normalise_cost",
    "transport",
    "max_flow",
    "zero_cost_transport",
    "highs_lp",
    "LP_ATTEMPTS",
    "lp_defects",
    "certified_lp",
    "cvxpy_solve",
]

SOLVERS = ("pot", "highs", "cvxpy")


class SolverError(RuntimeError):
    """An LP solver did not certify an optimal solution."""


@dataclass(frozen=True)
class Tolerances:
    """Every numerical tolerance of the solver layer, in one place.

    ``highs_feasibility``: HiGHS's primal and dual feasibility tolerances (its default 1e-7
    left the flow LP's optimum 8e-8 short of the simplex answer; the oracle promises agreement
    to 1e-8). ``clarabel``: Clarabel's gap and feasibility tolerances, for the same reason.
    ``plan_off_edge``: the largest mass a zero-cost sub-plan may place off its allowed edges
    (rounding at a tight cut leaves ulps there; more is a bug). ``plan_margin``: how far a
    capacity may be overdrawn by rounding before a cut is declared not minimal.
    ``equality_lp``: absolute tolerance of the checks on an equality-LP solution.
    """

    highs_feasibility: float = 1e-10
    clarabel: float = 1e-10
    plan_off_edge: float = 1e-9
    plan_margin: float = 1e-12
    equality_lp: float = 1e-9

    def highs(self, **extra) -> dict:
        """HiGHS options at these tolerances, plus ``extra``."""
        return {"primal_feasibility_tolerance": self.highs_feasibility,
                "dual_feasibility_tolerance": self.highs_feasibility, **extra}


TOLERANCES = Tolerances()


def check_solver(solver: str, allowed: tuple[str, ...] = SOLVERS) -> str:
    """``solver`` if it is one of ``allowed``, else ``ValueError`` listing them."""
    if not isinstance(solver, str) or solver not in allowed:
        raise ValueError(f"solver must be one of {allowed}, got {solver!r}")
    return solver


def rebalance(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two non-negative marginals scaled to sum to 1 and to each other within one ulp.

    The rounding difference of the sums is moved onto the largest entry of ``b``, where it is
    relatively smallest (the sum is then recomputed by the solver in its own order, so one ulp
    may remain).
    """
    a = np.clip(a, 0.0, None)
    b = np.clip(b, 0.0, None)
    a = a / a.sum()
    b = b / b.sum()
    j = int(np.argmax(b))
    b[j] += a.sum() - b.sum()
    return a, b


def normalise_cost(cost: np.ndarray) -> np.ndarray:
    """``cost`` shifted to a minimum of 0 and scaled to a maximum of 1 (all zeros if constant).

    Leaves every transport problem's optimal plans unchanged (module doc) and makes every
    solver see the same well-scaled problem whatever the caller's offset and units.
    """
    if cost.size == 0:
        return cost
    lo, hi = float(cost.min()), float(cost.max())
    span = hi - lo
    if not span > 0:
        return np.zeros_like(cost)
    return (cost - lo) / span


# ------------------------------------------------------------------------ dense transport
def _pot(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    import ot  # POT

    n, m = cost.shape
    # POT's default limit (1e5) stops early on large problems and only *warns*: raise it, and
    # turn its warnings into errors below
    max_iter = int(max(1_000_000, 50 * (n + m) * min(n, m)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, log = ot.emd(a, b, np.ascontiguousarray(cost), numItermax=max_iter, log=True)
    code = int(log.get("result_code", -1))
    msgs = [str(w.message) for w in caught
            if "numItermax" in str(w.message) or "emd" in str(w.message).lower()]
    if code != 1 or msgs:
        raise SolverError(f"POT ot.emd did not reach an optimal solution (result_code={code}, "
                          f"warning={msgs[:1]}, message={log.get('warning')!r})")
    return np.asarray(plan, dtype=np.float64), f"optimal (POT result_code={code})"


def _highs_transport(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    n, m = cost.shape
    rows = sp.kron(sp.eye(n, format="csr"), np.ones((1, m)), format="csr")  # sum_j P_ij = a_i
    cols = sp.kron(np.ones((1, n)), sp.eye(m, format="csr"), format="csr")  # sum_i P_ij = b_j
    # one equality row is implied by the others (total mass): drop it
    A = sp.vstack([rows, cols[:-1]], format="csr")
    x, _ = highs_lp(cost.ravel(), A, np.concatenate([a, b[:-1]]), what="transport LP")
    return np.clip(x.reshape(n, m), 0.0, None), "optimal (HiGHS status=0)"


def _cvxpy_transport(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, str]:
    import cvxpy as cp

    n, m = cost.shape
    P = cp.Variable((n, m), nonneg=True)
    prob = cp.Problem(cp.Minimize(cp.sum(cp.multiply(cost, P))),
                      [cp.sum(P, axis=1) == a, cp.sum(P[:, :-1], axis=0) == b[:-1]])
    status = cvxpy_solve(prob)
    return np.clip(np.asarray(P.value), 0.0, None), status


_TRANSPORT = {"pot": _pot, "highs": _highs_transport, "cvxpy": _cvxpy_transport}


def transport(a: np.ndarray, b: np.ndarray, cost: np.ndarray,
              solver: str = "pot") -> tuple[np.ndarray, str]:
    r"""An optimal plan of :math:`\min_{P \ge 0,\, P1 = a,\, P^\top 1 = b} \langle C, P \rangle`.

    ``a``, ``b``: validated non-negative marginals (rebalanced here); ``cost``: finite
    ``[len(a), len(b)]`` (normalised here). Returns ``(plan, status)``; the caller computes
    the value from its own costs.
    """
    a, b = rebalance(a, b)
    return _TRANSPORT[check_solver(solver)](a, b, normalise_cost(cost))


def zero_cost_transport(a: np.ndarray, b: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A plan of the transport of ``a`` to ``b`` (one common total, possibly below 1) on the
    ``allowed`` edges (boolean ``[len(a), len(b)]``), by POT with cost 1 off them.

    The caller knows that a plan on the allowed edges exists; where rounding at a tight
    constraint leaves it short by ulps, that much mass stays off the edges (the plan is still
    a coupling), and anything above ``TOLERANCES.plan_off_edge`` raises :class:`SolverError`.
    """
    total = float(a.sum())
    if not total > 0:
        return np.zeros(allowed.shape)
    cost = (~allowed).astype(np.float64)
    plan = _pot(*rebalance(a, b), cost)[0] * total
    off = float((plan * cost).sum())
    if off > TOLERANCES.plan_off_edge:
        raise SolverError(f"a zero-cost transport needs {off:.3g} of mass off its allowed "
                          "edges: no plan exists on them (please report the inputs)")
    return plan


# ------------------------------------------------------------------- max flow (0/1 costs)
def _scale_into(f: np.ndarray, A: sp.csr_matrix, cap: np.ndarray) -> np.ndarray:
    """Edge flows scaled back into the capacities (an interior-point answer may overshoot by
    ~1e-12); each column of ``A`` has one 1, naming the row its edge belongs to."""
    load = A @ f
    over = load > cap
    if not over.any():
        return f
    scale = np.ones_like(load)
    scale[over] = np.divide(cap[over], load[over], out=np.zeros(over.sum()),
                            where=load[over] > 0)
    owner = np.asarray(A.argmax(axis=0)).ravel()
    return f * scale[owner]


def max_flow(mass: np.ndarray, p: np.ndarray, members: np.ndarray,
             solver: str) -> tuple[np.ndarray, float, str]:
    r"""The membership-cost transport as a maximum flow, by ``"highs"`` or ``"cvxpy"``.

    Maximise :math:`\sum_e f_e` over the edges ``members[s, y]`` (set ``s`` holds token
    ``y``), row sums :math:`\le` ``mass``, column sums :math:`\le` ``p``: inequality
    constraints, which rounding cannot turn infeasible, on :math:`\sum_s |s|` variables
    instead of ``S * V``. The unmatched mass is paired at cost 1 with the product of the
    leftover marginals. Returns ``(plan [S, V], flow value, status)``.
    """
    check_solver(solver, ("highs", "cvxpy"))
    S, V = members.shape
    s_idx, y_idx = np.nonzero(members)
    E = s_idx.size
    A_row = sp.csr_matrix((np.ones(E), (s_idx, np.arange(E))), shape=(S, E))
    A_col = sp.csr_matrix((np.ones(E), (y_idx, np.arange(E))), shape=(V, E))
    if solver == "highs":
        res = linprog(-np.ones(E), A_ub=sp.vstack([A_row, A_col], format="csr"),
                      b_ub=np.concatenate([mass, p]), bounds=(0, None), method="highs-ds",
                      options=TOLERANCES.highs())
        if res.status != 0:
            raise SolverError(f"HiGHS flow LP failed: status={res.status} ({res.message})")
        f, status = res.x, f"optimal (HiGHS status={res.status})"
    else:
        import cvxpy as cp

        x = cp.Variable(E, nonneg=True)
        prob = cp.Problem(cp.Maximize(cp.sum(x)), [A_row @ x <= mass, A_col @ x <= p])
        status = cvxpy_solve(prob)
        f = np.asarray(x.value)
    f = np.clip(f, 0.0, None)
    for A, cap in ((A_row, mass), (A_col, p)):
        f = _scale_into(f, A, cap)
    plan = np.zeros((S, V))
    plan[s_idx, y_idx] = f
    ra = np.clip(mass - plan.sum(axis=1), 0.0, None)
    rb = np.clip(p - plan.sum(axis=0), 0.0, None)
    left = 0.5 * (ra.sum() + rb.sum())
    if left > 0 and ra.sum() > 0 and rb.sum() > 0:
        plan += np.outer(ra / ra.sum(), rb / rb.sum()) * left
    return plan, float(f.sum()), status


# ------------------------------------------------------------------------ general LPs
def highs_lp(c: np.ndarray, A_eq, b_eq: np.ndarray, *, method: str = "highs-ds",
             options: dict | None = None, what: str = "LP") -> tuple[np.ndarray, np.ndarray]:
    """:math:`\\min c^\\top x` s.t. ``A_eq x = b_eq``, ``x >= 0`` by HiGHS; ``(x, y)`` with
    ``y`` the equality marginals (``d min / d b``). ``SolverError`` unless status 0."""
    res = linprog(c, A_eq=A_eq, b_eq=b_eq, bounds=(0, None), method=method,
                  options=TOLERANCES.highs() if options is None else options)
    if res.status != 0:
        raise SolverError(f"HiGHS {what} failed: status={res.status} ({res.message})")
    return np.asarray(res.x), np.asarray(res.eqlin.marginals)


#: HiGHS solves :func:`certified_lp` tries in turn, ``(method, presolve, feasibility
#: tolerance)``, every answer held to the same certificate: presolve has called feasible
#: equality LPs with path probabilities near 1e-17 infeasible, and without it the same LPs
#: solve; tree LPs with drafted-tree masses near 1e-13 are called infeasible at 1e-10 by every
#: method and solve, certified, at 1e-9 (``python benchmarks/bench_topology.py``: SpecInfer's
#: 8-node tree, with and without presolve depending on the pair).
LP_ATTEMPTS = (("highs", True, TOLERANCES.highs_feasibility),
               ("highs-ds", False, TOLERANCES.highs_feasibility),
               ("highs-ipm", False, TOLERANCES.highs_feasibility),
               ("highs", True, TOLERANCES.equality_lp),
               ("highs", False, TOLERANCES.equality_lp),
               ("highs-ipm", False, TOLERANCES.equality_lp))


def lp_defects(A, b: np.ndarray, c: np.ndarray, x: np.ndarray, y: np.ndarray,
               tol: float = TOLERANCES.equality_lp) -> list[str]:
    """What keeps ``(x, y)`` from certifying an optimum of :math:`\\min c^\\top x` s.t.
    ``A x = b``, ``x >= 0``; empty if nothing does.

    The certificate: ``x`` primal feasible, ``y`` dual feasible (reduced costs
    :math:`c - A^\\top y \\ge 0`) and no duality gap (:math:`c^\\top x = b^\\top y`), each
    within ``tol``.
    """
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return ["non-finite solution"]
    defects = []
    if x.min() < -tol:
        defects.append(f"x has entries down to {x.min():.3g} < 0")
    resid = float(np.abs(A @ x - b).max())
    if resid > tol:
        defects.append(f"max |A x - b| = {resid:.3g}")
    reduced = float((c - A.T @ y).min())
    if reduced < -tol:
        defects.append(f"the dual is infeasible by {-reduced:.3g}")
    gap = abs(float(c @ x) - float(b @ y))
    if gap > tol:
        defects.append(f"duality gap {gap:.3g}")
    return defects


def certified_lp(c: np.ndarray, A_eq, b_eq: np.ndarray, *, what: str = "LP",
                 attempts: tuple[tuple[str, bool, float], ...] = LP_ATTEMPTS
                 ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`highs_lp` with an optimality certificate (:func:`lp_defects`): the solves of
    ``attempts`` are tried in turn until one passes; ``(x, y)``, or :class:`SolverError`
    listing every failure."""
    failures = []
    for method, presolve, feasibility in attempts:
        options = {**TOLERANCES.highs(presolve=presolve),
                   "primal_feasibility_tolerance": feasibility,
                   "dual_feasibility_tolerance": feasibility}
        try:
            x, y = highs_lp(c, A_eq, b_eq, method=method, options=options, what=what)
        except SolverError as exc:
            failures.append(f"{method}: {exc}")
            continue
        defects = lp_defects(A_eq, b_eq, c, x, y)
        if not defects:
            return x, y
        failures.append(f"{method}: " + "; ".join(defects))
    raise SolverError(f"{what}: no HiGHS solve passed the optimality checks ("
                      + " | ".join(failures) + ")")


def cvxpy_solve(prob) -> str:
    """Solve a cvxpy problem with its LP solvers at tight tolerances; the status string.

    Clarabel first; an interior-point method may stop at "optimal_inaccurate" on larger
    instances, and then the same model goes to cvxpy's HiGHS interface. Anything else raises
    :class:`SolverError`.
    """
    import cvxpy as cp

    installed = cp.installed_solvers()
    t = TOLERANCES
    attempts = []
    if "CLARABEL" in installed:
        attempts.append(("CLARABEL", dict(tol_gap_abs=t.clarabel, tol_gap_rel=t.clarabel,
                                          tol_feas=t.clarabel, max_iter=500)))
    if "HIGHS" in installed:
        attempts.append(("HIGHS", t.highs(output_flag=False)))
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
