"""Draft trees of any shape (:class:`coupling.Tree`) in the exact analysis.

* the constructors agree (branching, path lists, chains, named layouts) and a bad topology is
  a ``ValueError`` that names the problem;
* ``Tree.from_chains(k, gamma)`` gives today's numbers bit for bit, and the walk on a topology
  reproduces the chain walk on such a tree to rounding (it is the same walk);
* lossless on every topology: the exact law of the generated stream equals the target's
  (TV < 1e-12) for random trees of up to 6 nodes (hypothesis) and the named trees, for every
  rule that can verify them; a lossy rule fails the same check;
* the exact accepted length agrees with an independent sampler of the same walk (5 sigma);
* no rule beats the tree LP's optimum on the same tree, and the LP of a tree of chains is the
  k-path LP;
* the batched twins on a topology (``coupling.verify(..., tree=)``) decide as the numpy walk on
  the same keyed numbers, as the chain twins on a tree of chains, and sample the walk's law.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import coupling
from coupling import RULES, TabularLM, Tree
from coupling.lm import check_models
from coupling.rules.topology import check_tree_rule
from coupling.sequence.topology import topology_outcomes, tree_outcomes
from coupling.sequence.tree_lp import full_information_tree_accepted

#: the lossless rules that verify a topology node by node
WALK_RULES = [n for n, r in RULES.items() if r.lossless and r.unit == "token"
              and not r.shared_noise and not r.own_draft_law]


def pair(V: int, seed: int = 0):
    return (TabularLM(V, order=1, seed=seed, concentration=0.6),
            TabularLM(V, order=1, seed=seed + 1, concentration=0.6))


# ----------------------------------------------------------------------------- the type
def test_the_forms_of_a_tree_agree():
    t = Tree.from_branching([2, 2])
    assert Tree.from_paths(t.paths()).parent == t.parent
    assert t.size == 6 and t.depth == 2 and t.children_of(-1) == (0, 1)
    assert Tree.chain(3).parent == (-1, 0, 1)
    assert Tree.from_chains(2, 3).parent == (-1, -1, 0, 1, 2, 3)
    assert Tree.from_chains(2, 3).chains() == (2, 3, True)
    assert Tree.from_chains(2, 3, replacement=False).chains() == (2, 3, False)
    assert Tree.from_branching([3, 2]).chains() is None
    for name, size, depth in [("medusa", 63, 4), ("eagle", 25, 5), ("specinfer", 20, 8)]:
        assert (Tree.named(name).size, Tree.named(name).depth) == (size, depth)
        assert Tree.named(name, size=8).size == 8    # a prefix of the list is a tree


def test_a_tree_from_a_command_line_spec(tmp_path):
    assert Tree.from_spec("3,2,1") == Tree.from_branching([3, 2, 1])
    assert Tree.from_spec("eagle:8", "topk") == Tree.named("eagle", size=8)
    assert Tree.from_spec("medusa").size == 63
    f = tmp_path / "t.json"
    f.write_text("[[0], [1], [0, 0]]")
    assert Tree.from_spec(str(f)).parent == (-1, -1, 0)
    assert Tree.from_branching([2, 2]).path_to(5) == [1, 5] and Tree.chain(2).path_to(-1) == []
    for spec, match in (("3,a", "per-depth widths"), ("eagle:x", "must be an int"),
                        ("eagle:0", "size must be"), (str(tmp_path / "no.json"), "tree file"),
                        ("0,2", "positive ints")):
        with pytest.raises(ValueError, match=match):
            Tree.from_spec(spec)


@pytest.mark.parametrize("make, match", [
    (lambda: Tree(()), "at least one node"),
    (lambda: Tree((-1, 2, 1)), "earlier node"),
    (lambda: Tree((0,)), "earlier node"),                       # its own parent: a cycle
    (lambda: Tree((-1,), children="random"), "no child law"),
    (lambda: Tree.from_paths([(0, 0)]), "before its parent"),
    (lambda: Tree.from_paths([(1,)]), "ranks run 0, 1, 2"),
    (lambda: Tree.from_paths([(0,), (0,)]), "appears twice"),
    (lambda: Tree.from_branching([2, 0]), "positive ints"),
    (lambda: Tree.from_chains(0, 2), "k must be"),
    (lambda: Tree.named("sequoia"), "unknown tree"),
    (lambda: Tree.named("eagle", size=99), "size must be"),
])
def test_bad_topologies_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_rules_that_cannot_verify_a_topology_say_why():
    t, d = pair(3)
    wide = Tree.from_branching([2, 1])
    ragged = Tree.from_paths([(0,), (1,), (0, 0)])
    for rule, tree, why in [("block", ragged, "whole"), ("gbv", ragged, "whole"),
                            ("traversal", Tree.from_branching([2], children="topk"),
                             "drafter-inv"),
                            ("gumbel", ragged, "noise columns"),
                            ("greedy", Tree.from_branching([2, 2]), "own law"),
                            ("rrs", Tree.from_branching([2], children="topk"), "drafter-inv"),
                            ("token", ragged, "one draft")]:
        with pytest.raises(ValueError, match=why):
            coupling.block_efficiency(rule, t, d, tree=tree)
    with pytest.raises(ValueError, match="vocabulary has 3 tokens"):
        coupling.block_efficiency("rrs", t, d, tree=Tree.from_paths(
            [(0,), (1,), (2,), (3,), (0, 0), (0, 1)], children="distinct"))
    with pytest.raises(ValueError, match="leave gamma, k and replacement out"):
        coupling.block_efficiency("rrs", t, d, 2, tree=wide)
    with pytest.raises(TypeError, match="coupling.Tree"):
        coupling.block_efficiency("rrs", t, d, tree=[3, 2])


# ----------------------------------------------------------------------------- chains
@pytest.mark.parametrize("k, gamma, replacement", [(1, 3, True), (2, 2, True), (3, 2, True),
                                                    (2, 2, False)])
def test_chains_give_todays_numbers_and_the_topology_walk_agrees(k, gamma, replacement):
    t, d = pair(3)
    T, D, ctx = check_models(t, d, ())
    tree = Tree.from_chains(k, gamma, replacement=replacement)
    for name, rule in RULES.items():
        if not rule.supports(k, replacement):
            continue
        want = coupling.block_efficiency(name, t, d, gamma, k=k, replacement=replacement)
        assert coupling.block_efficiency(name, t, d, tree=tree) == want, name
        if rule.unit != "token" or rule.shared_noise or rule.own_draft_law and k > 1:
            continue
        a, b = _law(tree_outcomes(rule, T, D, tree, ctx)), _law(
            topology_outcomes(rule, T, D, tree, ctx))
        assert max(abs(a.get(o, 0) - b.get(o, 0)) for o in set(a) | set(b)) < 1e-12, name


def _law(outcomes) -> dict:
    out: dict = {}
    for emitted, tau, pr in outcomes:
        out[(emitted, tau)] = out.get((emitted, tau), 0.0) + float(pr)
    return out


# ----------------------------------------------------------------------------- lossless
@st.composite
def topologies(draw, max_nodes: int = 6):
    n = draw(st.integers(1, max_nodes))
    parent = tuple(draw(st.integers(-1, i - 1)) for i in range(n))
    return Tree(parent, draw(st.sampled_from(["iid", "distinct", "topk"])))


def _stream_tv(rule, t, d, tree, length: int) -> float:
    got = coupling.stream_law(rule, t, d, None, length, tree=tree)
    return 0.5 * float(np.abs(got - coupling.target_law(t, length)).sum())


@given(topologies(), st.integers(2, 3), st.integers(0, 50), st.sampled_from(WALK_RULES))
def test_every_topology_is_lossless(tree, V, seed, name):
    t, d = pair(V, seed)
    try:
        check_tree_rule(RULES[name], tree)
    except ValueError:
        assume(False)
    assume(max(len(c) for c in tree.kids) <= V or tree.children == "iid")
    assert _stream_tv(name, t, d, tree, min(tree.depth + 1, 3)) < 1e-12


@given(topologies(), st.integers(2, 3), st.integers(0, 50))
def test_traversal_is_lossless_on_every_topology(tree, V, seed):
    """Traversal verification judges the trie of the drafted tree leaf to root: coinciding
    i.i.d. siblings merge with their subtrees, children in order of first appearance."""
    t, d = pair(V, seed)
    assume(tree.children != "topk")
    assume(max(len(c) for c in tree.kids) <= V or tree.children == "iid")
    assume(V ** tree.size <= 3 ** 6)
    assert _stream_tv("traversal", t, d, tree, min(tree.depth + 1, 3)) < 1e-12


def test_traversal_on_a_tree_of_chains_is_the_chain_rule_and_its_controls_fail():
    """On Tree.from_chains the topology schedule is the chain schedule: the same exact law of
    a call, and on the same keyed numbers the same decisions; each broken variant fails the
    losslessness check on a topology."""
    from coupling.rules.topology import tree_uniforms, walk_topology
    from coupling.rules.traversal import CONTROLS, TraversalControl
    from coupling.sequence.topology import judged_outcomes

    t, d = pair(3, 21)
    T, D, ctx = check_models(t, d, ())
    rule = RULES["traversal"]
    for replacement in (True, False):
        tree = Tree.from_chains(2, 2, replacement=replacement)
        a = _law(judged_outcomes(rule, T, D, tree, ctx))
        b = _law(rule.outcomes(T, D, 2, ctx, k=2, replacement=replacement))
        assert max(abs(a.get(o, 0) - b.get(o, 0)) for o in set(a) | set(b)) < 1e-12
    tree, rng = Tree.from_chains(3, 2), np.random.default_rng(2)
    X, P, Q = _tree_inputs(tree, 3, 60, rng)
    for b in range(60):
        coins, u = tree_uniforms(rule, b, 7, tree)
        tau, node, y = walk_topology(rule, tree, X[b], P[b], Q[b], coins, u)
        chain = X[b].reshape(2, 3).T                          # [k, gamma]: branch j, offset i
        rows = np.concatenate([np.zeros((3, 1), int), np.arange(6).reshape(2, 3).T + 1], 1)
        c_coins, c_u = rule.call_uniforms(b, 7, 2, 3)
        tau2, branch, y2 = rule.verify_block(chain, P[b][rows], Q[b][rows[:, :2]], c_coins,
                                             c_u)
        assert (tau, y) == (tau2, y2) and node == (branch + (tau - 1) * 3 if tau else -1)
    ragged = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
    failed = [c for c in CONTROLS if _stream_tv(TraversalControl(c), t, d, ragged, 3) > 1e-3]
    assert failed, "no broken traversal is caught on a topology"


@pytest.mark.parametrize("tree", [Tree.named("eagle", size=8, children="iid"),
                                  Tree.named("medusa", size=8, children="distinct"),
                                  Tree.named("specinfer", size=8, children="iid"),
                                  Tree.named("medusa", size=8)])
def test_named_trees_are_lossless_and_a_lossy_rule_is_not(tree):
    t, d = pair(3, 4)
    checked = 0
    for name in WALK_RULES:
        try:
            check_tree_rule(RULES[name], tree)
        except ValueError:
            continue
        assert _stream_tv(name, t, d, tree, 3) < 1e-12, name
        checked += 1
    if tree.children != "topk":
        assert _stream_tv("traversal", t, d, tree, 3) < 1e-12
    assert checked >= (1 if tree.children == "topk" else 3)
    if tree.children != "topk":      # the control: the same check fails a lossy rule
        assert _stream_tv("typical", t, d, tree, 3) > 1e-3


# ----------------------------------------------------------------------------- sampling
def _sampled_accepted(rule, t, d, tree: Tree, n: int, rng: np.random.Generator) -> np.ndarray:
    """An independent sampler of the walk: fill the tree as its drafter does, then walk it with
    the rule's numpy core (``rule.verify``) and fresh uniforms."""
    T, D, _ = check_models(t, d, ())
    out = np.zeros(n, dtype=np.int64)
    for s in range(n):
        tok: dict[int, int] = {}
        for node in range(tree.size):
            a = tree.parent[node]
            up = _prefix(tree, tok, a)
            q = D(up)
            sib = [tok[m] for m in tree.kids[a] if m < node]
            if tree.children == "topk":
                tok[node] = int(np.argsort(-q, kind="stable")[len(sib)])
                continue
            w = q.copy()
            if tree.children == "distinct":
                w[sib] = 0.0
            tok[node] = int(rng.choice(q.size, p=w / w.sum()))
        S, depth = (-1,), 0
        while True:
            C = [c for a in S for c in tree.kids[a]]
            if not C:
                break
            pre = _prefix(tree, tok, S[0])
            drafts = np.array([tok[c] for c in C])
            u = rule.draw_uniforms(rng, rule.n_uniforms(len(C), T(pre).size))
            y = rule.verify(T(pre), D(pre), drafts, u,
                            replacement=tree.children == "iid" or len(C) == 1)
            S = tuple(c for c in C if tok[c] == y)
            if not S:
                break
            depth += 1
        out[s] = depth
    return out


