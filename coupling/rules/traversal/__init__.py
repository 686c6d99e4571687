r"""``traversal``: traversal verification of a draft tree (Weng, Hu, Chen, Liu, Mei, Qiu, Tian,
Shi, "Traversal Verification for Speculative Tree Decoding", arXiv:2505.12398, NeurIPS 2025).

Sources
-------
The paper's full text was not available here, only its abstract: the tree is verified
leaf-to-root, judging whole sequences instead of single tokens, so it keeps subsequences that
top-down token-level verification discards; lossless (proved in the paper); +2.2-5.7% mean
acceptance length over token-level tree verification in the paper's runs. The algorithm below
was reconstructed from the abstract and from the ``traversal_verify`` of the GBV authors'
public reference implementation (whose docstrings say that it, like GBV, reduces to block
verification for one path). The losslessness argument, the dominance over block verification
and the analysis of i.i.d. trees below are derived here and checked by exact enumeration; they
could not be compared with the paper's own statements.

Algorithm (what :func:`schedule` and :func:`verify_block` do)
-------------------------------------------------------
The tree is the trie of the drafted paths (:mod:`coupling.rules.trie`). Every node :math:`v`
carries a weight :math:`w_v`, a target law :math:`r_v` (initially :math:`p(\cdot \mid v)`)
and, above depth :math:`\gamma`, a draft law :math:`s_v` (initially :math:`q(\cdot \mid v)`).
Weights are set top-down like block verification's:

.. math:: w_{\mathrm{root}} = 1, \qquad
          w_c = \min\big(w_v\, r_v(c) / s_v(c),\ 1\big) \quad (c \text{ a child of } v).

Repeat: let :math:`c` be the first leaf in depth-first order (first remaining child at every
step) and :math:`\eta_c` its coin.

* :math:`\eta_c < w_c`: accept the prefix of :math:`c` and emit one more token from
  :math:`r_c` (the bonus law at depth :math:`\gamma`, a residual if :math:`c` lost its
  children); stop.
* otherwise delete :math:`c`; at its parent :math:`v`, with
  :math:`\rho = \sum_x (w_v r_v(x) - s_v(x))_+`,

  .. math:: r_v \leftarrow \frac{(w_v r_v - s_v)_+}{\rho}, \qquad
            w_v \leftarrow \frac{\rho}{\rho + 1 - w_v}, \qquad
            s_v \leftarrow \frac{s_v \mathbb 1_{\ne c}}{1 - s_v(c)},

  and recompute the weights of :math:`v`'s remaining descendants top-down.

The root keeps :math:`w = 1` (:math:`\rho / \rho`), so the root, once a leaf, is accepted and
emits from its residual. A rejection always deletes the current first leaf, so the sequence of
candidates does not depend on the coins, which only decide where it stops:
:math:`P(\text{stop at candidate } t) = a_t \prod_{s<t} (1 - a_s)` (:func:`law`; at most
:math:`k\gamma + 1` candidates).

Why it is lossless (derived here)
---------------------------------
*Node invariant.* When the processing of node :math:`v`'s subtree starts in state
:math:`(w, r, s)`, the probability that the emitted string passes through :math:`v` and
continues with token :math:`x` is :math:`w\, r(x)`, whatever the shape of the subtree
(averaged over its tokens and coins). By induction over :math:`v`'s sibling steps: the next
child :math:`c \sim s`; by the invariant for :math:`c` (whose :math:`r` is the target law),
:math:`c`'s subtree is accepted with probability :math:`a_c = \min(w r(c)/s(c), 1)`, so
:math:`x` goes out through :math:`c` with probability :math:`\min(w r(x), s(x))`; a rejection
has probability :math:`1 - w + \rho` and leads to the updated state, from which :math:`x`
goes out with probability :math:`w' r'(x) = (w r(x) - s(x))_+ / (\rho + 1 - w)`; the two add
to :math:`w\, r(x)`. With no child left, :math:`v` is accepted with probability :math:`w` and
emits from :math:`r`. At the root (:math:`w = 1`, :math:`r = p`) this is the target's law of
the next token, and recursively of the whole emission. What it needs: each next candidate
child, given everything revealed, has law :math:`s` (the number of children may depend on
what was revealed) — true for the trie of i.i.d. paths in order of first appearance and for
distinct first tokens (module doc of :mod:`coupling.rules.trie`).

Claims and their status
-----------------------
* Lossless: proved in the paper; derived above; checked by exact enumeration of whole output
  streams (TV < 1e-12 in float, equality in Fractions; ``tests/rules/test_traversal.py``,
  ``proofs/trees_lossless.py``), with three broken variants that fail (:data:`CONTROLS`).
* ``k = 1`` is block verification coin for coin (derived: the candidates are the depths
  :math:`\gamma, \gamma - 1, \dots, 0` with block verification's :math:`h_i`, and
  :math:`\tau = \max\{i : \eta_i < h_i\}`); checked exactly (``proofs/traversal_block.py``).
* Traversal accepts at least as much as block verification of path 0 (derived: the nodes of
  path 0 start their processing with block verification's weights :math:`w_i`, so by the
  invariant :math:`P(\tau \ge i \mid x^i) \ge w_i(x^i) = P(\tau_{\mathrm{block}} \ge i \mid
  x^i)`); the invariant on path 0 is checked exactly (``proofs/traversal_invariant.py``);
  no general proof in exact rationals.
* The paper's toy (a parent of ratio 1/2, a child of ratio 4/3): token-level acceptance of the
  two tokens 1/2, traversal's :math:`\min(1/2 \cdot 4/3, 1) = 2/3` (checked exactly).
* On i.i.d. trees traversal can accept *less* than the token-level walk with recursive
  rejection sampling (derived; exact instance ``gamma = 1``, ``k = 2``,
  :math:`p = (3/5, 0, 2/5)`, :math:`q = (2/5, 3/5, 0)`: 12/25 against 3/5): a sibling revealed
  after a rejection is calibrated against its law *given that it exists*,
  :math:`s(x) = q(x) / (1 - q(c))`, while it exists only with probability about
  :math:`1 - q(c)`, so it serves :math:`\sum_x \min(r(x)(1 - q(c)), q(x))` of target mass
  where the walk serves :math:`\sum_x \min(r(x), q(x))`.

Static trees of any shape (:class:`coupling.Tree`)
--------------------------------------------------
The same schedule runs on the trie of a drafted static tree (:func:`topology_trie`): one node
per distinct drafted prefix, so coinciding i.i.d. siblings merge with their subtrees, and
children in order of first appearance in the tree's node order. A node's next child, given
everything revealed, is then the next distinct token among i.i.d. draws of a number fixed by
what was revealed (or a successive draw without replacement), which has law :math:`s`: the
condition above. Checked by exact enumeration of whole output streams on random topologies
of up to six nodes (``tests/test_topology.py``); on ``Tree.from_chains`` it is the chain
schedule, decision for decision. The batched twin takes trees of chains only.

Information model: the drafted tree and :math:`p, q` at its nodes (whole vectors; the
residual updates read them). Optimality gap: :func:`coupling.full_information_tree_accepted`
bounds it (``benchmarks/bench_trees.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ...tree import Tree
from ..common import categorical
from ..trie import NegativeControl, TreeLaw, TreeRule, Trie, build_trie, unit_of

__all__ = ["Step", "schedule", "verify_block", "law", "topology_trie", "topology_schedule",
           "verify_topology", "topology_law", "Traversal", "TraversalControl", "RULE",
           "CONTROLS"]

#: Deliberately broken variants (negative controls), each a plausible mistake:
CONTROLS = {
    "plain_residual": "the parent's law becomes norm((r - s)_+), ignoring its weight",
    "keep_sibling": "a rejected child stays in its parent's draft law (as if siblings were "
                    "drawn with replacement)",
    "sibling_weight": "the parent's weight becomes min(rho / (1 - s(c)), 1) instead of "
                      "rho / (rho + 1 - w) (the update of a public third-party "
                      "reimplementation)",
}


class Step(NamedTuple):
    """One candidate: accept ``node`` with probability ``accept``, then emit from ``law``."""

    node: int
    accept: object
    law: np.ndarray


class _State:
    """Weights ``w``, target laws ``r``, draft laws ``s`` and remaining children per node;
    ``r[n]``, ``s[n]`` start as the laws after node ``n``'s prefix (``s`` only where ``n`` has
    children)."""

    def __init__(self, trie: Trie, r: list[np.ndarray], s: list[np.ndarray | None]):
        self.trie, self.one = trie, unit_of(r[0])
        self.r = [x.copy() for x in r]
        self.s = [None if x is None else x.copy() for x in s]
        self.w = [self.one] * trie.size
        self.kids = [list(c) for c in trie.children]
        self.reweigh(0)

    def first_leaf(self) -> int:
        c = 0
        while self.kids[c]:
            c = self.kids[c][0]
        return c

    def reweigh(self, v: int) -> None:
        """The weights of ``v``'s remaining descendants, top-down from ``w[v]``."""
        stack = [v]
        while stack:
            u = stack.pop()
            for c in self.kids[u]:
                t = self.trie.token(c)
                s_t = self.s[u][t]
                with np.errstate(over="ignore"):    # a subnormal s_t: +inf, capped at 1
                    self.w[c] = min(self.w[u] * self.r[u][t] / s_t, self.one) if s_t > 0 \
                        else 0 * self.one
                stack.append(c)

    def reject(self, c: int, control: str | None) -> None:
        """Delete the rejected leaf ``c`` and update its parent (module doc)."""
        v, t, one = self.trie.parent[c], self.trie.token(c), self.one
        w, r, s = self.w[v], self.r[v], self.s[v]
        self.kids[v].remove(c)
        res = np.maximum((one if control == "plain_residual" else w) * r - s, 0 * one)
        rho = res.sum()
        den = rho + one - w
        # den = 0 needs w = 1 and r = s: then w_c = 1 and the rejection had probability 0
        self.w[v] = rho / den if den > 0 else one
        if control == "sibling_weight":
            rest = one - s[t]
            self.w[v] = min(rho / rest, one) if rest > 0 else 0 * one
        if rho > 0:
            self.r[v] = res / rho
        if control != "keep_sibling":
            rest = one - s[t]
            s = s.copy()
            s[t] = 0 * one
            self.s[v] = s / rest if rest > 0 else s
        self.reweigh(v)


