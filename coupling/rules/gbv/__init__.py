r"""``gbv``: greedy multi-path block verification (Thomas & Pal, "Greedy Multi-Path Block
Verification for Faster Decoding in Speculative Sampling", arXiv:2602.16961).

Sources
-------
The paper's full text was not available here: only its abstract, three reviewers' summaries
(an "information-agnostic" LP; block verification optimal for one path even against verifiers
that see off-path probabilities; for ``K`` i.i.d. paths the optimal verifier factorises into a
randomised path selection followed by single-path block verification, under submodular
constraints, and is intractable in general), and the authors' public reference implementation
(``gbv_verify``, ``compute_skew``). The algorithm below is the reference implementation's,
with one correction (ties, below); the skew formula is re-derived here and checked against
brute-force enumeration; the paper's theorems could not be read.

Algorithm (what :func:`select` and :func:`verify_block` do), ``k`` i.i.d. paths
-----------------------------------------------------------------------
1. **Rank.** At every node :math:`u` order the vocabulary by ascending
   :math:`\min(1, p(t \mid u)/q(t \mid u))` (``rank="capped"``, the reference's key) or
   :math:`p/q` (``rank="ratio"``), ties by token id, tokens with :math:`q = 0` lowest. Paths
   are ordered lexicographically by these per-node orders.
2. **Select** the largest drafted path :math:`X^\star`: from the root, step to the child of
   highest rank.
3. **Skew.** :math:`X^\star` is the maximum of ``k`` i.i.d. paths, so
   :math:`P(X^\star \preceq x) = F(x)^k`, :math:`F` the draft's lexicographic CDF. Along the
   selected prefix :math:`u` (depth :math:`d`) let :math:`A` be the draft mass of the
   depth-:math:`d` prefixes ranked below :math:`u`, :math:`m = Q(u)` and
   :math:`F^-(t) = \sum_{t' \prec_u t} q(t' \mid u)`. Then

   .. math:: q^\star(t \mid u) = \frac{(A + m F^-(t) + m q(t))^k - (A + m F^-(t))^k}
                                      {(A + m)^k - A^k},
             \qquad A \leftarrow A + m F^-(x^\star_{d+1}),\quad m \leftarrow m\, q(x^\star_{d+1}),

   computed as :math:`q(t) \sum_{i<k} a^i b^{k-1-i} / \sum_{i<k} (A+m)^i A^{k-1-i}` with every
   base divided by :math:`A + m`, both sums by Horner's rule (:func:`skewed`: non-negative
   terms in :math:`[0, 1]`, so no cancellation and no underflow of deep prefixes); exact in
   Fractions. The numerators telescope along the rank order, so :math:`q^\star` sums to 1
   without renormalising. The reference's ``compute_skew`` is the same formula (its
   ``q_joint = m``, ``q_joint_cdf = A + m``).
4. **Verify** :math:`X^\star` by block verification (:mod:`coupling.rules.block`) with
   :math:`q^\star` in place of :math:`q` along it, coins ``coins[:, b]`` (``b`` the lowest
   path equal to :math:`X^\star`), and ``u[tau]`` for the emitted token.

Why it is lossless: block verification is lossless for a drafted path whenever the draft laws
it is given are that path's true conditional laws; step 3 computes exactly the conditional
laws of the lexicographic maximum, so "select, skew, verify" is lossless for any fixed
per-node order. It is a member of the paper's class "randomised path selection followed by
single-path block verification", with a deterministic greedy selection.

Ties: with the capped key every token with :math:`p \ge q` ties at 1, so ties are common. The
selection must break them exactly as the CDF does; the reference code takes the first child
in order of appearance among tied keys, which makes the selected path's law differ from
:math:`q^\star` and the rule lossy (exact instance ``gamma = 1``, ``k = 2``,
:math:`p = (1/5, 2/5, 2/5)`, :math:`q = (3/5, 1/5, 1/5)`: the output puts 11/25 on token 1
instead of 2/5; negative control ``gbv_first_child_ties``).

Claims and their status
-----------------------
* Lossless: from block verification's losslessness and the exact skew (derived); checked by
  exact enumeration of whole output streams (TV < 1e-12 in float, equality in Fractions),
  with broken variants that fail (:data:`CONTROLS`); the skew against brute force over every
  tree (``proofs/gbv_skew.py``).
* ``k = 1``: :math:`q^\star = q`, block verification coin for coin.
* GBV can accept *less* than single-path block verification (derived; exact instance
  ``gamma = 1``, ``V = 2``, :math:`p = (3/5, 2/5)`, :math:`q = (7/10, 3/10)`: token 1 ranks
  top, :math:`q^\star(1) = 1 - (7/10)^k` overshoots :math:`p(1)`, and
  :math:`E[\tau] = 1 - \mathrm{TV}(p, q^\star)` is 89/100 at ``k = 2`` and 743/1000 at
  ``k = 3`` against block's 9/10; ``proofs/gbv_loses.py``). Two causes: over-concentration
  (the maximum of ``k`` draws pushes :math:`q^\star` past :math:`p` on the top-ranked token)
  and myopia (the rank at a node ignores what follows). The paper's gains were measured on real
  model pairs with large vocabularies; these toy instances do not contradict them, they show
  that the greedy selection carries no guarantee against one path.
* Its value is at most the multi-path verifier LP's
  (:func:`coupling.full_information_tree_accepted`), which is attained by a *randomised*
  selection followed by block verification (derived; checked numerically,
  ``proofs/tree_lp_selection.py``).

Draft model: i.i.d. paths only, as in the paper. (With distinct first tokens the root's skew
is the law of the top-ranked of ``k`` successive draws without replacement, which has no
closed form: enumerating the ``k``-permutations of the support is infeasible for a real
vocabulary.) Information model: the drafted tree (to find the highest-ranked child at each
node) and :math:`p, q` at the nodes of the selected path (whole vectors: ranks, CDFs
:math:`F^-`, block residuals).
"""