def _prefix(tree: Tree, tok: dict, n: int) -> tuple[int, ...]:
    path = []
    while n >= 0:
        path.append(tok[n])
        n = tree.parent[n]
    return tuple(reversed(path))


@pytest.mark.parametrize("name, tree", [
    ("rrs", Tree.from_branching([2, 2])),
    ("optimal", Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])),
    ("rrs", Tree.named("medusa", size=8, children="distinct")),
    ("kseq", Tree.named("medusa", size=8, children="iid")),
    ("strict", Tree.named("medusa", size=8)),
])
def test_exact_accepted_length_matches_an_independent_sampler(name, tree):
    t, d = pair(3, 7)
    exact = coupling.expected_accepted(name, t, d, tree=tree)
    got = _sampled_accepted(RULES[name], t, d, tree, 6000, np.random.default_rng(3))
    assert abs(got.mean() - exact) < 5 * got.std() / np.sqrt(got.size) + 1e-9


# ----------------------------------------------------------------------------- the LP
def test_no_rule_beats_the_tree_lp_and_chains_keep_their_lp():
    t, d = pair(2, 11)
    chains = full_information_tree_accepted(t, d, 2, 2)
    assert full_information_tree_accepted(t, d, tree=Tree.from_chains(2, 2)) \
        == pytest.approx(chains, abs=1e-9)
    for tree in (Tree.from_branching([2, 2]), Tree.from_paths([(0,), (1,), (0, 0), (0, 0, 0)]),
                 Tree.named("eagle", size=8, children="iid")):
        best = full_information_tree_accepted(t, d, tree=tree)
        for name in WALK_RULES:
            try:
                value = coupling.expected_accepted(name, t, d, tree=tree)
            except ValueError:
                continue
            assert value <= best + 1e-7, (name, tree)