def schedule(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *,
             control: str | None = None) -> Iterator[Step]:
    """The candidates in the order traversal visits them, each with its acceptance probability.

    Validated inputs (float64, or exact Fraction ``object`` arrays: exact results). The
    sequence does not depend on the coins; the last candidate is the root, with ``accept = 1``.
    """
    trie = build_trie(drafts)
    gamma = p.shape[1] - 1
    r = [p[trie.branch[n], trie.depth(n)] for n in range(trie.size)]
    s = [q[trie.branch[n], trie.depth(n)] if trie.depth(n) < gamma else None
         for n in range(trie.size)]
    return _schedule(_State(trie, r, s), control)


def _schedule(state: _State, control: str | None) -> Iterator[Step]:
    while True:
        c = state.first_leaf()
        if c == 0:
            yield Step(0, state.one, state.r[0])
            return
        yield Step(c, state.w[c], state.r[c])
        state.reject(c, control)


def topology_trie(tree: Tree, drafts: np.ndarray) -> tuple[Trie, tuple[int, ...]]:
    """The trie of a drafted static tree of any shape (:class:`coupling.Tree`): one node per
    distinct drafted prefix (coinciding i.i.d. siblings merge, with their subtrees), children
    in order of first appearance in the tree's node order; and for each trie node the first
    tree node with its prefix (``-1`` for the root), whose laws and coin it takes.

    On ``Tree.from_chains(k, gamma)`` it is :func:`build_trie`'s trie up to the numbering, so
    the schedule is the chain schedule."""
    index: dict[tuple[int, ...], int] = {(): 0}
    prefix: list[tuple[int, ...]] = [()]
    parent, first = [-1], [-1]
    children: list[list[int]] = [[]]
    node_prefix: list[tuple[int, ...]] = []
    for n, a in enumerate(tree.parent):
        key = (node_prefix[a] if a >= 0 else ()) + (int(drafts[n]),)
        node_prefix.append(key)
        if key not in index:
            up = index[key[:-1]]
            index[key] = len(prefix)
            children[up].append(len(prefix))
            prefix.append(key)
            parent.append(up)
            children.append([])
            first.append(n)
    trie = Trie(tuple(prefix), tuple(parent), tuple(tuple(c) for c in children), tuple(first))
    return trie, tuple(first)


