"""What the torch backend package itself holds (:mod:`coupling.torch_backend`): the verdict
layout, input validation (``check_inputs``, ``check_probs``), inverse-CDF sampling
(``sample_rows``), the float64 rows of the laws (``laws``), the batched walk of a draft tree
(``walk_tree``, ``verify_tree``) and the dispatcher ``coupling.verify`` over every rule of
:data:`coupling.RULES`.

Each twin's own conformance (parity with its numpy core, exact laws, losslessness, batch
invariance) is tested in ``tests/rules/test_<rule>_torch.py``; the keyed randomness in
``tests/test_keyed.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import coupling
import coupling.rules as rules
from coupling.keyed import MAX_DRAFTS
from coupling.rules import NEGATIVE_CONTROLS, RULES
from coupling.rules.common import categorical
from coupling.rules.walk import walk
from coupling.torch_backend import Verdict, check_inputs, check_probs, laws, sample_rows, walk_tree
from coupling.torch_backend.common import coin_uniforms, sample_uniforms
from coupling.torch_backend.tree import first_true, verify_tree

from .strategies import distributions
from .torch_helpers import (
    draft_replacement,
    own_roots,
    random_path,
    random_trees,
    stack_paths,
    verdict_rows,
)

TOKEN, BLOCK = RULES["token"].torch.verify, RULES["block"].torch.verify


def _tree_batch(rng: np.random.Generator, B: int, k: int, g: int, V: int, dtype=torch.float64,
                rule: str | None = None):
    """``B`` requests of ``k`` branches sharing their first token (a tree), Dirichlet laws; for
    a ``rule`` whose branches are distinct (:func:`_replacement`), first tokens from its own
    draft law instead."""
    P = torch.tensor(rng.dirichlet(np.full(V, 0.5), size=(B, k, g + 1)), dtype=dtype)
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.5), size=(B, k, g)), dtype=dtype)
    Q[:, 1:, 0], P[:, 1:, :2] = Q[:, :1, 0], P[:, :1, :2]
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * k * g))).reshape(B, k, g)
    X[:, 1:, 0] = X[:, :1, 0]
    if rule is not None and not _replacement(rule):
        X = own_roots(rule, X, Q, False, rng)
    return X, P, Q


def _k(name: str) -> int:
    """Branches to give a rule's twin in these tests: 2 where the rule takes several drafts."""
    return 1 if RULES[name].max_drafts == 1 else 2


def _replacement(name: str) -> bool:
    """The draft law of the :func:`_k` branches: i.i.d. where the rule takes them, else its own
    (distinct) law."""
    return draft_replacement(name, _k(name))


# ----------------------------------------------------------------------------- verdict
def test_verdict_layout_and_unbatched_k_axis():
    rng = np.random.default_rng(8)
    paths = [random_path(rng, 10, 3) for _ in range(20)]
    x, P, Q = stack_paths(paths)
    v = BLOCK(x, P, Q, seeds=torch.arange(20), positions=0)
    assert isinstance(v, Verdict)
    assert v.tokens.shape == (20, 4) and v.tokens.dtype == torch.int64
    assert v.accepted.shape == v.branch.shape == v.next_token.shape == (20,)
    assert (v.branch == 0).all()
    for b in range(20):
        n = int(v.accepted[b])
        assert v.tokens[b, :n].tolist() == x[b, 0, :n].tolist()
        assert int(v.tokens[b, n]) == int(v.next_token[b])
        assert (v.tokens[b, n + 1 :] == -1).all()
    # [B, gamma] inputs (k axis dropped) give the same verdict; verify() dispatches
    v2 = coupling.verify("block", x[:, 0], P[:, 0], Q[:, 0], seeds=torch.arange(20), positions=0)
    assert torch.equal(v.tokens, v2.tokens)


# ----------------------------------------------------------------------------- dispatcher
def test_dispatcher_reaches_every_twin():
    """``coupling.verify`` (the dispatcher of :mod:`coupling.rules`) runs each registered
    rule's own twin (``RULES[name].torch.verify``, the module the rule names), for every name
    of the registry, and takes the rule itself as well as its name."""
    assert coupling.verify is rules.verify
    assert rules.verifiers() == tuple(RULES)
    assert all(RULES[name].twin == f"{type(RULES[name]).__module__}.torch" for name in RULES)
    rng = np.random.default_rng(30)
    for name in RULES:
        X, P, Q = _tree_batch(rng, 6, _k(name), 3, 7, rule=name)
        kw = {"seeds": torch.arange(6), "positions": torch.arange(6) * 10,
              "replacement": _replacement(name)}
        want = RULES[name].torch.verify(X, P, Q, **kw)
        assert isinstance(want, Verdict)
        for got in (coupling.verify(name, X, P, Q, **kw), rules.verify(RULES[name], X, P, Q, **kw)):
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), name