# ----------------------------------------------------------------------------- the twins
def _tree_inputs(tree: Tree, V: int, B: int, rng: np.random.Generator):
    """``B`` requests: Dirichlet laws at every row and drafts drawn as the tree says."""
    P = rng.dirichlet(np.full(V, 0.4), size=(B, tree.size + 1))
    Q = 0.5 * P + 0.5 * rng.dirichlet(np.full(V, 0.4), size=(B, tree.size + 1))
    X = np.zeros((B, tree.size), dtype=np.int64)
    for b in range(B):
        for n in range(tree.size):
            a = tree.parent[n]
            q = Q[b, a + 1].copy()
            sib = [X[b, m] for m in tree.kids[a] if m < n]
            if tree.children == "topk":
                X[b, n] = np.argsort(-q, kind="stable")[len(sib)]
                continue
            if tree.children == "distinct":
                q[sib] = 0.0
            X[b, n] = rng.choice(V, p=q / q.sum())
    return X, P, Q


TWIN_CASES = [("rrs", Tree.from_branching([2, 2])), ("rrs", Tree.named("medusa", size=8,
                                                                           children="distinct")),
              ("kseq", Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])),
              ("optimal", Tree.from_branching([3, 1])), ("is", Tree.from_branching([2, 2])),
              ("strict", Tree.named("medusa", size=8)), ("typical", Tree.from_branching([2, 2]))]


