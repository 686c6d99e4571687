"""``traversal``'s batched torch twin, held to the numpy core: the same decisions on the same
uniforms, also where rejections leave no residual and where the pool doubles, and the exact
law on one tree (keyed parity, batch invariance, one path and CUDA:
``tests/rules/test_twins.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coupling import RULES
from coupling.rules import traversal
from coupling.rules.traversal import TraversalControl
from coupling.rules.traversal import torch as traversal_torch
from coupling.rules.traversal.torch import postorder, slots
from coupling.rules.trie import build_trie
from tests.rules.tree_twins import (
    numpy_verdicts,
    outcome_pvalue,
    twin_verdicts,
)
from tests.strategies import drafted_trees

TRAVERSAL = RULES["traversal"]


def _sparse(P: np.ndarray) -> np.ndarray:
    """Target laws with their small entries set to exact zeros (renormalised)."""
    P = np.where(P < 0.15, 0.0, P)
    return P / P.sum(-1, keepdims=True)


@pytest.mark.parametrize("V, gamma, k, rep", [(2, 3, 4, True), (3, 2, 3, True),
                                              (4, 3, 2, True), (3, 3, 3, False),
                                              (5, 2, 2, False), (4, 4, 1, True)])
@pytest.mark.parametrize("conc, sparse", [(0.3, False), (1.0, True)])
def test_same_uniforms_same_decisions_as_numpy(V, gamma, k, rep, conc, sparse):
    drafts, P, Q = drafted_trees(V, gamma, k, 300, replacement=rep, seed=V + gamma, conc=conc)
    if sparse:
        P = _sparse(P)
    rng = np.random.default_rng(k)
    coins, u = rng.random((300, gamma, k)), rng.random((300, gamma + 1))
    assert twin_verdicts(TRAVERSAL, drafts, P, Q, coins, u, replacement=rep) \
        == numpy_verdicts(TRAVERSAL, drafts, P, Q, coins, u, replacement=rep)


def test_rejections_without_residual_make_the_numpy_cores_decisions():
    """Below the root the draft laws equal the target laws, so a rejected child leaves its
    parent no residual (rho = 0: the parent's weight drops to 0 and its law stays); the twin
    takes that path and still makes the numpy core's decisions."""
    drafts, P, Q = drafted_trees(3, 3, 3, 300, seed=5)
    Q[:, :, 1:] = P[:, :, 1:3]
    rng = np.random.default_rng(1)
    coins, u = rng.random((300, 3, 3)), rng.random((300, 4))
    assert twin_verdicts(TRAVERSAL, drafts, P, Q, coins, u) \
        == numpy_verdicts(TRAVERSAL, drafts, P, Q, coins, u)


def test_a_pool_that_doubles_makes_the_same_decisions(monkeypatch):
    """The pool of target laws grown by doubling (as on an accelerator) instead of reserved
    whole (as on a CPU): the numpy core's decisions on trees that reject deep."""
    monkeypatch.setattr(traversal_torch, "RESERVE_WHOLE", frozenset())
    drafts, P, Q = drafted_trees(4, 3, 3, 300, seed=7, conc=0.3)
    rng = np.random.default_rng(3)
    coins, u = rng.random((300, 3, 3)), rng.random((300, 4))
    assert twin_verdicts(TRAVERSAL, drafts, P, Q, coins, u) \
        == numpy_verdicts(TRAVERSAL, drafts, P, Q, coins, u)


def test_the_twin_samples_the_exact_law_of_a_tree():
    """20000 keyed copies of one three-path tree against traversal.law: chi-square with
    false-positive rate 1e-3 (fixed seeds); the law of the plain-residual control is
    rejected by the same counts."""
    drafts, P, Q = drafted_trees(3, 2, 3, 1, seed=23, conc=1.0)
    x, p, q = drafts[0], P[0], Q[0]
    law = traversal.law(x, p, q)
    assert len(law) == 5                    # five candidates of positive probability
    assert outcome_pvalue(TRAVERSAL, law, x, p, q, 20_000) > 1e-3
    broken = TraversalControl("plain_residual").tree_law(x, p, q, True)
    assert outcome_pvalue(TRAVERSAL, broken, x, p, q, 20_000) < 1e-6


def test_slots_are_the_trie():
    """Slot (j, i) is in use iff path j is the lowest through its depth-i prefix."""
    drafts, _, _ = drafted_trees(2, 3, 4, 50, seed=3)
    low, owner = slots(torch.tensor(drafts))
    for b in range(50):
        for j in range(4):
            for i in range(4):
                same = [jj for jj in range(4) if (drafts[b, jj, :i] == drafts[b, j, :i]).all()]
                assert low[b, j, i] == same[0] and bool(owner[b, j, i]) == (same[0] == j)


def test_inputs_are_checked():
    drafts, P, Q = drafted_trees(3, 2, 2, 2, seed=1)
    d = torch.tensor(drafts)
    d[:, 1, 0] = d[:, 0, 0]
    with pytest.raises(ValueError, match="distinct first tokens"):
        TRAVERSAL.torch.verify(d, torch.tensor(P), torch.tensor(Q), seeds=0, positions=0,
                               replacement=False)
    with pytest.raises(ValueError, match=r"accept_u must be \[B, gamma, k\]"):
        TRAVERSAL.torch.verify(torch.tensor(drafts), torch.tensor(P), torch.tensor(Q), seeds=0,
                               positions=0, accept_u=torch.zeros(2, 2, 3))


def _postorder_walk(children: list[list[int]], node: int = 0) -> list[int]:
    """The trie's nodes below ``node`` in depth-first post-order, recursively."""
    return [n for c in children[node] for n in _postorder_walk(children, c)] + [node]


def test_postorder_lists_the_trie_depth_first():
    """The used slots in :func:`postorder` sequence are the trie's nodes in the order of a
    recursive depth-first post-order walk (children by first appearance), the deletion order
    of traversal's candidates, on random trees with shared prefixes; the unused slots
    follow."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        k, g = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        drafts = rng.integers(0, 3, (k, g))
        trie = build_trie(drafts)
        walk = _postorder_walk(trie.children)
        seq_j, seq_d = postorder(slots(torch.tensor(drafts)[None])[0])
        got = list(zip(seq_j[0].tolist(), seq_d[0].tolist(), strict=True))
        assert got[: len(walk)] == [(trie.branch[n], trie.depth(n)) for n in walk]
        assert len(set(got)) == k * (g + 1)