def test_dispatcher_refuses_unknown_names():
    """A name outside the registry, a negative control included, is a ValueError that lists
    the known rules; a negative control has no twin."""
    X, P, Q = _tree_batch(np.random.default_rng(31), 2, 1, 2, 5)
    for bad in ["nope", "TOKEN", "rrs_wor", *NEGATIVE_CONTROLS]:
        with pytest.raises(ValueError, match="unknown rule") as err:
            coupling.verify(bad, X, P, Q, seeds=0, positions=0)
        assert all(name in str(err.value) for name in RULES)
    for control in NEGATIVE_CONTROLS.values():
        with pytest.raises(ValueError, match="no torch twin"):
            control.torch  # noqa: B018


def test_law_rows_are_read_detached():
    """The rows the twins read carry no autograd graph, one row (read in place) or several."""
    p = torch.rand(2, 3, 70_000, requires_grad=True)
    for index in ((torch.tensor([1]), torch.tensor([2])),
                  (torch.tensor([0, 1]), torch.tensor([2, 2]))):
        assert not laws.rows(p, index).requires_grad
        assert not laws.normalised_rows(p, index).requires_grad


@pytest.mark.parametrize("name", list(RULES))
def test_every_twin_takes_laws_that_require_grad(name):
    """Laws still attached to an autograd graph (a draft in training) verify as detached
    ones do."""
    p = torch.tensor([[[[0, 0.5, 0.5, 0], [0, 0, 0.25, 0.75]],
                       [[0, 0.5, 0.5, 0], [0.5, 0, 0.25, 0.25]]]])
    q = torch.tensor([[[[0, 0.25, 0.75, 0]], [[0, 0.25, 0.75, 0]]]])
    d = torch.tensor([[[2], [1]]])   # the likeliest token of q and another: any law's draw
    if _k(name) == 1:
        p, q, d = p[:, :1], q[:, :1], d[:, :1]
    kw = {"seeds": 3, "positions": 5, "replacement": _replacement(name)}
    want = coupling.verify(name, d, p, q, **kw)
    got = coupling.verify(name, d, p.clone().requires_grad_(), q.clone().requires_grad_(), **kw)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("name", list(RULES))
def test_every_twin_decides_on_the_float64_values_of_half_precision_laws(name):
    """bfloat16 laws (rows off 1 by up to ~1e-2, hence ``atol``) give the verdict of their
    exact float64 values: no decision is taken in reduced precision."""
    X, P, Q = _tree_batch(np.random.default_rng(32), 16, _k(name), 3, 6, dtype=torch.bfloat16,
                          rule=name)
    kw = {"seeds": torch.arange(16), "positions": 4, "atol": 3e-2,
          "replacement": _replacement(name)}
    half = coupling.verify(name, X, P, Q, **kw)
    full = coupling.verify(name, X, P.double(), Q.double(), **kw)
    assert all(torch.equal(a, b) for a, b in zip(half, full, strict=True))


@pytest.mark.parametrize("name", list(RULES))
def test_every_twin_refuses_non_finite_laws(name):
    X, P, Q = _tree_batch(np.random.default_rng(33), 2, _k(name), 1, 5, rule=name)
    with pytest.raises(ValueError, match="NaN or inf"):
        coupling.verify(name, X, P.index_fill(-1, torch.tensor([0]), float("nan")), Q,
                        seeds=0, positions=0, replacement=_replacement(name))