@pytest.mark.parametrize("name, tree", TWIN_CASES)
def test_the_twin_on_a_topology_decides_as_the_numpy_walk(name, tree):
    """Keyed numbers, 40 requests in one batch: each verdict is the numpy walk's
    (:func:`coupling.rules.topology.walk_topology`) on ``tree_uniforms``; alone, a request
    gets its verdict in the batch; some walks go two nodes deep."""
    import torch

    from coupling.rules.topology import tree_uniforms, walk_topology

    rule, rng = RULES[name], np.random.default_rng(5)
    X, P, Q = _tree_inputs(tree, 3, 40, rng)
    seeds, pos = torch.arange(40) * 11, torch.arange(40) * 3
    v = coupling.verify(name, torch.tensor(X), torch.tensor(P), torch.tensor(Q), tree=tree,
                        seeds=seeds, positions=pos)
    deep = 0
    for b in range(40):
        coins, u = tree_uniforms(rule, int(seeds[b]), int(pos[b]), tree)
        tau, node, y = walk_topology(rule, tree, X[b], P[b], Q[b], coins, u)
        assert (int(v.accepted[b]), int(v.branch[b]), int(v.next_token[b])) == (tau, node, y)
        deep += tau >= 2
    assert deep >= 2
    one = coupling.verify(name, torch.tensor(X[7:8]), torch.tensor(P[7:8]),
                          torch.tensor(Q[7:8]), tree=tree, seeds=seeds[7:8], positions=pos[7:8])
    assert torch.equal(one.tokens[0], v.tokens[7])


