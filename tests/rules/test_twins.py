"""Every rule's batched torch twin against its numpy core: one suite over the registry.

For each rule of :data:`coupling.rules.RULES` and each draft law it takes (``rule.draft_laws``;
first tokens from the rule's own law, ``rule.draw_drafts``):

* **keyed parity**: whole random trees verified by the twin with its own keyed numbers get
  the numpy core's verdict fed the same numbers (``rule.call_uniforms``, or the keyed noise of
  a shared-noise rule), tree by tree and in one batch, and the walks go past their first
  offsets;
* **explicit-uniform parity** on hypothesis trees with exact zeros, ties and one-hot laws
  (``accept_u``, ``sample_u``; a shared-noise rule reads no uniforms and is held to its noise
  instead): the same verdict, or the same refusal;
* **batch invariance**: a permuted batch gets the permuted verdicts, a request alone or
  repeated its verdict in the batch, another seed other verdicts, and the emitted prefix is
  the chosen branch's;
* **one branch** is the token (or block) twin coin for coin where the table says so;
* **chains** (one drafted path with coins and draws): parity on explicit and keyed numbers
  with exact zeros, ratios of exactly 1 and float32 laws, which decide as their float64 values;
* **CUDA** decides as the CPU (skipped without a device).

Adding a rule means one line in :data:`TWINS`; the per-rule files hold only what is specific
to a rule (its exact laws, its statistics, its own draft law, its special inputs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coupling import keyed
from coupling.rules import RULES
from coupling.rules.common import categorical
from coupling.torch_backend import sample_rows
from coupling.torch_backend.common import sample_uniforms

from ..strategies import distributions
from ..torch_helpers import random_path, random_trees, stack_paths, verdict_rows


@dataclass(frozen=True)
class Twin:
    """How a rule's twin is exercised: ``one_branch``, the rule whose twin a single branch
    is coin for coin (``None``: no such identity); ``sizes``, the vocabularies of its trees."""

    one_branch: str | None = None
    sizes: tuple[int, ...] = (3, 8, 40)


#: one line per rule of the registry
TWINS = {
    "token": Twin(),
    "block": Twin(),
    "kseq": Twin(one_branch="token"),
    "rrs": Twin(one_branch="token"),
    "optimal": Twin(one_branch="token", sizes=(3, 8, 12)),  # distinct drafts: small T V plans
    "gumbel": Twin(),
    "minhash": Twin(),
    "greedy": Twin(one_branch="token"),
    "is": Twin(one_branch="token"),
    "spechub": Twin(one_branch="token"),
    "strict": Twin(),
    "gls": Twin(),
    "traversal": Twin(one_branch="block"),
    "gbv": Twin(one_branch="block"),
    "typical": Twin(),
    "relaxed": Twin(),
}

CASES = [(name, rep) for name, rule in RULES.items()
         for rep in ((True,) if rule.max_drafts == 1 else rule.draft_laws)]
IDS = [f"{name}-{'iid' if rep else 'distinct'}" for name, rep in CASES]


def test_the_table_covers_the_registry():
    assert list(TWINS) == list(RULES)


# ----------------------------------------------------------------------------- trees
def rule_trees(name: str, replacement: bool, n: int, seed: int):
    """``n`` single-request trees ``(X [1, k, g], P, Q)`` the rule can verify: ``k`` capped by
    ``rule.max_drafts``, first tokens from the rule's own draft law, and for a shared-noise
    rule every branch drafted by its keyed noise at key ``(i, 5 i)`` (so drafts are accepted
    and the walks go deep)."""
    rule, rng = RULES[name], np.random.default_rng(seed)
    for i, (X, P, Q) in enumerate(random_trees(rng, n, replacement, TWINS[name].sizes)):
        k = min(X.shape[1], rule.max_drafts or X.shape[1])
        X, P, Q = X[:, :k].clone(), P[:, :k], Q[:, :k]
        if not rule.supports(k, replacement):
            continue
        if rule.shared_noise:
            for j in range(X.shape[2]):
                X[:, :, j] = rule.torch.draft_branches(Q[:, :, j], torch.tensor([i]),
                                                       torch.tensor([5 * i + j]))
            X[:, :, 0] = X[:, :1, 0]      # one first law: a shared prefix, as a tree drafts it
        elif k > 1 and rule.unit == "token":
            q0 = Q[0, 0, 0].double().numpy()
            X[0, :, 0] = torch.as_tensor(rule.draw_drafts(q0 / q0.sum(), k, replacement, rng))
        yield i, (X, P, Q)


def largest_group(items: list, key) -> list:
    """The items sharing the most common ``key`` (trees of one shape batch together)."""
    keys = [key(t) for t in items]
    best = max(set(keys), key=keys.count)
    return [t for t, k in zip(items, keys, strict=True) if k == best]


def core_rows(name: str, X, P, Q, seeds, positions, replacement) -> list[tuple[int, int, int]]:
    """The numpy core on each request, fed the keyed numbers its twin draws."""
    rule, out = RULES[name], []
    g, V = X.shape[-1], P.shape[-1]
    for b in range(X.shape[0]):
        s, t = int(seeds[b]), int(positions[b])
        arrays = (X[b].numpy(), P[b].numpy(), Q[b].numpy())
        if rule.shared_noise:
            out.append(tuple(rule.verify_block(
                *arrays, keyed.gumbel_noise(s, t + np.arange(g + 1), np.arange(V)))))
        else:
            coins, u = rule.call_uniforms(s, t, g, X.shape[1])
            out.append(tuple(rule.verify_block(*arrays, coins, u, replacement=replacement)))
    return out


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("name, replacement", CASES, ids=IDS)
def test_keyed_parity_on_whole_trees(name, replacement):
    rule, deep, trees = RULES[name], 0, []
    for i, (X, P, Q) in rule_trees(name, replacement, 60, seed=len(name)):
        kw = {"seeds": torch.tensor([i]), "positions": torch.tensor([5 * i])}
        got = verdict_rows(rule.torch.verify(X, P, Q, replacement=replacement, **kw))
        assert got == core_rows(name, X, P, Q, kw["seeds"], kw["positions"], replacement), i
        deep += got[0][0] >= 2
        trees.append((i, X, P, Q))
    assert deep >= 3, deep   # the walks went past their first offsets
    same = largest_group(trees, key=lambda t: tuple(t[2].shape))[:8]
    assert len(same) >= 2
    X, P, Q = (torch.cat([t[j] for t in same]) for j in (1, 2, 3))
    seeds = torch.tensor([t[0] for t in same])
    batch = rule.torch.verify(X, P, Q, seeds=seeds, positions=5 * seeds, replacement=replacement)
    assert verdict_rows(batch) == core_rows(name, X, P, Q, seeds, 5 * seeds, replacement)


def degenerate_tree(data, name: str, replacement: bool):
    """A hypothesis tree (V <= 6, gamma <= 3) with exact zeros, ties and one-hot laws, first
    tokens from the rule's own law, and explicit uniforms."""
    rule = RULES[name]
    V, g = data.draw(st.integers(2, 6)), data.draw(st.integers(1, 3))
    P = np.stack([data.draw(distributions(V)) for _ in range(g + 1)])
    Q = np.stack([data.draw(distributions(V)) for _ in range(g)])
    kmax = min(3, rule.max_drafts or 3, np.count_nonzero(Q[0]))
    k = data.draw(st.integers(1, kmax))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    rep = replacement or k == 1
    roots = rule.draw_drafts(Q[0], k, rep, rng) if rule.unit == "token" \
        else rng.choice(V, size=k, replace=rep, p=Q[0])
    X = np.array([[r] + [rng.choice(V, p=Q[i]) for i in range(1, g)] for r in roots])
    unif = st.floats(0, 1, exclude_max=True)
    coins = np.array(data.draw(st.lists(unif, min_size=g * k, max_size=g * k))).reshape(g, k)
    u = np.array(data.draw(st.lists(unif, min_size=g + 1, max_size=g + 1)))
    return X, P[None].repeat(k, 0), Q[None].repeat(k, 0), coins, u, rep


