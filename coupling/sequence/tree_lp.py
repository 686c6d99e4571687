r"""The multi-path verifier LP: the best lossless verifier of a draft tree of ``k`` paths.

Verifier class and information model
------------------------------------
One call after context :math:`c`: the drafter draws a tree :math:`T` of ``k`` paths of
:math:`\gamma` tokens (i.i.d. paths, or distinct first tokens: :mod:`coupling.rules.trie`);
the verifier sees :math:`T`, knows both models completely (the LP is solved per model pair, so
it may use any off-tree conditional), and emits a node :math:`e` of :math:`T` (an accepted
prefix, :math:`\tau = |e|`) and one token :math:`y`; the target then continues. This is the
full-information model of :func:`coupling.verifier_lp` with a tree in place of one path, and
the two coincide for ``k = 1``. Its optimum bounds every verifier that sees less: traversal,
GBV, the token-level tree walks (``rrs``, ``kseq``, ``optimal``). It is *not* the optimum of
the narrower class that sees only the tree and the laws along it and is lossless for every
pair (block verification's class for ``k = 1``); that optimum is unknown for ``k >= 2``.

Variables and constraints (:func:`tree_verifier_lp`)
----------------------------------------------------
Given the multiset of paths, their order is private randomness (the target's future does not
depend on the drafts), and averaging an optimal verifier over it keeps it feasible and
optimal; so trees are multisets of paths (i.i.d.) or sets (distinct first tokens), with
probability :math:`Q(T)`: the multinomial coefficient times the path probabilities, or the sum
of the successive-sampling probabilities of the set's orders.

* :math:`z_{T, e, y} \ge 0` for each tree :math:`T`, node :math:`e \in T`, token :math:`y`: the
  probability of drafting :math:`T` and emitting :math:`e\,y`;
  :math:`\sum_{e, y} z_{T, e, y} = Q(T)`;
* :math:`m_u = \sum_{T,\, e y = u} z_{T, e, y}`, the law of the emitted string :math:`u`
  (length 1 to :math:`\gamma + 1`);
* lossless: emissions have at most :math:`\gamma + 1` tokens, so the stream is the target's
  iff for every :math:`s \in V^{\gamma + 1}`,
  :math:`\sum_{u \preceq s} m_u\, P(s_{|u|+1..} \mid u) = P(s)`;
* objective: :math:`\max \sum_u (|u| - 1)\, m_u = E[\tau]`.

Path-selection form (:func:`path_selection_lp`, derived here)
-------------------------------------------------------------
Given the emitted node, the rest of the tree is private randomness too, so every verifier is
"select a path :math:`X'` of the tree (any randomised rule), then a single-path verifier for
:math:`X'`", and with the single-path optimality of block verification (Thomas & Pal) the
optimum is :math:`\max_{Q'} E[\tau_{\mathrm{block}}](Q', P)` over the laws :math:`Q'` of a path
selected from the tree: by Gale's supply-demand theorem those with
:math:`Q'(S) \le P(\text{the tree holds a path in } S)` for every set :math:`S` of paths
(:math:`1 - (1 - Q(S))^k` for i.i.d. paths; a polymatroid). Block verification of an optimal
:math:`Q'` (:func:`selection_model`) attains the optimum: the reviewers of Thomas & Pal report
this factorisation as the paper's theorem; here it is checked numerically on instances
(``proofs/tree_lp_selection.py``).

Both LPs are solved by HiGHS through :func:`coupling.lp.solvers.certified_lp` (status, primal and
dual feasibility, duality gap checked; :class:`coupling.SolverError` otherwise). Sizes: ``V =
3``, ``gamma = 3``, ``k = 3`` has 3654 multisets and about 93000 variables.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..dist import validate_k, validate_replacement
from ..lm import LanguageModel, ModelCache, check_length, check_models, path_laws
from ..lp.solvers import TOLERANCES, certified_lp
from ..tree import Tree
from .topology import drafted_tries

__all__ = ["TreeVerifierLP", "tree_verifier_lp", "full_information_tree_accepted",
           "path_selection_lp", "selection_model", "MAX_LP_VARIABLES"]

#: Largest number of variables a tree LP may have (the LPs are meant for tiny instances).
MAX_LP_VARIABLES = 500_000


@dataclass(frozen=True)
class TreeVerifierLP:
    r"""The multi-path verifier LP of one model pair in standard form: minimise
    :math:`c^\top x` s.t. :math:`A x = b`, :math:`x = (z, m) \ge 0` (module doc); ``strings``
    names the columns of :math:`m` (the last ``len(strings)`` columns)."""

    A: sp.csr_matrix
    b: np.ndarray
    c: np.ndarray
    strings: list
    n_trees: int

    @property
    def n_variables(self) -> int:
        return self.A.shape[1]

    def solve(self) -> tuple[float, dict]:
        """``(E[tau], emitted law)``: the optimum and an optimal law of the emitted string
        (string -> mass, masses above the LP tolerance)."""
        x, _ = certified_lp(self.c, self.A, self.b, what="tree verifier LP")
        m = x[self.A.shape[1] - len(self.strings):]
        value = float(sum((len(u) - 1) * m[i] for i, u in enumerate(self.strings)))
        tol = TOLERANCES.equality_lp
        return value, {u: float(m[i]) for i, u in enumerate(self.strings) if m[i] > tol}


def _setup(target, draft, gamma, k, replacement, context):
    """Validated inputs: ``(T, chains, V, gamma, k, replacement, ctx)``; ``chains`` lists
    ``(path, Q(path), q(first token))`` in float. ``ValueError`` before any work if the LP
    would exceed :data:`MAX_LP_VARIABLES`."""
    gamma, k = check_length(gamma), validate_k(k)
    replacement = validate_replacement(replacement)
    T, D, ctx = check_models(target, draft, context)
    V = T(ctx).size
    _check_size((gamma + 1) * math.log(V), V, gamma, k)        # the emitted strings alone
    if not replacement and np.count_nonzero(D(ctx)) < k:
        raise ValueError(f"cannot draw k={k} distinct first tokens: the draft gives positive "
                         f"probability to {np.count_nonzero(D(ctx))} token(s); lower k or use "
                         "replacement=True")
    chains = [(tuple(int(t) for t in x), float(qx), float(Q[0][x[0]]))
              for x, qx, _, Q in path_laws(T, D, gamma, context=ctx)]
    N = len(chains)
    sets = _log_comb(N + k - 1, k) if replacement else _log_comb(N, k)
    _check_size(sets + math.log((k * gamma + 1) * V), V, gamma, k)
    return T, chains, V, gamma, k, replacement, ctx


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _check_size(log_n: float, V: int, gamma: int, k: int) -> None:
    """``ValueError`` naming the arguments if about ``exp(log_n)`` variables are too many."""
    if log_n > math.log(MAX_LP_VARIABLES):
        raise ValueError(f"the tree LP for V={V}, gamma={gamma}, k={k} is too large (about "
                         f"e**{log_n:.1f} variables, above {MAX_LP_VARIABLES}); it is meant "
                         "for tiny instances: lower k, gamma or the vocabulary size")


def _trees(chains: list, k: int, replacement: bool):
    """``(paths, probability)`` of every multiset (i.i.d.) or set (distinct first tokens)."""
    if replacement:
        for combo in itertools.combinations_with_replacement(range(len(chains)), k):
            counts = np.bincount(combo)
            coef = math.factorial(k) / math.prod(math.factorial(int(c)) for c in counts)
            yield [chains[i][0] for i in combo], coef * math.prod(chains[i][1] for i in combo)
        return
    for combo in itertools.combinations(range(len(chains)), k):
        if len({chains[i][0][0] for i in combo}) < k:
            continue
        orders = 0.0
        for perm in itertools.permutations(combo):     # successive sampling of the heads
            used, f = 0.0, 1.0
            for i in perm:
                f /= 1.0 - used
                used += chains[i][2]
            orders += f
        yield [chains[i][0] for i in combo], orders * math.prod(chains[i][1] for i in combo)


def _strings(V: int, gamma: int) -> list[tuple[int, ...]]:
    return [u for n in range(1, gamma + 2) for u in itertools.product(range(V), repeat=n)]


def _cond(T: ModelCache, ctx: tuple[int, ...], s: tuple[int, ...], start: int) -> float:
    """:math:`P(s_{start..} \\mid c\\, s_{..start})` under the target."""
    pr = 1.0
    for i in range(start, len(s)):
        pr *= float(T(ctx + s[:i])[s[i]])
    return pr


def _lossless_rows(T: ModelCache, ctx, V: int, gamma: int, u_index: dict, row0: int,
                   col0: int):
    """COO parts and right-hand side of :math:`\\sum_u m_u P(s \\mid u) = P(s)`, rescaled so
    that the target's masses sum to exactly 1."""
    rows, cols, vals, b = [], [], [], []
    for r, s in enumerate(itertools.product(range(V), repeat=gamma + 1)):
        b.append(_cond(T, ctx, s, 0))
        for n in range(1, gamma + 2):
            v = _cond(T, ctx, s, n)
            if v > 0:
                rows.append(row0 + r)
                cols.append(col0 + u_index[s[:n]])
                vals.append(v)
    total = math.fsum(b)
    return rows, cols, vals, [v / total for v in b]