# ----------------------------------------------------------------------------- validation
def _valid(B=3, k=1, g=2, V=5, dtype=torch.float32):
    p = torch.full((B, k, g + 1, V), 1.0 / V, dtype=dtype)
    q = torch.full((B, k, g, V), 1.0 / V, dtype=dtype)
    x = torch.zeros(B, k, g, dtype=torch.int64)
    return x, p, q


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda x, p, q: (x.float(), p, q), "integer token ids"),
        (lambda x, p, q: (x, p[:, :, :-1], q), r"gamma\+1"),
        (lambda x, p, q: (x, p, q[..., :-1]), "q must have shape"),
        (lambda x, p, q: (x[0], p, q), "drafts must have shape"),
        (lambda x, p, q: (x, p.index_fill(-1, torch.tensor([1]), float("nan")), q), "NaN or inf"),
        (lambda x, p, q: (x, p, q.index_fill(-1, torch.tensor([1]), float("inf"))), "NaN or inf"),
        (lambda x, p, q: (x, p + torch.tensor([-0.3, 0.3, 0, 0, 0], dtype=p.dtype), q), "negative"),
        (lambda x, p, q: (x, p * 1.01, q), "sum to 1"),
        (lambda x, p, q: (x + 7, p, q), "outside"),
        (lambda x, p, q: (x - 1, p, q), "outside"),
        (lambda x, p, q: (x, p.long(), q), "floating"),
        (
            lambda x, p, q: (x.expand(3, 2, 2), p.expand(3, 2, 3, 5), q.expand(3, 2, 2, 5)),
            "single draft branch",
        ),
    ],
)
@pytest.mark.parametrize("fn", [TOKEN, BLOCK], ids=["token", "block"])
@pytest.mark.parametrize("B", [3, 1])
def test_validation_errors(fn, mutate, match, B):
    """The same errors batched or alone."""
    x, p, q = mutate(*_valid(B=B))
    with pytest.raises(ValueError, match=match):
        fn(x, p, q, seeds=0, positions=0)


def test_validation_zero_draft_probability_and_keys():
    x, p, q = _valid()
    q = q.clone()
    q[..., 0] = 0.0
    q[..., 1] += 1.0 / 5
    with pytest.raises(ValueError, match="q = 0"):
        TOKEN(x, p, q, seeds=0, positions=0)
    x, p, q = _valid()
    with pytest.raises(ValueError, match="seeds must have shape"):
        BLOCK(x, p, q, seeds=torch.zeros(2, dtype=torch.int64), positions=0)
    with pytest.raises(ValueError, match="integers"):
        BLOCK(x, p, q, seeds=torch.zeros(3), positions=0)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        BLOCK(x, p, q, seeds=0, positions=-1)
    with pytest.raises(ValueError, match="unknown rule"):
        coupling.verify("nope", x, p, q, seeds=0, positions=0)
    # validate=False skips the value checks (hot path) but never the shape checks
    TOKEN(x, p * 1.01, q, seeds=0, positions=0, validate=False)
    with pytest.raises(ValueError, match="gamma\\+1"):
        TOKEN(x, p[:, :, :-1], q, seeds=0, positions=0, validate=False)


def test_check_inputs_normalises_shapes_and_keys():
    """One branch may drop the k axis; scalar keys broadcast to ``[B]``; integer drafts of any
    width become int64; too many branches, and branches for a one-branch rule, are refused."""
    x, p, q = _valid(B=4, g=3)
    d, P, Q, s, t = check_inputs(x[:, 0].to(torch.int32), p[:, 0], q[:, 0], 7, 9)
    assert d.dtype == torch.int64 and d.shape == (4, 1, 3)
    assert P.shape == (4, 1, 4, 5) and Q.shape == (4, 1, 3, 5)
    assert s.tolist() == [7] * 4 and t.tolist() == [9] * 4
    many = MAX_DRAFTS + 1
    xk, pk, qk = x[:, :1].expand(4, many, 3), p.expand(4, many, 4, 5), q.expand(4, many, 3, 5)
    with pytest.raises(ValueError, match="exceeds MAX_DRAFTS"):
        check_inputs(xk, pk, qk, 0, 0)
    with pytest.raises(ValueError, match="rule 'block' verifies a single draft branch"):
        check_inputs(xk[:, :2], pk[:, :2], qk[:, :2], 0, 0, max_k=1, rule="block")
    with pytest.raises(ValueError, match="torch tensors"):
        check_inputs(x.numpy(), p, q, 0, 0)
    with pytest.raises(ValueError, match="vocabulary axis"):
        check_inputs(x, p[..., :0], q[..., :0], 0, 0)


@pytest.mark.parametrize("dtype, off, tol", [(torch.float64, 1e-9, 2e-9),
                                             (torch.float32, 1e-4, 3e-4),
                                             (torch.bfloat16, 2e-2, 6e-2)])
def test_check_probs_tolerance_follows_the_dtype(dtype, off, tol):
    """Rows must sum to 1 within the precision their dtype can hold (float64 1e-9, float32 1e-4,
    half precision 2e-2), or within an explicit ``atol``."""
    row = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    check_probs((row * (1 + off / 2)).to(dtype)[None], "p")
    bad = (row * (1 + tol)).to(dtype)[None]
    with pytest.raises(ValueError, match="p rows must sum to 1"):
        check_probs(bad, "p")
    check_probs(bad, "p", atol=2 * tol)
    check_probs(torch.empty(0, 3, dtype=dtype), "p")     # nothing to check
    with pytest.raises(ValueError, match="q must be a floating tensor"):
        check_probs(torch.ones(2, dtype=torch.int64), "q")