@pytest.mark.parametrize("name, replacement", CASES, ids=IDS)
@given(data=st.data())
def test_explicit_uniform_parity_on_degenerate_laws(name, replacement, data):
    """The same verdict on the same numbers, or the same refusal (``ValueError``, same text)."""
    rule = RULES[name]
    X, P, Q, coins, u, rep = degenerate_tree(data, name, replacement)
    g, V = X.shape[1], P.shape[-1]
    if rule.shared_noise:   # no uniforms: the core and the twin read the same keyed noise
        noise = keyed.gumbel_noise(3, 7 + np.arange(g + 1), np.arange(V))
        kw, core = {"seeds": 3, "positions": 7}, (noise,)
    else:
        kw = {"seeds": 0, "positions": 0, "accept_u": torch.tensor(coins)[None],
              "sample_u": torch.tensor(u)[None]}
        core = (coins, u)

    def twin():
        return rule.torch.verify(torch.tensor(X)[None], torch.tensor(P)[None],
                                 torch.tensor(Q)[None], replacement=rep, **kw)

    try:
        want = rule.verify_block(X, P, Q, *core, **({} if rule.shared_noise
                                                    else {"replacement": rep}))
    except ValueError as err:
        with pytest.raises(ValueError, match=re.escape(str(err))):
            twin()
        return
    assert verdict_rows(twin()) == [tuple(want)]