def tree_verifier_lp(target: LanguageModel, draft: LanguageModel, gamma: int | None = None,
                     k: int | None = None, *, replacement: bool = True, tree: Tree | None = None,
                     context: Sequence[int] = ()) -> TreeVerifierLP:
    """Build the LP over every lossless verifier of a ``k``-path draft tree that knows both
    models (module doc), or of a draft tree of any shape (``tree=``: the verifier sees the
    drafted prefixes, :func:`coupling.sequence.topology.drafted_tries`); tiny ``V``, ``gamma``,
    ``k`` only (:data:`MAX_LP_VARIABLES`)."""
    if tree is None:
        T, chains, V, gamma, k, replacement, ctx = _setup(target, draft, gamma, k, replacement,
                                                          context)
        trees = [({x[:i] for x in paths for i in range(gamma + 1)}, pr)
                 for paths, pr in _trees(chains, k, replacement)]
    else:
        if gamma is not None or k is not None or replacement is not True:
            raise ValueError("tree= fixes the draft length, the branches and how they are "
                             "drawn; leave gamma, k and replacement out")
        T, D, ctx = check_models(target, draft, context)
        V, gamma = T(ctx).size, tree.depth
        _check_size((gamma + 1) * math.log(V), V, gamma, tree.size)
        trees = list(drafted_tries(T, D, tree, ctx).items())
        _check_size(math.log(sum(len(nodes) for nodes, _ in trees) * V), V, gamma, tree.size)
    strings = _strings(V, gamma)
    u_index = {u: i for i, u in enumerate(strings)}
    total = math.fsum(pr for _, pr in trees)
    rows, cols, vals, b = [], [], [], []
    n_z, link = 0, len(trees)
    for r, (nodes, pr) in enumerate(trees):
        for e in sorted(nodes):
            for y in range(V):
                rows += [r, link + u_index[e + (y,)]]
                cols += [n_z, n_z]
                vals += [1.0, 1.0]
                n_z += 1
        b.append(pr / total)
    rows += [link + i for i in range(len(strings))]          # m_u = sum of its z
    cols += [n_z + i for i in range(len(strings))]
    vals += [-1.0] * len(strings)
    b += [0.0] * len(strings)
    lr, lc, lv, lb = _lossless_rows(T, ctx, V, gamma, u_index, link + len(strings), n_z)
    n_var = n_z + len(strings)
    A = sp.csr_matrix((vals + lv, (rows + lr, cols + lc)), shape=(len(b) + len(lb), n_var))
    c = np.concatenate([np.zeros(n_z), [1.0 - len(u) for u in strings]])
    return TreeVerifierLP(A, np.array(b + lb), c, strings, len(trees))


