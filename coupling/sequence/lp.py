r"""The block-level LPs: what any verifier could achieve on one model pair.

* :func:`optimal_expected_accepted` couples the draft block with a target block and maximises
  their expected longest common prefix: an upper bound on every verifier, but a relaxation (a
  verifier can emit only the agreed prefix plus one token, after which the target continues
  afresh), so no verifier attains it in general.
* :func:`verifier_lp` is the LP over *all* lossless one-call verifiers of the pair, with full
  knowledge of both models; :func:`full_information_accepted` is its optimum, which block
  verification attains (``proofs/block_optimality.py`` certifies it with exact duals).

Both solve through :mod:`coupling.lp.solvers` (status checked; ``SolverError`` otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp
from numpy.typing import ArrayLike

from ..lm import LanguageModel, ModelCache, check_length, check_models, is_exact
from ..lp.solvers import TOLERANCES, SolverError, check_solver, highs_lp, transport

__all__ = [
    "optimal_expected_accepted",
    "optimal_block_efficiency",
    "VerifierLP",
    "verifier_lp",
    "full_information_accepted",
]


def _block_law(lm: ModelCache, ctx: tuple[int, ...], gamma: int,
               V: int) -> tuple[np.ndarray, np.ndarray]:
    paths = np.array(list(itertools.product(range(V), repeat=gamma)), dtype=np.int64)
    probs = np.empty(len(paths))
    for k, path in enumerate(paths):
        pr = 1.0
        for i in range(gamma):
            pr *= float(lm(ctx + tuple(int(t) for t in path[:i]))[path[i]])
            if pr == 0:
                break
        probs[k] = pr
    return paths, probs


def optimal_expected_accepted(
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
    solver: str = "pot",
) -> float:
    r"""Block-level transport bound on accepted draft tokens.

    :math:`\max_{\pi \in \Pi(Q^\gamma, P^\gamma)} E_\pi[\mathrm{LCP}(X, Y)]`.

    :math:`X \sim Q^\gamma` is the draft block, :math:`Y \sim P^\gamma` the target's own
    :math:`\gamma`-token continuation, :math:`\mathrm{LCP}` their longest common prefix;
    solved with :func:`coupling.lp.solvers.transport` on the cost :math:`-\mathrm{LCP}`
    (:math:`V^\gamma \times V^\gamma`, so tiny V and gamma only). This is the full-information
    upper bound on accepted draft tokens: it ignores that a verifier can only emit tokens up
    to the first disagreement (then the target continues afresh), so it can exceed
    :func:`full_information_accepted`, the achievable full-information optimum.
    """
    gamma = check_length(gamma)
    T, D, ctx = check_models(target, draft, context)
    V = T(ctx).size
    if V ** (2 * gamma) > 4_000_000:
        raise ValueError(
            f"the block LP has (V**gamma)**2 = {V ** (2 * gamma)} variables; lower V or gamma"
        )
    paths, qx = _block_law(D, ctx, gamma, V)
    _, py = _block_law(T, ctx, gamma, V)
    eq = paths[:, None, :] == paths[None, :, :]
    lcp = np.cumprod(eq, axis=2).sum(axis=2).astype(np.float64)
    plan, _ = transport(qx, py, -lcp, check_solver(solver))
    return float((lcp * plan).sum())


def optimal_block_efficiency(
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
    solver: str = "pot",
) -> float:
    """Tokens per call of the full-information block LP: :func:`optimal_expected_accepted` + 1."""
    return optimal_expected_accepted(target, draft, gamma, context=context, solver=solver) + 1.0


@dataclass(frozen=True)
class VerifierLP:
    r"""The lossless-verifier LP of one model pair, in standard form.

    maximise :math:`c^\top z` subject to :math:`A z = b`, :math:`z \ge 0`, where
    :math:`z_{x,(\tau,y)} = Q(x)\,\pi(\tau, y \mid x)` is the joint probability of drafting
    ``x`` and emitting :math:`(x_1..x_\tau, y)`. Rows of ``A``: one losslessness row per
    string :math:`s \in V^{\gamma+1}`, then one row per path (:math:`\sum_o z_{x,o} = Q(x)`).
    Entries are exact Fractions when the models are exact, so a dual vector can be checked
    exactly (:meth:`dual_bound`).
    """

    rows: np.ndarray
    cols: np.ndarray
    vals: list
    b: list
    c: list
    n_var: int
    paths: list
    outs: list

    def matrix(self) -> sp.csr_matrix:
        return sp.csr_matrix(
            (np.array([float(v) for v in self.vals]), (self.rows, self.cols)),
            shape=(len(self.b), self.n_var),
        )

    def solve(self) -> tuple[float, np.ndarray, np.ndarray]:
        r"""Solve with HiGHS and check the answer; returns ``(value, z, y)``.

        Float laws whose probabilities span many orders of magnitude give coefficients
        (products of conditionals) down to 1e-30; HiGHS silently drops those below 1e-9 and
        then calls a feasible LP infeasible, or returns an infeasible or suboptimal "optimum".
        So the LP is solved as built first and, while the answer fails the checks below,
        again in exactly equivalent units (``_VERIFIER_ATTEMPTS``): each column multiplied by
        the target probability :math:`P(e)` of its emitted string (which makes every
        losslessness coefficient :math:`P(s)`), each row divided by its largest coefficient
        or a geometric mean, with dual simplex or interior point and presolve off. Every
        solve uses right-hand sides rebalanced so that :math:`\sum_x Q(x) = \sum_s P(s)` in
        float: sums that differ by rounding make the equalities inconsistent.

        Checked on the LP as built, with tolerance ``TOLERANCES.equality_lp`` (1e-9):

        * primal feasibility: ``z >= -tol`` and :math:`\|A z - b\|_\infty \le` tol;
        * ``-tol <= value <= gamma + tol`` (an expected accepted length);
        * optimality: the weak-duality bound from ``y``,
          :math:`b^\top y + \sum_j \max(0, c_j - (A^\top y)_j)\, U_j` with the implied bounds
          :math:`z_j \le U_j = \min(Q(x), P(e))`, exceeds ``value`` by at most tol.

        ``y`` is a dual vector of the maximisation; :meth:`dual_bound` turns it into a rigorous
        bound. It is dual-feasible up to the solver's tolerance when the first solve passes;
        after a rescaled solve it can violate :math:`A^\top y \ge c` on columns of tiny
        :math:`P(e)`, and then :meth:`dual_bound` (which does not use :math:`U`) can be loose.

        Raises
        ------
        SolverError
            If no solve passes the checks (pass exact Fraction models, or round
            probabilities below ~1e-12 to zero).
        """
        A = self.matrix()
        b = np.array([float(v) for v in self.b])
        c = np.array([float(v) for v in self.c])
        n_str = len(b) - len(self.paths)
        gamma = max(tau for tau, _ in self.outs)
        mass = _emitted_mass(A, b, n_str)
        caps = np.minimum(mass, np.repeat(b[n_str:], len(self.outs)))
        b_eq = _rebalanced(b, n_str)
        failures = []
        for rows, method, presolve in _VERIFIER_ATTEMPTS:
            label = method if rows == "as built" else f"{method}, rows scaled by {rows}"
            if rows == "as built":
                row, col = np.ones(A.shape[0]), np.ones(self.n_var)
            else:
                row, col = _verifier_scaling(A, mass, rows)
            try:
                # no upper bounds, not even the implied z_j <= 0 when P(e) = 0: the dual must
                # satisfy A^T y >= c on every column for dual_bound to stay tight
                x, marginals = highs_lp(-(col * c), sp.diags(row) @ A @ sp.diags(col),
                                        row * b_eq, method=method,
                                        options=TOLERANCES.highs(presolve=presolve),
                                        what="verifier LP")
            except SolverError as exc:
                failures.append(f"{label}: {exc}")
                continue
            z = col * x
            # linprog minimises -c; its equality marginals are d(min)/d(b), so y = -marginals
            # is a dual vector of the maximisation: A^T y >= c, value = b^T y.
            y = row * -marginals
            defects = _verifier_defects(A, b, c, z, y, caps, gamma)
            if not defects:
                return float(c @ z), z, y
            failures.append(f"{label}: " + "; ".join(defects))
        raise SolverError(
            "verifier LP: HiGHS gave no solution that passes the checks ("
            + " | ".join(failures)
            + "); the float laws are too ill-conditioned: pass exact Fraction models, or "
            "round probabilities below ~1e-12 to zero"
        )

    def dual_bound(self, y: ArrayLike, *, limit_denominator: int | None = None) -> Fraction:
        r"""A rigorous upper bound on the LP value from any (approximate) dual vector ``y``.

        ``y`` is converted to exact rationals (first rounded to nearby fractions of
        denominator at most ``limit_denominator`` if given, which recovers the exact dual when
        it has small denominators). Then each path row's multiplier is raised by the largest
        violation of :math:`A^\top y \ge c` among that path's columns (each column meets
        exactly one path row, with coefficient 1), which makes ``y`` exactly dual-feasible.
        Weak duality: the LP value is at most :math:`b^\top y`, computed exactly.
        """
        yq = [Fraction(float(v)) for v in np.asarray(y, dtype=np.float64)]
        if limit_denominator is not None:
            yq = [v.limit_denominator(limit_denominator) for v in yq]
        colsum = [Fraction(0)] * self.n_var
        for r, j, v in zip(self.rows.tolist(), self.cols.tolist(), self.vals, strict=True):
            colsum[j] += Fraction(v) * yq[r]
        n_out = len(self.outs)
        n_str = len(self.b) - len(self.paths)
        for k in range(len(self.paths)):
            cols = range(k * n_out, (k + 1) * n_out)
            short = max(Fraction(self.c[j]) - colsum[j] for j in cols)
            if short > 0:
                yq[n_str + k] += short
        return sum(Fraction(bi) * yi for bi, yi in zip(self.b, yq, strict=True))


#: Solves tried in turn by :meth:`VerifierLP.solve` until one passes its checks: (row scaling,
#: method, presolve), at :data:`coupling.lp.solvers.TOLERANCES` (HiGHS's default 1e-7 is far
#: above the smallest path masses). On peaked float TabularLMs (V <= 3, gamma <= 3) no single
#: one always passes; of 800 such instances (concentration 0.03 to 0.5) all but 2 of the most
#: peaked passed one of these, and those 2 raise SolverError. The first keeps the exact duals
#: (small denominators) that ``proofs/`` recovers from well-conditioned LPs.
_VERIFIER_ATTEMPTS = (
    ("as built", "highs", True),
    ("max", "highs-ds", False),
    ("geometric", "highs-ds", False),
    ("geometric", "highs-ipm", False),
    ("max", "highs-ipm", False),
)


def _emitted_mass(A, b: np.ndarray, n_str: int) -> np.ndarray:
    r"""Per column, the target probability :math:`P(e)` of its emitted string (an upper bound).

    Losslessness entry :math:`(s, j)` is :math:`P(s) / P(e_j)`, so :math:`b_s / A_{sj}` recovers
    :math:`P(e_j)`; the minimum over rows is also a valid bound :math:`z_j \le b_s / A_{sj}`,
    since every term of row ``s`` is non-negative. Columns meeting no such row get ``inf``.
    """
    A = A.tocoo()
    on = A.row < n_str
    mass = np.full(A.shape[1], np.inf)
    with np.errstate(divide="ignore"):
        np.minimum.at(mass, A.col[on], b[A.row[on]] / A.data[on])
    return mass


def _rebalanced(b: np.ndarray, n_str: int) -> np.ndarray:
    """``b`` with the rounding difference of its two total masses moved onto the largest path."""
    out = b.copy()
    k = n_str + int(np.argmax(out[n_str:]))
    out[k] += out[:n_str].sum() - out[n_str:].sum()
    return out


def _verifier_scaling(A, mass: np.ndarray, rows: str) -> tuple[np.ndarray, np.ndarray]:
    """Row and column factors that make the verifier LP's coefficients well scaled.

    Columns are multiplied by :math:`P(e)`, which turns every losslessness entry into
    :math:`P(s)`; then each row is divided by its largest entry (``rows="max"``) or by the
    geometric mean of its largest and smallest (``"geometric"``: path rows span many orders
    of magnitude, and this keeps both ends inside what HiGHS accepts).
    """
    col = np.where(np.isfinite(mass) & (mass > 0), mass, 1.0)
    M = abs(A @ sp.diags(col)).tocsr()
    M.eliminate_zeros()
    filled = np.diff(M.indptr) > 0
    starts = M.indptr[:-1][filled]
    big = np.ones(M.shape[0])
    big[filled] = np.maximum.reduceat(M.data, starts)
    if rows == "geometric":
        small = np.ones(M.shape[0])
        small[filled] = np.minimum.reduceat(M.data, starts)
        big = np.sqrt(big * small)
    return 1.0 / big, col


def _verifier_defects(
    A,
    b: np.ndarray,
    c: np.ndarray,
    z: np.ndarray,
    y: np.ndarray,
    caps: np.ndarray,
    gamma: int,
    tol: float = TOLERANCES.equality_lp,
) -> list[str]:
    """What is wrong with a verifier-LP solution ``(z, y)``; empty if it passes every check."""
    if not (np.isfinite(z).all() and np.isfinite(y).all()):
        return ["non-finite solution"]
    defects = []
    if z.min() < -tol:
        defects.append(f"z has entries down to {z.min():.3g} < 0")
    resid = float(np.abs(A @ z - b).max())
    if resid > tol:
        defects.append(f"max |A z - b| = {resid:.3g}")
    value = float(c @ z)
    if not -tol <= value <= gamma + tol:
        defects.append(f"value {value!r} outside [0, gamma = {gamma}]")
    bound = float(b @ y + np.maximum(c - A.T @ y, 0) @ caps)
    if bound - value > tol:
        defects.append(f"not optimal: the dual bound exceeds the value by {bound - value:.3g}")
    return defects


def _tree(lm: ModelCache, ctx: tuple[int, ...], depth: int, V: int) -> dict:
    return {
        pre: lm(ctx + pre)
        for d in range(depth + 1)
        for pre in itertools.product(range(V), repeat=d)
    }


def verifier_lp(
    target: LanguageModel, draft: LanguageModel, gamma: int, *, context: Sequence[int] = ()
) -> VerifierLP:
    r"""Build the LP over all lossless one-iteration verifiers of one model pair (tiny V, gamma).

    A verifier maps the drafted block :math:`x` (with full knowledge of both models) to an
    emission :math:`(x_1..x_\tau, y)`, :math:`\tau \in 0..\gamma`, after which the target
    continues. Lossless iff for every :math:`s \in V^{\gamma+1}`:

    .. math:: \sum_x Q(x) \sum_{\tau:\, x^\tau = s^\tau} \pi(\tau, s_{\tau+1} \mid x)\,
              P(s_{\tau+2..\gamma+1} \mid s^{\tau+1}) = P(s)

    (emissions have length :math:`\le \gamma + 1`, so equal laws of :math:`(\gamma+1)`-strings
    make the whole stream lossless). Objective: :math:`E[\tau]`.
    """
    gamma = check_length(gamma)
    T, D, ctx = check_models(target, draft, context)
    V = T(ctx).size
    if V ** (2 * gamma + 1) * (gamma + 1) > 2_000_000:
        raise ValueError(
            f"the verifier LP for V={V}, gamma={gamma} is too large; "
            "it is meant for tiny V and gamma"
        )
    p, q = _tree(T, ctx, gamma, V), _tree(D, ctx, gamma - 1, V)
    exact = is_exact(T(ctx))
    one = Fraction(1) if exact else 1.0

    def prob(tree: dict, s: tuple[int, ...], start: int = 0):
        pr = one
        for i in range(start, len(s)):
            pr = pr * tree[s[:i]][s[i]]
        return pr

    paths = [x for x in itertools.product(range(V), repeat=gamma) if prob(q, x) != 0]
    outs = [(tau, y) for tau in range(gamma + 1) for y in range(V)]
    strings = list(itertools.product(range(V), repeat=gamma + 1))
    s_index = {s: i for i, s in enumerate(strings)}
    rows, cols, vals, c = [], [], [], []
    b = [prob(p, s) for s in strings]
    for k, x in enumerate(paths):
        for o, (tau, y) in enumerate(outs):
            j = k * len(outs) + o
            c.append(tau * one)
            emitted = x[:tau] + (y,)
            for tail in itertools.product(range(V), repeat=gamma - tau):
                s = emitted + tail
                v = prob(p, s, len(emitted))
                if v != 0:
                    rows.append(s_index[s])
                    cols.append(j)
                    vals.append(v)
            rows.append(len(strings) + k)
            cols.append(j)
            vals.append(one)
        b.append(prob(q, x))
    return VerifierLP(
        np.array(rows, dtype=np.int64),
        np.array(cols, dtype=np.int64),
        vals,
        b,
        c,
        len(paths) * len(outs),
        paths,
        outs,
    )


def full_information_accepted(
    target: LanguageModel, draft: LanguageModel, gamma: int, *, context: Sequence[int] = ()
) -> float:
    r"""Best :math:`E[\tau]` of any lossless verifier that knows both models completely.

    The optimum of :func:`verifier_lp` (HiGHS, checked by :meth:`VerifierLP.solve`, which
    raises :class:`coupling.SolverError` rather than return an unchecked value).
    Unlike the transport bound :func:`optimal_expected_accepted` it is achievable. On every
    instance tried it equals block verification's :func:`coupling.expected_accepted`
    (``proofs/block_optimality.py`` certifies this with exact dual bounds), in line with
    Thomas & Pal (arXiv:2602.16961), who prove block verification optimal even among
    verifiers that use off-path probabilities.
    """
    return verifier_lp(target, draft, gamma, context=context).solve()[0]