def topology_schedule(tree: Tree, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *,
                      control: str | None = None) -> tuple[Trie, Iterator[Step]]:
    """:func:`schedule` on a static tree: ``drafts [N]`` in node order, ``p``, ``q``
    ``[N + 1, V]`` (:mod:`coupling.rules.topology`'s layout; validated rows). Returns the
    trie (:func:`topology_trie`; ``trie.branch`` holds each node's first tree node) and the
    candidates."""
    trie, first = topology_trie(tree, drafts)
    r = [p[1 + first[n]] for n in range(trie.size)]
    s = [q[1 + first[n]] if trie.children[n] else None for n in range(trie.size)]
    return trie, _schedule(_State(trie, r, s), control)


def verify_topology(tree: Tree, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                    coins: np.ndarray, u: np.ndarray, *,
                    control: str | None = None) -> tuple[int, int, int]:
    """Deterministic core on a static tree: ``(accepted, node, next_token)``, ``node`` the
    deepest accepted tree node (the first with the accepted prefix; ``-1``: none). A
    candidate is accepted iff its first tree node's coin ``coins[n] < w``; the token is drawn
    from its law with ``u[depth]``."""
    trie, steps = topology_schedule(tree, drafts, p, q, control=control)
    for step in steps:
        n = trie.branch[step.node]
        if step.node == 0 or coins[n] < step.accept:
            d = trie.depth(step.node)
            return d, n, categorical(step.law, float(u[d]))
    raise AssertionError("the schedule always ends at the root")