from __future__ import annotations

import numpy as np

from .. import block
from ..trie import NegativeControl, TreeLaw, TreeRule, Trie, build_trie, unit_of

__all__ = ["RANKS", "CONTROLS", "rank_key", "rank_order", "skewed", "skew", "select", "node_rows",
           "verify_block", "law", "GBV", "GBVControl", "RULE"]

#: ``"capped"``: rank by min(1, p/q) (the reference implementation); ``"ratio"``: by p/q
RANKS = ("capped", "ratio")
#: Deliberately broken variants (negative controls), each a plausible mistake:
CONTROLS = {
    "unskewed": "the selected path is block-verified with the plain draft laws q",
    "first_child_ties": "the selection takes the first-appearing child among tied keys (the "
                        "reference implementation's rule)",
}


def rank_key(p: np.ndarray, q: np.ndarray, rank: str = "capped") -> np.ndarray:
    """Each token's ranking key at one node: ``min(1, p/q)`` or ``p/q``, and -1 where ``q = 0``
    (float64, or Fractions for exact laws)."""
    one = unit_of(p)
    with np.errstate(over="ignore"):    # p over a subnormal q: +inf, above every finite key
        ratio = p / np.where(q > 0, q, one)
    key = np.minimum(ratio, one) if rank == "capped" else ratio
    return np.where(q > 0, key, -one)


def rank_order(p: np.ndarray, q: np.ndarray, rank: str = "capped") -> np.ndarray:
    """Tokens in ascending rank at one node: by :func:`rank_key`, ties by token id."""
    return np.argsort(rank_key(p, q, rank), kind="stable")


def skewed(q, below, A, m, k: int, *, overwrite_below: bool = False, work=None):
    r""":math:`q^\star` (module doc, step 3) from the draft law ``q``, the mass ranked below each
    token ``below`` and the prefix masses ``A``, ``m`` (broadcasting against ``q``). Operators
    only: numpy arrays of floats or Fractions and torch tensors go through the same arithmetic.
    For callers that reuse memory across rows: ``overwrite_below``, ``below`` may be
    overwritten; ``work``, three arrays shaped like ``q`` to compute in (the result is the
    second).

    >>> skewed(np.array([0.5, 0.5]), np.array([0.0, 0.5]), 0.0, 1.0, 2)
    array([0.25, 0.75])
    """
    if k == 1:
        return q
    top = A + m
    c, low = m / top, A / top
    b = below if overwrite_below else below * 1
    b *= c
    b += low                                            # (A + m F^-) / (A + m)
    a = _copy(q, work, 0)
    a *= c
    a += b                                              # (A + m F^- + m q) / (A + m)
    # Horner: sum_{i<k} a^i b^(k-1-i) = a * sum_{i<k-1} a^i b^(k-2-i) + b^(k-1)
    num, den, low_pow = _copy(a, work, 1), low + 1, low
    num += b
    b_pow = _copy(b, work, 2) if k > 2 else b
    for _ in range(k - 2):
        b_pow *= b
        low_pow = low_pow * low
        num *= a
        num += b_pow
        den = den + low_pow
    num *= q
    num /= den
    return num


def _copy(x, work, i: int):
    """``x`` in a new array, or written into ``work[i]``."""
    if work is None:
        return x * 1
    work[i][...] = x
    return work[i]


def skew(q: np.ndarray, order: np.ndarray, A, m, k: int) -> tuple[np.ndarray, np.ndarray]:
    r"""``(q_star, below)``: the selected path's law at a node (module doc, step 3) and
    :math:`F^-`, the draft mass ranked below each token. ``A``, ``m``: the mass of the
    prefixes ranked below the node and of the node itself."""
    one = unit_of(q)
    below = np.empty_like(q)
    below[order] = np.concatenate([[0 * one], np.cumsum(q[order])[:-1]])
    return skewed(q, below, A, m, k), below


