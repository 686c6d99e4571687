r"""What the coupling analysis predicts for a run, from the laws a call actually saw.

A call records, along every branch, the target laws :math:`p_1..p_{g+1}` and draft laws
:math:`q_1..q_g` at the drafted prefixes. From them each rule predicts its tokens per call
(:meth:`~coupling.rules.base.Rule.predict`, :meth:`~coupling.rules.base.Rule.expected_tokens`):

* single-step rules compose their closed-form acceptance :math:`\beta_i` per offset as if
  offsets were independent, :math:`\sum_{j=0}^{g} \prod_{i \le j} \beta_i`, with as many drafts
  at offset ``i`` as branches shared the chosen branch's prefix there (``k_1 = k``; without
  replacement ``k_i = 1`` after the first offset). ``token``: :math:`\beta = 1 - TV`;
  ``gumbel``: the exact collision probability; ``kseq``, ``rrs``, ``optimal``: their
  acceptance with :math:`k_i` drafts;
* ``block`` has no position-wise acceptance; its prediction is Sun et al.'s identity
  :math:`P(\tau \ge i \mid X^i) = w_i`: :math:`1 + \sum_i w_i`, an unbiased estimate of the
  call's tokens (it conditions each term on the prefix only, so its average over calls is the
  block efficiency).

:func:`optimal_tokens` is the same composition for the LP-optimal verifier of the rule's own
information model (its ``k`` branches' draft law), on the same laws: what a better verifier
could have gained. :func:`conditional_tokens` is the exact expected tokens given the whole
drafted path for the chain rules (``token``: :math:`1 + \sum_j \prod_{i \le j}
\min(1, r_i)`; ``block``: from its exact path law, :func:`coupling.sequence.path_law`), so two
runs can be compared on identical drafts. The gap between a composed prediction and the
conditional expectation measures how far position-wise composition is off on real text.

On a static draft tree of any shape (:class:`coupling.Tree`) the laws at every drafted node
are seen, so :func:`conditional_tree_tokens` gives the exact expected tokens of the call given
the drafted tree, for a rule that states which try accepts given the drafts
(``rule.try_law``: ``token``, ``rrs``; the walk of :mod:`coupling.rules.topology`, averaged
over its coins and draws) or the law of a call given the tree (``rule.topology_law``:
``traversal``).

Closed forms run in float64 on the union of the supports of :math:`p_i` and :math:`q_i`.
"""

from __future__ import annotations

import numpy as np

from ..dist import validate_replacement
from ..rules import RULES, Rule, get_rule
from ..rules.topology import check_tree_rule
from ..tree import Tree

__all__ = ["check_record", "predicted_tokens", "optimal_tokens", "conditional_tokens",
           "conditional_tree_tokens", "values_trees", "node_reach"]