def full_information_tree_accepted(target: LanguageModel, draft: LanguageModel,
                                   gamma: int | None = None, k: int | None = None, *,
                                   replacement: bool = True, tree: Tree | None = None,
                                   context: Sequence[int] = ()) -> float:
    r"""Best :math:`E[\tau]` of any lossless verifier of ``k`` drafted paths, or of a draft tree
    of any shape (``tree=``), that knows both models completely: the optimum of
    :func:`tree_verifier_lp` (checked, or :class:`coupling.SolverError`). For ``k = 1`` it is
    :func:`coupling.full_information_accepted`, block verification's value."""
    return tree_verifier_lp(target, draft, gamma, k, replacement=replacement, tree=tree,
                            context=context).solve()[0]


def _coverage(chains: list, k: int, replacement: bool) -> np.ndarray:
    """``cover[S]``: the probability that the tree holds a path of the set ``S`` (a bitmask
    over ``chains``), summed over the trees."""
    index = {ch[0]: a for a, ch in enumerate(chains)}
    masks = np.arange(2 ** len(chains))
    cover, total = np.zeros(masks.size), 0.0
    for paths, pr in _trees(chains, k, replacement):
        held = sum(1 << index[x] for x in set(paths))
        cover += pr * ((masks & held) != 0)
        total += pr
    return cover / total