@pytest.mark.parametrize("name, k, gamma, replacement", [("rrs", 3, 2, True),
                                                         ("optimal", 2, 2, False),
                                                         ("kseq", 2, 3, True),
                                                         ("strict", 2, 2, True),
                                                         ("traversal", 3, 2, True),
                                                         ("gbv", 2, 3, True),
                                                         ("block", 1, 3, True)])
def test_the_twin_on_chains_is_the_chain_twin(name, k, gamma, replacement):
    """On ``Tree.from_chains(k, gamma)`` the topology twin draws the chain layout's numbers and
    makes the chain twin's decisions, request for request."""
    import torch

    tree = Tree.from_chains(k, gamma, replacement=replacement)
    X, P, Q = _tree_inputs(tree, 4, 60, np.random.default_rng(9))
    # node j + i k is branch j's token i; its laws are row 1 + (j + (i - 1) k), the root's 0
    rows = [[0] + [1 + j + (i - 1) * k for i in range(1, gamma + 1)] for j in range(k)]
    Xc = X.reshape(60, gamma, k).transpose(0, 2, 1)
    Pc, Qc = P[:, rows], Q[:, [r[:gamma] for r in rows]]
    seeds = torch.arange(60)
    a = coupling.verify(name, torch.tensor(Xc.copy()), torch.tensor(Pc), torch.tensor(Qc),
                        seeds=seeds, positions=5, replacement=replacement)
    b = coupling.verify(name, torch.tensor(X), torch.tensor(P), torch.tensor(Q), tree=tree,
                        seeds=seeds, positions=5)
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)
    assert torch.equal(a.tokens, b.tokens)
    deepest = torch.where(a.accepted > 0, a.branch + (a.accepted - 1) * k, -1)
    assert torch.equal(b.branch, deepest)            # the deepest accepted node
    if RULES[name].unit != "token":                  # its twin takes no other topology
        with pytest.raises(ValueError, match="chains"):
            coupling.verify(name, torch.tensor(X[:, :3]), torch.tensor(P[:, :4]),
                            torch.tensor(Q[:, :4]), tree=Tree.from_paths([(0,), (1,), (0, 0)]),
                            seeds=seeds, positions=5)