def check_record(drafts, p, q, branch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """One call's record as arrays: ``drafts [k, g]`` token ids, ``p [k, g + 1, V]``,
    ``q [k, g, V]``, ``branch`` in ``[0, k)``, and the chosen branch's drafts possible under
    ``q`` (a draft with ``q = 0`` was not sampled from ``q``). ``ValueError`` naming the
    argument otherwise."""
    d, P, Q = np.asarray(drafts), np.asarray(p), np.asarray(q)
    if d.ndim != 2 or d.dtype.kind not in "iu":
        raise ValueError(f"drafts must be an integer array [k, g], got shape {d.shape} of dtype "
                         f"{d.dtype}")
    k, g = d.shape
    if Q.ndim != 3 or Q.shape[:2] != (k, g):
        raise ValueError(f"q must be [k, g, V] = [{k}, {g}, V] for drafts [{k}, {g}], got "
                         f"{Q.shape}")
    V = Q.shape[2]
    if P.shape != (k, g + 1, V):
        raise ValueError(f"p must be [k, g + 1, V] = [{k}, {g + 1}, {V}], got {P.shape}")
    if isinstance(branch, bool) or not isinstance(branch, (int, np.integer)) \
            or not 0 <= branch < k:
        raise ValueError(f"branch={branch!r} must be an integer in [0, {k})")
    if d.size and (d.min() < 0 or d.max() >= V):
        raise ValueError(f"drafts must be token ids in [0, {V}), got values in "
                         f"[{d.min()}, {d.max()}]")
    if g and not (Q[branch, np.arange(g), d[branch]] > 0).all():
        raise ValueError("q gives probability 0 to a draft of the chosen branch: the drafts were "
                         "not sampled from q (pass the law they were drawn from)")
    return d.astype(np.int64), P, Q, int(branch)


def predicted_tokens(rule: str | Rule, drafts, p, q, branch: int, *,
                     replacement: bool = True) -> tuple[float, list[float]]:
    """``(predicted tokens per call, per-offset acceptances)`` of ``rule`` on one recorded
    call (module doc)."""
    r = get_rule(rule)
    d, P, Q, b = check_record(drafts, p, q, branch)
    _, replacement = r.require(d.shape[0], validate_replacement(replacement))
    beta = r.predict(d, P, Q, b, replacement=replacement)
    return r.expected_tokens(beta), beta


def optimal_tokens(drafts, p, q, branch: int, *, replacement: bool = True) -> float:
    """Tokens per call the LP-optimal verifier of the same draft law predicts on one recorded
    call (module doc)."""
    return predicted_tokens(RULES["optimal"], drafts, p, q, branch, replacement=replacement)[0]


def conditional_tokens(rule: str | Rule, drafts, p, q, branch: int) -> float:
    """Exact expected tokens of a chain rule (``token`` or ``block``) given the chosen
    branch's whole drafted path (module doc)."""
    r = get_rule(rule)
    if not callable(getattr(r, "path_law", None)):
        raise ValueError(f"conditional_tokens needs a rule with an exact path law "
                         f"(rule.path_law: token, block), not {r.name!r}")
    d, P, Q, b = check_record(drafts, p, q, branch)
    x = d[b]
    P64, Q64 = np.asarray(P[b], dtype=np.float64), np.asarray(Q[b], dtype=np.float64)
    tau, _ = r.path_law(x, P64 / P64.sum(-1, keepdims=True), Q64 / Q64.sum(-1, keepdims=True))
    return 1.0 + float(np.arange(tau.size) @ tau)


def conditional_tree_tokens(rule: str | Rule, tree: Tree, drafts, p, q) -> float:
    """Exact expected tokens of one call of ``rule`` on the drafted static ``tree``, given its
    drafts ``[N]`` and the laws ``p``, ``q`` ``[N + 1, V]`` at the root and after every node
    (:mod:`coupling.rules.topology`'s layout), for a rule with ``try_law``.

    >>> from coupling import Tree
    >>> p = np.array([[0.5, 0.5]] * 5); q = np.array([[1.0, 0.0]] * 5)
    >>> conditional_tree_tokens("rrs", Tree.from_branching([2, 1]), [0, 0, 0, 0], p, q)
    1.75
    """
    r = get_rule(rule)
    judged = callable(getattr(r, "topology_law", None))
    if not values_trees(r):
        raise ValueError(f"conditional_tree_tokens needs a rule that states which try accepts "
                         f"given the drafts (rule.try_law: token, rrs) or the law of a call "
                         f"given the tree (rule.topology_law: traversal), not {r.name!r}")
    d, P, Q = _tree_call(r, tree, drafts, p, q)
    if judged:
        return 1.0 + sum(len(pre) * float(pr) for pre, pr, _ in r.topology_law(tree, d, P, Q))
    replacement = tree.children == "iid"

    def value(S: tuple[int, ...]) -> float:
        C = sorted(c for a in S for c in tree.kids[a])   # node order, as the twin's columns
        if not C:
            return 1.0                                  # the bonus token
        law = r.try_law(P[1 + S[0]], Q[1 + S[0]], d[C], replacement)
        out = float(law[-1])
        for i, c in enumerate(C):
            if law[i] > 0:
                out += float(law[i]) * (1.0 + value(tuple(m for m in C if d[m] == d[c])))
        return out

    return value((-1,))


def values_trees(rule: str | Rule) -> bool:
    """Whether :func:`conditional_tree_tokens` takes ``rule`` (``try_law`` or
    ``topology_law``)."""
    r = get_rule(rule)
    return any(callable(getattr(r, f, None)) for f in ("try_law", "topology_law"))


def node_reach(rule: str | Rule, tree: Tree, drafts, p, q) -> np.ndarray:
    """``[N]``: the probability, given the drafted tree, that the walk of a rule with
    ``try_law`` passes through each node (the node drafted an emitted prefix); layout of
    :func:`conditional_tree_tokens`. With children drawn without replacement no two nodes
    share a prefix, so ``1 + reach.sum()`` is the conditional tokens per call, a sum over
    nodes that :func:`coupling.sequence.plan.best_tree` maximises.

    >>> from coupling import Tree
    >>> p = np.array([[0.5, 0.5]] * 3); q = np.array([[1.0, 0.0]] * 3)
    >>> node_reach("rrs", Tree.chain(2), [0, 0], p, q).tolist()
    [0.5, 0.25]
    """
    r = get_rule(rule)
    if not callable(getattr(r, "try_law", None)):
        raise ValueError(f"node_reach needs a rule with try_law (token, rrs), not {r.name!r}")
    d, P, Q = _tree_call(r, tree, drafts, p, q)
    replacement = tree.children == "iid"
    reach = np.zeros(tree.size)

    def walk(S: tuple[int, ...], mass: float) -> None:
        C = sorted(c for a in S for c in tree.kids[a])
        if not C:
            return
        law = r.try_law(P[1 + S[0]], Q[1 + S[0]], d[C], replacement)
        for i, c in enumerate(C):
            if law[i] > 0:
                nxt = tuple(m for m in C if d[m] == d[c])
                reach[list(nxt)] += mass * float(law[i])
                walk(nxt, mass * float(law[i]))

    walk((-1,), 1.0)
    return reach


def _tree_call(r: Rule, tree: Tree, drafts, p, q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One call's validated drafts ``[N]`` and normalised float64 laws ``[N + 1, V]``."""
    check_tree_rule(r, tree)
    d = np.asarray(drafts, dtype=np.int64).reshape(-1)
    P, Q = (np.asarray(a, dtype=np.float64) for a in (p, q))
    if d.shape != (tree.size,) or P.shape != Q.shape or P.ndim != 2 \
            or P.shape[0] != tree.size + 1:
        raise ValueError(f"a {tree.size}-node tree takes drafts [N] and p, q [N + 1, V]; got "
                         f"{d.shape}, {P.shape}, {Q.shape}")
    return d, P / P.sum(-1, keepdims=True), Q / Q.sum(-1, keepdims=True)