def path_selection_lp(target: LanguageModel, draft: LanguageModel, gamma: int, k: int, *,
                      replacement: bool = True, context: Sequence[int] = ()
                      ) -> tuple[float, dict]:
    r"""The path-selection form of the tree LP (module doc): ``(value, Q')``, an optimal law
    of the selected path (path -> mass).

    Variables: the joint law of (selected path, emitted outcome) and the emitted law; a slack
    per set :math:`S` of paths turns :math:`Q'(S) \le P(\text{tree holds a path in } S)` into
    an equality. Enumerates every set of paths: at most 10 draft paths.
    """
    T, chains, V, gamma, k, replacement, ctx = _setup(target, draft, gamma, k, replacement,
                                                      context)
    N = len(chains)
    if N > 10:
        raise ValueError(f"path_selection_lp enumerates the 2**{N} sets of draft paths; use "
                         "at most 10 paths (V**gamma <= 10)")
    strings = _strings(V, gamma)
    u_index = {u: i for i, u in enumerate(strings)}
    outs = [(tau, y) for tau in range(gamma + 1) for y in range(V)]
    n_z, n_u, sets = N * len(outs), len(strings), range(1, 2**N - 1)
    rows, cols, vals = [], [], []
    for a, (x, _, _) in enumerate(chains):                     # m_u = sum of its z
        for o, (tau, y) in enumerate(outs):
            rows.append(u_index[x[:tau] + (y,)])
            cols.append(a * len(outs) + o)
    vals += [1.0] * len(rows)
    rows += list(range(n_u))
    cols += [n_z + i for i in range(n_u)]
    vals += [-1.0] * n_u
    b = [0.0] * n_u
    lr, lc, lv, lb = _lossless_rows(T, ctx, V, gamma, u_index, n_u, n_z)
    rows, cols, vals, b = rows + lr, cols + lc, vals + lv, b + lb
    rows += [len(b)] * n_z                                     # the selected mass is 1
    cols += list(range(n_z))
    vals += [1.0] * n_z
    b.append(1.0)
    cover = _coverage(chains, k, replacement)
    for slack, S in enumerate(sets):                           # Q'(S) + slack_S = cover(S)
        r = len(b)
        for a in (a for a in range(N) if S >> a & 1):
            rows += [r] * len(outs)
            cols += list(range(a * len(outs), (a + 1) * len(outs)))
        rows.append(r)
        cols.append(n_z + n_u + slack)
        b.append(float(cover[S]))
    vals += [1.0] * (len(rows) - len(vals))
    A = sp.csr_matrix((vals, (rows, cols)), shape=(len(b), n_z + n_u + len(sets)))
    c = np.concatenate([np.zeros(n_z), [1.0 - len(u) for u in strings], np.zeros(len(sets))])
    x, _ = certified_lp(c, A, np.array(b), what="path-selection LP")
    mass = np.clip(x[:n_z].reshape(N, len(outs)).sum(axis=1), 0.0, None)
    return float(-(c @ x)), {ch[0]: float(mass[a]) for a, ch in enumerate(chains)}


def selection_model(path_mass: dict, V: int) -> LanguageModel:
    r"""A draft model whose ``gamma``-token paths have the law ``path_mass`` (path -> mass):
    :math:`q(t \mid u) = Q'(u t) / Q'(u)`, uniform where :math:`Q'(u) = 0` (never drafted)."""
    prefix: dict = {}
    for x, m in path_mass.items():
        for i in range(len(x) + 1):
            prefix[x[:i]] = prefix.get(x[:i], 0.0) + m

    def model(ctx: Sequence[int] = ()) -> np.ndarray:
        u = tuple(ctx)
        total = prefix.get(u, 0.0)
        if total <= 0:
            return np.full(V, 1.0 / V)
        return np.array([prefix.get(u + (t,), 0.0) for t in range(V)]) / total

    return model