def topology_law(tree: Tree, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *,
                 control: str | None = None) -> TreeLaw:
    """:func:`law` on a static tree (layout of :func:`topology_schedule`)."""
    trie, steps = topology_schedule(tree, drafts, p, q, control=control)
    return _law(trie, steps, unit_of(p))


def verify_block(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, coins: np.ndarray,
           u: np.ndarray, *, control: str | None = None) -> tuple[int, int, int]:
    """Deterministic core on a validated float tree: ``(accepted, branch, next_token)``.

    A candidate at depth ``d`` whose lowest path is ``j`` is accepted iff
    ``coins[d - 1, j] < w`` (strict, so a uniform in ``[0, 1)`` passes with probability
    exactly ``w``); the emitted token is drawn from its law with ``u[d]``.
    """
    trie = build_trie(drafts)
    for step in schedule(drafts, p, q, control=control):
        d, b = trie.depth(step.node), trie.branch[step.node]
        if step.node == 0 or coins[d - 1, b] < step.accept:
            return d, b, categorical(step.law, float(u[d]))
    raise AssertionError("the schedule always ends at the root")


def law(drafts: np.ndarray, p: np.ndarray, q: np.ndarray, *,
        control: str | None = None) -> TreeLaw:
    r"""Exact law of one call given the validated tree: ``[(prefix, probability, next law)]``,
    :math:`P(\text{stop at candidate } t) = a_t \prod_{s<t} (1 - a_s)`."""
    return _law(build_trie(drafts), schedule(drafts, p, q, control=control), unit_of(p))


def _law(trie: Trie, steps: Iterator[Step], one) -> TreeLaw:
    out, alive = [], one
    for step in steps:
        pr = alive * step.accept
        if pr != 0:
            out.append((trie.prefix[step.node], pr, step.law))
        alive = alive * (1 - step.accept)
    return out


class Traversal(TreeRule):
    """Traversal verification (module doc)."""

    name = "traversal"
    twin = "coupling.rules.traversal.torch"
    title = "traversal verification: a draft tree judged leaf to root, sequence by sequence"
    reference = "Weng et al., arXiv:2505.12398, NeurIPS 2025"
    draft_laws = (True, False)
    bound_text = (">= block verification of branch 0 (derived); <= the multi-path verifier LP "
                  "(coupling.full_information_tree_accepted)")
    #: the negative control's mistake (a key of :data:`CONTROLS`), None for the rule itself
    control: str | None = None

    def tree_law(self, drafts, p, q, replacement) -> TreeLaw:
        return law(drafts, p, q, control=self.control)

    def _verify_block(self, drafts, p, q, coins, u, replacement) -> tuple[int, int, int]:
        return verify_block(drafts, p, q, coins, u, control=self.control)

    def topology_law(self, tree: Tree, drafts, p, q) -> TreeLaw:
        """:func:`topology_law`: the exact law of a call on a drafted static tree."""
        return topology_law(tree, drafts, p, q, control=self.control)

    def verify_topology(self, tree: Tree, drafts, p, q, coins, u) -> tuple[int, int, int]:
        """:func:`verify_topology`: the deterministic core on a static tree."""
        return verify_topology(tree, drafts, p, q, coins, u, control=self.control)


class TraversalControl(NegativeControl, Traversal):
    """A deliberately broken traversal (:data:`CONTROLS`)."""

    controls = CONTROLS

    def __init__(self, control: str):
        self._break(control)


RULE = Traversal()