# ----------------------------------------------------------------------------- sampling
@given(st.integers(1, 8).flatmap(lambda V: st.lists(distributions(V), min_size=1, max_size=4)),
       st.data())
def test_sample_rows_is_the_numpy_inverse_cdf(rows, data):
    """``sample_rows`` returns :func:`coupling.rules.common.categorical`'s token for every
    uniform, extremes included; a token of weight 0 is never returned."""
    scale = data.draw(st.sampled_from([1.0, 1e-300, 3.7, 1e300]))
    W = np.stack(rows) * scale
    u = np.array([data.draw(st.one_of(st.floats(0, 1, exclude_max=True),
                                      st.just(1 - 2.0**-53), st.just(0.0))) for _ in rows])
    got = sample_rows(torch.tensor(W), torch.tensor(u)).tolist()
    assert got == [categorical(w, float(v)) for w, v in zip(W, u, strict=True)]
    assert all(W[i, y] > 0 for i, y in enumerate(got))


def test_sample_rows_falls_back_on_rows_without_weight():
    """A row of total weight 0 (an event of probability 0, reached through rounding) samples
    its fallback law; rows with weight ignore the fallback."""
    W = torch.tensor([[0.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    fallback = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    assert sample_rows(W, torch.tensor([0.3, 0.3]), fallback=fallback).tolist() == [2, 1]


@pytest.mark.parametrize("name", ["gumbel", "minhash", "spechub"])
def test_twins_stepping_in_row_chunks_decide_as_in_one_chunk(monkeypatch, name):
    """The twins that build their per-row temporaries a chunk of rows at a time
    (``laws.by_row_chunks``) give the same verdicts with chunks of one row as in one chunk."""
    k = _k(name)
    X, P, Q = _tree_batch(np.random.default_rng(37), 9, k, 2, 6, rule=name)
    kw = dict(seeds=torch.arange(9), positions=torch.full((9,), 3),
              replacement=_replacement(name) or k == 1)
    whole = RULES[name].torch.verify(X, P, Q, **kw)
    monkeypatch.setattr(laws, "CPU_CHUNK", 6)                # one row of V = 6 per chunk
    assert laws.chunk_rows(6, X.device) == 1
    rows = RULES[name].torch.verify(X, P, Q, **kw)
    assert verdict_rows(rows) == verdict_rows(whole)


# ----------------------------------------------------------------------------- laws in float64
@pytest.mark.parametrize("chunk", [laws.CPU_CHUNK, 7])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_laws_rows_are_the_float64_values_of_every_layout(monkeypatch, chunk, dtype):
    """Row sums, normalised rows, residual masses and weights of ``x[index]`` (or of every
    row) equal the same formulas on the float64 copy, for contiguous, sliced, branch-selected
    and expanded layouts, in one chunk or chunks of one row (``chunk`` elements)."""
    monkeypatch.setattr(laws, "CPU_CHUNK", chunk)
    gen = torch.Generator().manual_seed(36)
    base = torch.rand(5, 3, 4, 7, generator=gen, dtype=torch.float64).to(dtype)
    other = torch.rand(5, 3, 4, 7, generator=gen, dtype=torch.float64).to(dtype)
    layouts = [base, base[:, 1], base[:, :, :3], base[:, :1].expand(5, 3, 4, 7)]
    for x in layouts:
        ref = x.double()
        assert torch.equal(laws.row_sums(x), ref.sum(-1))
        flat = ref.reshape(-1, 7)
        assert torch.equal(laws.normalised_rows(x), flat / flat.sum(-1, keepdim=True))
    index = (torch.tensor([4, 0, 2, 2, 1]), torch.tensor([1, 0, 2, 2, 0]),
             torch.tensor([3, 0, 1, 1, 2]))
    a = torch.rand(5, generator=gen, dtype=torch.float64)
    b = torch.rand(5, generator=gen, dtype=torch.float64)
    P, Q = base.double()[index], other.double()[index]
    assert torch.equal(laws.row_sums(base, index), P.sum(-1))
    assert torch.equal(laws.normalised_rows(base, index), P / P.sum(-1, keepdim=True))
    want = (P * a[:, None] - Q * b[:, None]).clamp(min=0.0)
    assert torch.equal(laws.residual_weights(base, other, index, index, a, b), want)
    assert torch.equal(laws.residual_masses(base, other, index, index, a, b), want.sum(-1))
    one = tuple(i[:1] for i in index)  # a single row: read as a view
    assert torch.equal(laws.row_sums(base, one), P[:1].sum(-1))


# ----------------------------------------------------------------------------- the walk
def _toy_step_numpy(p, q, drafts, u):
    """A deterministic single-step rule: the first survivor whose coin is below 1/2, else an
    inverse-CDF draw from ``p``."""
    for x, c in zip(drafts, u[:-1], strict=True):
        if c < 0.5:
            return int(x)
    return categorical(p, float(u[-1]))


def _toy_step_torch(p_i, q_i, x, alive, coins, u, i, act):
    ok = alive & (coins < 0.5)
    first = x.gather(1, first_true(ok).unsqueeze(1)).squeeze(1)
    return torch.where(ok.any(-1), first, sample_rows(p_i, u))


def test_walk_tree_is_the_numpy_walk():
    """The batched walk (survivors, the lowest surviving branch's laws, the stop, the bonus)
    against :func:`coupling.rules.walk.walk` with the same step, tree by tree and batched."""
    rng = np.random.default_rng(34)
    trees = list(random_trees(rng, 150, True, (3, 8)))
    deep = 0
    for X, P, Q in trees:
        k, g = X.shape[1:]
        coins, u = torch.tensor(rng.random((1, g, k))), torch.tensor(rng.random((1, g + 1)))
        got = walk_tree(_toy_step_torch, X, P, Q, coins, u)
        want = walk(_toy_step_numpy, X[0].numpy(), P[0].numpy(), Q[0].numpy(), coins[0].numpy(),
                    u[0].numpy())
        assert verdict_rows(got) == [want]
        deep += want[0] >= 2 and k > 1
    assert deep >= 10  # walks went past offset 1 with several branches
    same = [t for t in trees if t[1].shape == trees[0][1].shape]
    assert len(same) >= 3
    X, P, Q = (torch.cat([t[i] for t in same]) for i in range(3))
    B, k, g = X.shape
    coins, u = torch.tensor(rng.random((B, g, k))), torch.tensor(rng.random((B, g + 1)))
    batch = walk_tree(_toy_step_torch, X, P, Q, coins, u)
    for b in range(B):
        one = walk_tree(_toy_step_torch, X[b:b + 1], P[b:b + 1], Q[b:b + 1], coins[b:b + 1],
                        u[b:b + 1])
        assert verdict_rows(one) == verdict_rows(batch)[b:b + 1]
    # a bonus callback replaces the inverse-CDF bonus draw
    full = walk_tree(lambda p_i, q_i, x, alive, *_: x[:, 0], X, P, Q, coins, u,
                     bonus=lambda p_g, u_g, act: torch.full_like(act, 99))
    assert (full.accepted == g).all() and (full.next_token == 99).all()


def test_verify_tree_draws_the_keyed_uniforms_and_checks_them():
    """Without explicit uniforms ``verify_tree`` walks with the keyed coins and draws of each
    request; explicit ones must have the documented shapes."""
    X, P, Q = _tree_batch(np.random.default_rng(35), 8, 3, 3, 6)
    seeds, pos = torch.arange(8) * 7, torch.arange(8) + 100
    kw = {"replacement": True, "validate": True, "atol": None, "rule": "toy"}
    got = verify_tree(_toy_step_torch, X, P, Q, seeds, pos, accept_u=None, sample_u=None, **kw)
    coins, u = coin_uniforms(seeds, pos, 3, 3), sample_uniforms(seeds, pos, 3)
    assert verdict_rows(got) == verdict_rows(walk_tree(_toy_step_torch, X, P, Q, coins, u))
    explicit = verify_tree(_toy_step_torch, X, P, Q, 0, 0, accept_u=coins, sample_u=u, **kw)
    assert verdict_rows(explicit) == verdict_rows(got)
    with pytest.raises(ValueError, match="accept_u must be"):
        verify_tree(_toy_step_torch, X, P, Q, 0, 0, accept_u=coins[:, :, :2], sample_u=None,
                    **kw)
    with pytest.raises(ValueError, match="sample_u"):
        verify_tree(_toy_step_torch, X, P, Q, 0, 0, accept_u=None, sample_u=u[:, :3], **kw)
    # without replacement the first tokens must be distinct (they share one here)
    kw["replacement"] = False
    with pytest.raises(ValueError, match="replacement=False promises k distinct first tokens"):
        verify_tree(_toy_step_torch, X, P, Q, 0, 0, accept_u=None, sample_u=None, **kw)