def test_the_twin_samples_the_numpy_walks_law_on_a_topology():
    """One drafted tree verified under 40k keyed seeds: the emitted outcomes (accepted length,
    next token) have the law of the numpy walk fed numpy's uniforms, 160k walks (a two-sample
    chi-square test at 1e-4): the keyed numbers are uniforms to the walk."""
    import torch
    from scipy import stats

    tree, name, n = Tree.from_branching([2, 2]), "rrs", 40_000
    X, P, Q = _tree_inputs(tree, 3, 1, np.random.default_rng(2))
    rep = lambda a: torch.tensor(np.repeat(a, n, axis=0))  # noqa: E731
    v = coupling.verify(name, rep(X), rep(P), rep(Q), tree=tree, seeds=torch.arange(n),
                        positions=0)
    got = np.unique(np.stack([v.accepted.numpy(), v.next_token.numpy()], 1), axis=0,
                    return_counts=True)
    # the reference: the numpy walk with numpy-generated uniforms, many more draws
    from coupling.rules.topology import walk_topology

    rng, ref = np.random.default_rng(0), {}
    for _ in range(4 * n):
        tau, _, y = walk_topology(RULES[name], tree, X[0], P[0], Q[0], rng.random(tree.size),
                                  rng.random(tree.depth + 1))
        ref[(tau, y)] = ref.get((tau, y), 0) + 1
    keys = sorted(set(ref) | {tuple(k) for k in got[0].tolist()})
    obs = np.array([dict(zip(map(tuple, got[0].tolist()), got[1], strict=True)).get(k, 0)
                    for k in keys], dtype=float)
    exp = np.array([ref.get(k, 0) for k in keys], dtype=float)
    table = np.stack([obs, exp])
    assert stats.chi2_contingency(table[:, table.sum(0) > 0])[1] > 1e-4


# ----------------------------------------------------------------------------- predictions
def _fillings(tree: Tree, draft, context=()):
    """Every way to fill ``tree`` by its child law, with its probability (small V)."""
    out = [((), 1.0)]
    for n in range(tree.size):
        a = tree.parent[n]
        nxt = []
        for toks, w in out:
            q = draft(context + tuple(toks[m] for m in tree.path_to(a)))
            earlier = [toks[m] for m in tree.kids[a] if m < n]
            left = 1.0 - (q[earlier].sum() if tree.children == "distinct" else 0.0)
            for x in np.flatnonzero(q > 0):
                if tree.children == "distinct" and x in earlier:
                    continue
                nxt.append((toks + (int(x),), w * q[x] / left))
        out = nxt
    return out


@pytest.mark.parametrize("name, tree", [
    ("rrs", Tree.from_branching([2, 2])),
    ("rrs", Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])),
    ("rrs", Tree.from_branching([2, 1], children="distinct")),
    ("token", Tree.chain(3)),
    ("traversal", Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])),
])
def test_the_conditional_tokens_of_a_drafted_tree_average_to_its_exact_value(name, tree):
    """``conditional_tree_tokens`` (the engine's per-step prediction) is the expectation over
    the coins given the drafted tree: averaged over every filling of the tree with its
    probability, it is the tree's exact tokens per call."""
    from coupling.sequence.predict import conditional_tokens, conditional_tree_tokens

    t, d = pair(3, 13)
    total = 0.0
    for toks, w in _fillings(tree, d):
        rows = [()] + [tuple(toks[m] for m in tree.path_to(n)) for n in range(tree.size)]
        P, Q = np.array([t(r) for r in rows]), np.array([d(r) for r in rows])
        value = conditional_tree_tokens(name, tree, toks, P, Q)
        if tree.chains() == (1, tree.size, True):        # a chain: the path law's value
            x = np.array(toks)
            assert value == pytest.approx(conditional_tokens(
                name, x[None], P[None], Q[None, :-1], 0), abs=1e-12)
        total += w * value
    assert total == pytest.approx(coupling.block_efficiency(name, t, d, tree=tree), abs=1e-12)
    with pytest.raises(ValueError, match="try_law"):
        conditional_tree_tokens("kseq", tree, toks, P, Q)