# ----------------------------------------------------------------------------- batches
@pytest.mark.parametrize("name, replacement", CASES, ids=IDS)
def test_batch_invariance(name, replacement):
    rule = RULES[name]
    trees = [t for _, t in rule_trees(name, replacement, 200, seed=99)]
    same = largest_group(trees, key=lambda t: tuple(t[1].shape))
    assert len(same) >= 5
    X, P, Q = (torch.cat(parts) for parts in zip(*same, strict=True))
    B = X.shape[0]
    seeds, pos = torch.arange(B) * 7 + 1, torch.arange(B) * 3
    full = rule.torch.verify(X, P, Q, seeds=seeds, positions=pos, replacement=replacement)
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(0))
    again = rule.torch.verify(X[perm], P[perm], Q[perm], seeds=seeds[perm], positions=pos[perm],
                              replacement=replacement)
    assert torch.equal(again.tokens, full.tokens[perm])
    for b in (0, B - 1):
        one = rule.torch.verify(X[b:b + 1], P[b:b + 1], Q[b:b + 1], seeds=seeds[b:b + 1],
                                positions=pos[b:b + 1], replacement=replacement)
        assert torch.equal(one.tokens[0], full.tokens[b])
    for b in range(B):
        n = int(full.accepted[b])
        assert full.tokens[b, :n].tolist() == X[b, int(full.branch[b]), :n].tolist()
    dup = torch.zeros(5, dtype=torch.int64)   # one request 5 times in a batch: 5 equal verdicts
    twice = rule.torch.verify(X[dup], P[dup], Q[dup], seeds=seeds[dup], positions=pos[dup],
                              replacement=replacement)
    assert (twice.tokens == full.tokens[0]).all()
    other = rule.torch.verify(X, P, Q, seeds=seeds + 1, positions=pos, replacement=replacement)
    assert not torch.equal(other.tokens, full.tokens)   # the seed decides something


@pytest.mark.parametrize("name", [n for n, t in TWINS.items() if t.one_branch])
def test_one_branch_is_its_chain_rule_coin_for_coin(name):
    rng = np.random.default_rng(11)
    B, g, V = 300, 4, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g)))
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * g))).reshape(B, 1, g)
    kw = {"seeds": torch.arange(B), "positions": torch.tensor(rng.integers(0, 1000, B))}
    want = RULES[TWINS[name].one_branch].torch.verify(X, P, Q, **kw)
    assert torch.equal(RULES[name].torch.verify(X, P, Q, **kw).tokens, want.tokens)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("name, replacement", CASES, ids=IDS)
def test_cuda_matches_cpu(name, replacement):
    """The twin on a GPU decides as on the CPU (up to float summation order: none of these
    seeded requests sits on a tie)."""
    rule = RULES[name]
    for i, (X, P, Q) in rule_trees(name, replacement, 40, seed=17):
        kw = {"seeds": torch.tensor([i]), "positions": torch.tensor([5 * i]),
              "replacement": replacement}
        cpu = rule.torch.verify(X, P, Q, **kw)
        gpu = rule.torch.verify(X.cuda(), P.cuda(), Q.cuda(),
                                **{**kw, "seeds": kw["seeds"].cuda(),
                                   "positions": kw["positions"].cuda()})
        assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu, gpu, strict=True)), i