def select(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *, rank: str = "capped",
           control: str | None = None) -> tuple[int, np.ndarray]:
    """Greedy selection on a validated tree: ``(branch, q_star [gamma, V])``, the lowest path
    equal to the selected one and its conditional laws (exact for Fraction inputs)."""
    trie = build_trie(drafts)
    k, gamma = drafts.shape
    one = unit_of(p)
    A, m, node = 0 * one, one, 0
    q_star = []
    for d in range(gamma):
        b = trie.branch[node]
        order = rank_order(p[b, d], q[b, d], rank)
        qs, below = skew(q[b, d], order, A, m, k)
        q_star.append(q[b, d] if control == "unskewed" else qs)
        node = _best_child(trie, node, order, p[b, d], q[b, d], control)
        t = trie.token(node)
        A, m = A + m * below[t], m * q[b, d][t]
    return trie.branch[node], np.stack(q_star)


def node_rows(drafts: np.ndarray, b: int, law: np.ndarray) -> np.ndarray:
    """Path ``b``'s rows of ``law [k, n, V]`` read at each of its nodes from the lowest path
    through it (:mod:`coupling.rules.trie`), ``[n, V]``."""
    x = drafts[b]
    return np.stack([law[np.flatnonzero((drafts[:, :d] == x[:d]).all(1))[0], d]
                     for d in range(law.shape[1])])


def _best_child(trie: Trie, node: int, order: np.ndarray, p: np.ndarray, q: np.ndarray,
                control: str | None) -> int:
    kids = trie.children[node]
    if control == "first_child_ties":
        key = {c: min(p[trie.token(c)] / q[trie.token(c)], 1) for c in kids}
        best = max(key.values())
        return next(c for c in kids if key[c] == best)
    pos = np.empty(order.size, dtype=np.int64)
    pos[order] = np.arange(order.size)
    return max(kids, key=lambda c: pos[trie.token(c)])


def verify_block(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, coins: np.ndarray,
           u: np.ndarray, *, rank: str = "capped",
           control: str | None = None) -> tuple[int, int, int]:
    """Deterministic core on a validated float tree: ``(accepted, branch, next_token)``, block
    verification (:func:`coupling.rules.block.verify_path`) of the selected path ``branch`` with
    its skewed laws, its coins ``coins[:, branch]`` and ``u[accepted]`` for the emitted
    token."""
    b, q_star = select(drafts, p, q, rank=rank, control=control)
    tau, y = block.verify_path(drafts[b], node_rows(drafts, b, p), q_star, coins[:, b], u)
    return tau, b, y


def law(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *, rank: str = "capped",
        control: str | None = None) -> TreeLaw:
    """Exact law of one call given the validated tree: ``[(prefix, probability, next law)]``."""
    b, q_star = select(drafts, p, q, rank=rank, control=control)
    x = drafts[b]
    tau, nxt = block.path_law(x, node_rows(drafts, b, p), q_star)
    return [(tuple(int(t) for t in x[:i]), tau[i], nxt[i]) for i in range(x.size + 1)
            if tau[i] != 0]


class GBV(TreeRule):
    """Greedy multi-path block verification (module doc); ``rank`` in :data:`RANKS`."""

    name = "gbv"
    twin = "coupling.rules.gbv.torch"
    title = "greedy multi-path block verification: greedy path selection, then block"
    reference = "Thomas & Pal, arXiv:2602.16961"
    draft_laws = (True,)
    bound_text = ("<= the multi-path verifier LP (coupling.full_information_tree_accepted); "
                  "can be below single-path block verification")
    #: the negative control's mistake (a key of :data:`CONTROLS`), None for the rule itself
    control: str | None = None

    def __init__(self, rank: str = "capped"):
        if rank not in RANKS:
            raise ValueError(f"rank must be one of {RANKS}, got {rank!r}")
        self.rank = rank

    def tree_law(self, drafts, p, q, replacement) -> TreeLaw:
        return law(drafts, p, q, rank=self.rank, control=self.control)

    def _verify_block(self, drafts, p, q, coins, u, replacement) -> tuple[int, int, int]:
        return verify_block(drafts, p, q, coins, u, rank=self.rank, control=self.control)

    def __repr__(self) -> str:
        return f"<rule {self.name!r} (rank={self.rank!r}): {self.title}>"


class GBVControl(NegativeControl, GBV):
    """A deliberately broken GBV (:data:`CONTROLS`)."""

    controls = CONTROLS

    def __init__(self, control: str):
        super().__init__()
        self._break(control)


RULE = GBV()