# ----------------------------------------------------------------------------- chains
#: the rules that verify one drafted chain with coins and draws
CHAINS = [n for n, r in RULES.items() if r.max_drafts == 1 and not r.shared_noise]


@pytest.mark.parametrize("name", CHAINS)
@pytest.mark.parametrize("zeros", [False, True])
def test_chain_parity_on_shared_uniforms(name, zeros):
    """Explicit coins and draws on random paths (with exact zeros in the laws): the twin's
    verdict and emitted tokens are the numpy core's."""
    rule, rng = RULES[name], np.random.default_rng(1 if zeros else 2)
    for V, gamma in [(2, 1), (3, 2), (5, 4), (8, 6)]:
        B = 150
        paths = [random_path(rng, V, gamma, alpha=0.3, zeros=zeros) for _ in range(B)]
        x, P, Q = stack_paths(paths)
        au = torch.tensor(rng.random((B, gamma, 1)))
        su = torch.tensor(rng.random((B, gamma + 1)))
        ver = rule.torch.verify(x, P, Q, seeds=0, positions=0, accept_u=au, sample_u=su)
        for b, (xb, Pb, Qb) in enumerate(paths):
            n, j, y = rule.verify_block(xb[None], Pb[None], Qb[None], au[b].numpy(),
                                        su[b].numpy())
            assert verdict_rows(ver)[b] == (n, j, y), (V, gamma, b)
            assert ver.tokens[b, : n + 1].tolist() == [*xb[:n].tolist(), y]
            assert (ver.tokens[b][n + 1 :] == -1).all()


@pytest.mark.parametrize("name", CHAINS)
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 4), st.sampled_from([2, 3, 7, 60]),
       st.sampled_from([torch.float32, torch.float64]), st.booleans())
def test_chain_parity_on_keyed_uniforms(name, case, gamma, V, dtype, zeros):
    """Each request of a batch, verified with its own keyed draws, gets the verdict of the
    numpy core fed ``rule.call_uniforms(seed, position)``, with exact zeros in the laws, with
    q = p on the drafted path (ratios of exactly 1, residual masses of exactly 0) in some
    requests, and in float32; verified alone, it gets the same verdict as in the batch."""
    rule, rng, B = RULES[name], np.random.default_rng(case), 24
    paths = [random_path(rng, V, gamma, alpha=0.4, zeros=zeros) for _ in range(B)]
    for b in range(0, B, 5):                      # ratio exactly 1 along the whole path
        x, P, Q = paths[b]
        paths[b] = (x, np.vstack([Q, P[-1:]]) if gamma else P, Q)
    x, P, Q = stack_paths(paths, dtype=dtype)
    seeds = torch.tensor(rng.integers(0, 2**62, B))
    pos = torch.tensor(rng.integers(0, 10**6, B))
    batched = rule.torch.verify(x, P, Q, seeds=seeds, positions=pos)
    if gamma:
        assert verdict_rows(batched) == core_rows(name, x, P, Q, seeds, pos, True)
    else:  # no draft: the bonus token, drawn with the call's first keyed draw
        u = sample_uniforms(seeds, pos, 0)[:, 0]
        assert batched.next_token.tolist() == [categorical(P[b, 0, 0].double().numpy(),
                                                           float(u[b])) for b in range(B)]
    for b in range(B):
        one = rule.torch.verify(x[b : b + 1], P[b : b + 1], Q[b : b + 1],
                                seeds=seeds[b : b + 1], positions=pos[b : b + 1])
        for got, want in zip(one, batched, strict=True):
            assert got.dtype == want.dtype and torch.equal(got[0], want[b]), (gamma, b)


@pytest.mark.parametrize("name", CHAINS)
def test_float32_laws_decide_like_their_float64_values(name):
    """All decisions are computed in float64: float32 probabilities give the decisions of
    their exact float64 values (no float32 arithmetic on the decision path)."""
    rng = np.random.default_rng(4)
    x, P, Q = stack_paths([random_path(rng, 64, 5, alpha=0.2) for _ in range(300)],
                          dtype=torch.float32)
    seeds, verify = torch.arange(300), RULES[name].torch.verify
    a = verify(x, P, Q, seeds=seeds, positions=7)
    b = verify(x, P.double(), Q.double(), seeds=seeds, positions=7, atol=1e-4)
    assert torch.equal(a.tokens, b.tokens)
