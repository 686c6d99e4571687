"""Multi-draft torch verifiers (kseq, rrs, optimal, gumbel) against the numpy rules.

* coin for coin at a single step: fed the same uniforms, the first emitted token equals
  ``coupling.rules.<rule>.verify`` (rrs with/without replacement, kseq, optimal);
* with k = 1 every multi-draft rule is the token rule, coin for coin, along a whole block;
* exact joint law at a single step: over 200k keyed draws, the frequencies of (draft tuple,
  output) match ``RULES[rule].joint`` (chi-square), and the acceptance rate matches
  ``RULES[rule].acceptance``;
* whole-stream losslessness over a draft tree (k i.i.d. branches, or distinct first tokens
  without replacement) with tabular models: first-3-token strings have the target's exact
  law (chi-square); a broken twin must fail;
* gumbel: drafter invariance (three different drafters, identical streams, equal to plain
  keyed Gumbel sampling of the target) and the exact collision law with a shared-noise drafter.

False-positive rate of each chi-square: ALPHA = 1e-4 (fixed seeds: deterministic runs).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from coupling import block as nb
from coupling.dist import tuple_law
from coupling.rules import RULES
from coupling.rules import kseq as ref_kseq
from coupling.rules import optimal as ref_optimal
from coupling.rules import rrs as ref_rrs
from coupling.torch_backend import (
    block,
    gumbel,
    gumbel_draft,
    gumbel_noise,
    kseq,
    optimal,
    rrs,
    token,
    verify,
)
from coupling.torch_backend._common import coin_uniforms, sample_rows, sample_uniforms
from coupling.torch_backend.multi import walk_tree

from .strategies import distributions
from .test_torch_backend import ALPHA, BatchedTabular, chi2_pvalue, string_counts

MULTI = {"rrs": rrs, "kseq": kseq, "optimal": optimal}


def _random_pq(rng, V, alpha=0.5):
    return rng.dirichlet(np.full(V, alpha)), rng.dirichlet(np.full(V, alpha))


def _draw_tuples(q: np.ndarray, k: int, B: int, replacement: bool, seed: int) -> torch.Tensor:
    """B draft tuples from q (i.i.d. or successive sampling), [B, k]."""
    gen = torch.Generator().manual_seed(seed)
    qt = torch.tensor(q).expand(B, -1).clone()
    out = []
    for _ in range(k):
        x = sample_rows(qt, torch.rand(B, generator=gen, dtype=torch.float64))
        out.append(x)
        if not replacement:
            qt = qt.scatter(1, x[:, None], 0.0)
            qt = qt / qt.sum(1, keepdim=True)
    return torch.stack(out, 1)


def _single_step_inputs(p, q, X, g=1):
    """Laws for a depth-g tree whose laws do not depend on the prefix."""
    B, k = X.shape
    V = p.size
    drafts = X[:, :, None].expand(B, k, g).contiguous()
    P = torch.tensor(p).expand(B, k, g + 1, V)
    Q = torch.tensor(q).expand(B, k, g, V)
    return drafts, P, Q


# ----------------------------------------------------------------------------- coin for coin
@pytest.mark.parametrize(
    "rule, replacement",
    [("rrs", True), ("rrs", False), ("kseq", True), ("optimal", True), ("optimal", False)],
)
def test_single_step_coin_for_coin(rule, replacement):
    rng = np.random.default_rng(10)
    cases = [(3, 2), (4, 3), (6, 2)] if rule == "optimal" else [(3, 2), (8, 3), (40, 4)]
    for V, k in cases:
        for _ in range(3):
            p, q = _random_pq(rng, V, 0.4)
            B = 200
            X = _draw_tuples(q, k, B, replacement, seed=int(rng.integers(1 << 30)))
            drafts, P, Q = _single_step_inputs(p, q, X)
            coins = torch.tensor(rng.random((B, 1, k)))
            su = torch.tensor(rng.random((B, 2)))
            ver = MULTI[rule](
                drafts,
                P,
                Q,
                seeds=0,
                positions=0,
                replacement=replacement,
                accept_u=coins,
                sample_u=su,
            )
            for b in range(B):
                x = X[b].numpy()
                if rule == "rrs":
                    y = ref_rrs.verify(
                        p, q, x, coins[b, 0].numpy(), float(su[b, 0]), replacement=replacement
                    )
                elif rule == "kseq":
                    y = ref_kseq.verify(p, q, x, coins[b, 0].numpy(), float(su[b, 0]))
                else:
                    y = ref_optimal.verify(p, q, x, float(su[b, 0]), replacement=replacement)
                assert int(ver.tokens[b, 0]) == y, (rule, V, k, b)
                assert int(ver.accepted[b]) == int(y in x.tolist())


@pytest.mark.parametrize("rule", ["rrs", "kseq", "optimal"])
def test_k1_is_token_coin_for_coin(rule):
    rng = np.random.default_rng(11)
    B, g, V = 300, 4, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g)))
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * g))).reshape(B, 1, g)
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 1000, B))
    a = token(X, P, Q, seeds=seeds, positions=pos)
    b = MULTI[rule](X, P, Q, seeds=seeds, positions=pos)
    assert torch.equal(a.tokens, b.tokens)


# ------------------------------------------------------------------ exact single-step laws
@pytest.mark.parametrize(
    "rule, replacement, V, k",
    [
        ("rrs", True, 3, 2),
        ("rrs", False, 4, 3),
        ("kseq", True, 3, 3),
        ("optimal", True, 3, 2),
        ("optimal", False, 4, 2),
    ],
)
def test_single_step_joint_law(rule, replacement, V, k):
    """Frequencies of (draft tuple, output) over 200k keyed draws vs the numpy exact joint."""
    rng = np.random.default_rng(12)
    p, q = _random_pq(rng, V, 0.8)
    B = 200_000 if rule != "optimal" else 40_000
    X = _draw_tuples(q, k, B, replacement, seed=3)
    drafts, P, Q = _single_step_inputs(p, q, X)
    ver = MULTI[rule](drafts, P, Q, seeds=torch.arange(B), positions=0, replacement=replacement)
    tuples, probs = tuple_law(q, k, replacement=replacement)
    lut = torch.full((V**k,), -1, dtype=torch.int64)  # flat tuple id -> row of tuple_law
    flat = lambda t: (t * torch.tensor([V ** (k - 1 - i) for i in range(k)])).sum(-1)  # noqa: E731
    lut[flat(torch.tensor(tuples))] = torch.arange(len(tuples))
    row = lut[flat(X)]
    assert (row >= 0).all()
    counts = np.bincount((row * V + ver.tokens[:, 0]).numpy(), minlength=len(tuples) * V)
    J = RULES[rule].joint(p, q, k, replacement=replacement)
    assert chi2_pvalue(counts, J.ravel()) > ALPHA
    # acceptance = P(output is one of the drafts): binomial, 5 sigma
    acc = ver.accepted.double().mean().item()
    want = RULES[rule].acceptance(p, q, k, replacement=replacement)
    assert abs(acc - want) < 5 * (want * (1 - want) / B) ** 0.5 + 1e-12


def test_single_step_joint_negative_control():
    """rrs that keeps the target p after a rejection (no residual update) must fail."""
    rng = np.random.default_rng(12)
    p, q = _random_pq(rng, 3, 0.8)
    B, k = 200_000, 2
    X = _draw_tuples(q, k, B, True, seed=3)
    drafts, P, Q = _single_step_inputs(p, q, X)

    def broken_step(p_i, q_i, x, alive, coins, u, i, act):
        r, qc = p_i.double(), q_i.double()
        y = torch.full((x.shape[0],), -1)
        for j in range(x.shape[1]):
            xj = x[:, j : j + 1]
            acc = (
                (y < 0)
                & alive[:, j]
                & (coins[:, j] * qc.gather(1, xj)[:, 0] < r.gather(1, xj)[:, 0])
            )
            y = torch.where(acc, xj[:, 0], y)
        res = (r - qc).clamp(min=0)
        return torch.where(y >= 0, y, sample_rows(res, u))

    seeds = torch.arange(B)
    ver = walk_tree(
        broken_step,
        drafts,
        P,
        Q,
        coin_uniforms(seeds, seeds * 0, 1, k),
        sample_uniforms(seeds, seeds * 0, 1),
    )
    tuples, _ = tuple_law(q, k)
    row = X[:, 0] * 3 + X[:, 1]
    counts = np.bincount((row * 3 + ver.tokens[:, 0]).numpy(), minlength=27)
    assert chi2_pvalue(counts, RULES["rrs"].joint(p, q, k).ravel()) < ALPHA


# ----------------------------------------------------------------------------- tree streams
def iid_drafter(seed):
    gen = torch.Generator().manual_seed(seed)

    def draw(q_rows, seeds, pos):
        return sample_rows(q_rows, torch.rand(q_rows.shape[0], generator=gen, dtype=torch.float64))

    return draw


def gumbel_drafter(q_rows, seeds, pos):
    return gumbel_draft(q_rows, seeds, pos)


def simulate_tree_stream(
    verifier,
    target,
    draft,
    gamma,
    k,
    length,
    B,
    seed,
    *,
    replacement=True,
    drafter=None,
    verifier_kw=None,
) -> torch.Tensor:
    """Batched speculative decoding with k draft branches per request; first ``length`` tokens.

    Branches are i.i.d. continuations (``replacement=True``), or, without replacement, the
    k first tokens are drawn by successive sampling and each branch continues alone. A
    ``drafter(q_rows [N,V], seeds [N], positions [N]) -> [N]`` draws each token (default i.i.d.).
    """
    T, D = BatchedTabular(target), BatchedTabular(draft)
    draw = drafter or iid_drafter(seed)
    out = torch.full((B, length * (gamma + 2)), -1, dtype=torch.int64)
    n = torch.zeros(B, dtype=torch.int64)
    tt, td = T.start(B), D.start(B)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * seed
    rows = torch.arange(B)
    while bool((n < length).any()):
        # flatten branches: row b*k + j
        a, b_ = tt.repeat_interleave(k, 0), td.repeat_interleave(k, 0)
        s_rep, n_rep = seeds.repeat_interleave(k), n.repeat_interleave(k)
        xs, qs, ps = [], [], []
        for i in range(gamma):
            qi = D.laws(b_)
            if i == 0 and not replacement:
                xi = _draw_tuples_rows(qi.view(B, k, -1)[:, 0], k, seed * 7919 + int(n.sum()))
                xi = xi.reshape(-1)
            else:
                xi = draw(qi, s_rep, n_rep + i)
            ps.append(T.laws(a)), qs.append(qi), xs.append(xi)
            a, b_ = T.push(a, xi), D.push(b_, xi)
        ps.append(T.laws(a))
        V = ps[0].shape[-1]
        x = torch.stack(xs, 1).view(B, k, gamma)
        P = torch.stack(ps, 1).view(B, k, gamma + 1, V)
        Q = torch.stack(qs, 1).view(B, k, gamma, V)
        ver = verifier(x, P, Q, seeds=seeds, positions=n, **(verifier_kw or {}))
        for j in range(gamma + 1):
            m = ver.tokens[:, j] >= 0
            out[rows[m], (n + j)[m]] = ver.tokens[m, j]
            tt, td = T.push(tt, ver.tokens[:, j], m), D.push(td, ver.tokens[:, j], m)
        n = n + ver.accepted + 1
    return out[:, :length]


def _draw_tuples_rows(q_rows: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """Successive sampling of k distinct tokens per row of q_rows [B, V] -> [B, k]."""
    gen = torch.Generator().manual_seed(seed)
    qt = q_rows.clone()
    out = []
    for _ in range(k):
        x = sample_rows(qt, torch.rand(qt.shape[0], generator=gen, dtype=torch.float64))
        out.append(x)
        qt = qt.scatter(1, x[:, None], 0.0)
        qt = qt / qt.sum(1, keepdim=True).clamp(min=1e-300)
    return torch.stack(out, 1)


@pytest.fixture(scope="module")
def models():
    return nb.TabularLM(4, order=1, seed=21, concentration=0.7), nb.TabularLM(
        4, order=1, seed=22, concentration=0.7
    )


@pytest.mark.parametrize(
    "rule, replacement",
    [("rrs", True), ("rrs", False), ("kseq", True), ("gumbel", True)],
)
def test_tree_stream_lossless(rule, replacement, models):
    """100k requests, V=4, k=3 branches, gamma=2: first 3 tokens ~ target's exact law."""
    target, draft = models
    fn = {"rrs": rrs, "kseq": kseq, "gumbel": gumbel}[rule]
    kw = {} if rule == "gumbel" else {"replacement": replacement}
    toks = simulate_tree_stream(
        fn,
        target,
        draft,
        gamma=2,
        k=3,
        length=3,
        B=100_000,
        seed=2,
        replacement=replacement,
        verifier_kw=kw,
    )
    assert chi2_pvalue(string_counts(toks, 4), nb.target_law(target, 3)) > ALPHA


@pytest.mark.parametrize("replacement", [True, False])
def test_tree_stream_lossless_optimal(replacement):
    """optimal solves an LP per (request, position) with >= 2 survivors: smaller run (V=3)."""
    target = nb.TabularLM(3, order=1, seed=31, concentration=0.7)
    draft = nb.TabularLM(3, order=1, seed=32, concentration=0.7)
    toks = simulate_tree_stream(
        optimal,
        target,
        draft,
        gamma=2,
        k=2,
        length=3,
        B=30_000,
        seed=3,
        replacement=replacement,
        verifier_kw={"replacement": replacement},
    )
    assert chi2_pvalue(string_counts(toks, 3), nb.target_law(target, 3)) > ALPHA


def test_tree_stream_negative_control(models):
    """A tree walk whose residual ignores the rejected drafts (samples p) must fail."""
    target, draft = models

    def broken(x, P, Q, *, seeds, positions, **kw):
        B, k, g = x.shape

        def step(p_i, q_i, xx, alive, coins, u, i, act):
            r, qc = p_i.double(), q_i.double()
            y = torch.full((xx.shape[0],), -1)
            for j in range(k):
                xj = xx[:, j : j + 1]
                acc = (
                    (y < 0)
                    & alive[:, j]
                    & (coins[:, j] * qc.gather(1, xj)[:, 0] < r.gather(1, xj)[:, 0])
                )
                y = torch.where(acc, xj[:, 0], y)
                d = (r - qc).clamp(min=0)
                r = torch.where(
                    ((y < 0) & alive[:, j])[:, None],
                    d / d.sum(1, keepdim=True).clamp(min=1e-300),
                    r,
                )
            return torch.where(y >= 0, y, sample_rows(p_i, u))  # BUG: p instead of r

        return walk_tree(
            step,
            x,
            P,
            Q,
            coin_uniforms(seeds, positions, g, k),
            sample_uniforms(seeds, positions, g),
        )

    toks = simulate_tree_stream(broken, target, draft, gamma=2, k=3, length=3, B=100_000, seed=2)
    assert chi2_pvalue(string_counts(toks, 4), nb.target_law(target, 3)) < ALPHA


def test_gumbel_negative_control_reused_noise(models):
    """Gumbel verification that reuses one noise vector for every offset must fail."""
    target, draft = models
    from coupling.torch_backend.multi import _gumbel_target

    def broken(x, P, Q, *, seeds, positions, **kw):
        B, k, g = x.shape

        def step(p_i, q_i, xx, alive, coins, u, i, act):
            return _gumbel_target(p_i, seeds[act], positions[act])  # BUG: no + i

        z = torch.zeros(B, g + 1, dtype=torch.float64)
        return walk_tree(
            step,
            x,
            P,
            Q,
            z[:, :g, None].expand(B, g, k),
            z,
            bonus=lambda pg, u, act: _gumbel_target(pg, seeds[act], positions[act]),
        )

    toks = simulate_tree_stream(
        broken, target, draft, gamma=2, k=1, length=3, B=100_000, seed=2, drafter=gumbel_drafter
    )
    assert chi2_pvalue(string_counts(toks, 4), nb.target_law(target, 3)) < ALPHA


# ----------------------------------------------------------------------------- gumbel
def test_gumbel_drafter_invariance(models):
    """Three different drafters (two draft models, i.i.d. or shared-noise drafting, k=1 or 3)
    give identical streams under one seed, equal to plain keyed Gumbel sampling of the target."""
    target, draft = models
    other = nb.TabularLM(4, order=1, seed=99, concentration=0.3)
    B, L = 4000, 6
    runs = [
        simulate_tree_stream(gumbel, target, draft, 3, 1, L, B, seed=5, drafter=gumbel_drafter),
        simulate_tree_stream(gumbel, target, other, 3, 1, L, B, seed=5, drafter=gumbel_drafter),
        simulate_tree_stream(gumbel, target, draft, 2, 3, L, B, seed=5, drafter=iid_drafter(8)),
        simulate_tree_stream(gumbel, target, target, 4, 2, L, B, seed=5, drafter=iid_drafter(9)),
    ]
    for r in runs[1:]:
        assert torch.equal(r, runs[0])
    # plain autoregressive Gumbel-max sampling with the same keyed noise
    T = BatchedTabular(target)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * 5
    tail, out = T.start(B), []
    for t in range(L):
        G = gumbel_noise(seeds, torch.full((B,), t), 4, dtype=torch.float64)
        y = torch.argmax(T.laws(tail).log() + G, -1)
        out.append(y)
        tail = T.push(tail, y)
    assert torch.equal(torch.stack(out, 1), runs[0])


def test_gumbel_output_ignores_q():
    rng = np.random.default_rng(13)
    B, k, g, V = 50, 2, 3, 20
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g + 1)))
    X = torch.tensor(rng.integers(0, V, (B, k, g)))
    outs = []
    for a in (0.1, 1.0, 10.0):
        Q = torch.tensor(rng.dirichlet(np.full(V, a), size=(B, k, g))) + 1e-3
        Q = Q / Q.sum(-1, keepdim=True)
        outs.append(gumbel(X, P, Q, seeds=torch.arange(B), positions=3).tokens)
    outs.append(gumbel(X, P, None, seeds=torch.arange(B), positions=3).tokens)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


def test_gumbel_shared_noise_collision_law():
    """Drafter argmax(log q + G), verifier argmax(log p + G): the (draft, output) law is the
    exact Gumbel coupling joint of coupling.rules.gumbel (chi-square), and the acceptance
    is its closed form."""
    rng = np.random.default_rng(14)
    V, B = 4, 200_000
    p, q = _random_pq(rng, V, 0.8)
    seeds, pos = torch.arange(B), torch.full((B,), 17)
    x = gumbel_draft(torch.tensor(q).expand(B, V), seeds, pos)
    ver = gumbel(
        x[:, None, None],
        torch.tensor(p).expand(B, 1, 2, V),
        torch.tensor(q).expand(B, 1, 1, V),
        seeds=seeds,
        positions=pos,
    )
    counts = np.bincount((x * V + ver.tokens[:, 0]).numpy(), minlength=V * V)
    assert chi2_pvalue(counts, RULES["gumbel"].joint(p, q).ravel()) > ALPHA
    want = RULES["gumbel"].acceptance(p, q)
    acc = ver.accepted.double().mean().item()
    assert abs(acc - want) < 5 * (want * (1 - want) / B) ** 0.5


# -------------------------------------------------------------- API, validation, invariance
@pytest.mark.parametrize("rule", ["rrs", "kseq", "gumbel"])
def test_multi_batch_invariance(rule):
    rng = np.random.default_rng(15)
    B, k, g, V = 40, 3, 4, 64
    P = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B, k, g + 1)), dtype=torch.float32)
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B, k, g)), dtype=torch.float32)
    X = sample_rows(Q.reshape(-1, V).double(), torch.tensor(rng.random(B * k * g))).reshape(B, k, g)
    # make some branches share prefixes, as in a real tree
    X[:, 1, :2] = X[:, 0, :2]
    P[:, 1, :3] = P[:, 0, :3]
    Q[:, 1, :2] = Q[:, 0, :2]
    seeds, pos = torch.tensor(rng.integers(0, 2**40, B)), torch.tensor(rng.integers(0, 500, B))
    fn = {"rrs": rrs, "kseq": kseq, "gumbel": gumbel}[rule]
    full = fn(X, P, Q, seeds=seeds, positions=pos)
    perm = torch.tensor(rng.permutation(B))
    assert torch.equal(
        fn(X[perm], P[perm], Q[perm], seeds=seeds[perm], positions=pos[perm]).tokens,
        full.tokens[perm],
    )
    for b in (0, 21, 39):
        one = fn(
            X[b : b + 1],
            P[b : b + 1],
            Q[b : b + 1],
            seeds=seeds[b : b + 1],
            positions=pos[b : b + 1],
        )
        assert torch.equal(one.tokens[0], full.tokens[b])
    # emitted prefix is the chosen branch's prefix
    for b in range(B):
        n = int(full.accepted[b])
        assert full.tokens[b, :n].tolist() == X[b, int(full.branch[b]), :n].tolist()


def test_optimal_large_vocabulary_raises_clearly():
    V, k = 2000, 2
    P = torch.full((1, k, 2, V), 1.0 / V)
    Q = torch.full((1, k, 1, V), 1.0 / V)
    X = torch.tensor([[[3], [5]]])
    with pytest.raises(ValueError, match="no exact large-vocabulary sampler"):
        optimal(X, P, Q, seeds=0, positions=0)


def test_multi_validation():
    P = torch.full((2, 2, 2, 5), 0.2)
    Q = torch.full((2, 2, 1, 5), 0.2)
    X = torch.tensor([[[1], [1]], [[0], [2]]])
    with pytest.raises(ValueError, match="i.i.d. drafts only"):
        kseq(X, P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="distinct first tokens"):
        rrs(X, P, Q, seeds=0, positions=0, replacement=False)
    with pytest.raises(ValueError, match="accept_u must be"):
        rrs(X, P, Q, seeds=0, positions=0, accept_u=torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match="NaN or inf"):
        verify(
            "kseq", X, P.index_fill(-1, torch.tensor([0]), float("nan")), Q, seeds=0, positions=0
        )
    with pytest.raises(ValueError, match="q must be a floating tensor"):
        gumbel_draft(torch.zeros(3, dtype=torch.long), 0, 0)
    # a NaN or negative entry would simply never win the argmax: refused like elsewhere
    for bad, msg in ((float("nan"), "NaN or inf"), (-0.25, "negative"), (0.75, "sum to 1")):
        with pytest.raises(ValueError, match=msg):
            gumbel_draft(torch.tensor([0.25, 0.5, bad]), 0, 0)


@pytest.mark.parametrize("one_row", [True, False], ids=["numpy-walk", "torch-walk"])
@pytest.mark.parametrize("rule", ["rrs", "kseq", "optimal"])
def test_multi_draft_rules_take_laws_that_require_grad(monkeypatch, rule, one_row):
    """Laws still attached to an autograd graph (a draft in training) verify as detached
    ones do, on both walks (the numpy walk once called .numpy() on them and failed)."""
    from coupling.torch_backend import multi

    monkeypatch.setattr(multi, "ONE_ROW_IN_NUMPY", one_row)
    p = torch.tensor([[[[0, 0.5, 0.5, 0], [0, 0, 0.25, 0.75]],
                       [[0, 0.5, 0.5, 0], [0.5, 0, 0.25, 0.25]]]])
    q = torch.tensor([[[[0, 0.25, 0.75, 0]], [[0, 0.25, 0.75, 0]]]])
    d = torch.tensor([[[2], [1]]])
    want = verify(rule, d, p, q, seeds=3, positions=5)
    got = verify(rule, d, p.clone().requires_grad_(), q.clone().requires_grad_(), seeds=3,
                 positions=5)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


@pytest.mark.parametrize("small_rows", [0, 8], ids=["torch", "cpu-rows-numpy"])
def test_kseq_rho_matches_numpy_optimal_rho(monkeypatch, small_rows):
    """The batched root (sort, segment, shared segment_root on tensors) equals the numpy
    reference's to 1e-12 relative and keeps the validity margin; with ``SMALL_ROWS = 8``
    a CPU batch takes the reference row by row (what the engine's B = 1 calls run)."""
    from coupling.torch_backend import kseq_rho, multi

    monkeypatch.setattr(multi, "SMALL_ROWS", small_rows)
    rng = np.random.default_rng(16)
    for V, m in [(2, 2), (3, 2), (5, 3), (50, 4), (7, 1), (30, 8), (10, 16), (300, 2)]:
        for a in (0.02, 0.05, 0.3, 1.0, 5.0):
            for _ in range(4):
                p, q = _random_pq(rng, V, a)
                pt, qt = torch.tensor(p)[None], torch.tensor(q)[None]
                got = float(kseq_rho(pt, qt, torch.tensor([m]))[0])
                ref = ref_kseq.optimal_rho(p, q, m)
                assert abs(got - ref) <= 1e-12 * ref, (V, m, a, got, ref)
                assert ref_kseq._h(p, q, m, got) >= -64 * m * np.finfo(float).eps
    # laws rounded through float32, as the engine's are: sums off by up to ~1e-7
    for V, m in [(5, 2), (50, 4), (300, 8)]:
        for _ in range(6):
            p, q = (x.astype(np.float32).astype(np.float64) for x in _random_pq(rng, V, 0.3))
            got = float(kseq_rho(torch.tensor(p)[None], torch.tensor(q)[None],
                                 torch.tensor([m]))[0])
            ref = ref_kseq._optimal_rho(p, q, m)
            assert abs(got - ref) <= 1e-12 * ref, (V, m, got, ref)
    # batched rows with different m (one of them needing no root) give the per-row answers
    rows = [_random_pq(rng, 20, 0.5) for _ in range(10)]
    ms = torch.tensor([1, 2, 3, 4, 2, 8, 16, 3, 2, 5])
    pt = torch.tensor(np.stack([r[0] for r in rows]))
    qt = torch.tensor(np.stack([r[1] for r in rows]))
    got = kseq_rho(pt, qt, ms)
    for i, (p, q) in enumerate(rows):
        ref = ref_kseq.optimal_rho(p, q, int(ms[i]))
        assert abs(float(got[i]) - ref) <= 1e-12 * ref


@pytest.mark.parametrize("small_rows", [0, 8], ids=["torch", "cpu-rows-numpy"])
def test_kseq_rho_dense_laws_match_reference(monkeypatch, small_rows):
    """Full-support laws at V = 49152 (thousands of ratios inside (1, m): the histogram
    passes run), and clustered ones (half the ratios equal: the bins cannot split them),
    batched with different m: the torch twin (``SMALL_ROWS = 0``) and the row path give the
    root of the reference sorting every ratio, to 1e-12."""
    from coupling.torch_backend import kseq_rho, multi

    rows = []
    for seed in range(3):
        rng = np.random.default_rng(40 + seed)
        z = rng.normal(scale=3.0, size=49152)
        p = np.exp(z - z.max())
        w = (np.exp(rng.normal(size=p.size)) if seed < 2
             else np.where(np.arange(p.size) % 2, 1.5, 1.0))
        rows.append((p / p.sum(), p * w / (p * w).sum()))
    P = torch.tensor(np.stack([r[0] for r in rows] * 2))
    Q = torch.tensor(np.stack([r[1] for r in rows] * 2))
    ms = torch.tensor([2, 4, 8, 8, 2, 4])
    monkeypatch.setattr(multi, "SMALL_ROWS", small_rows)
    got = kseq_rho(P, Q, ms)
    monkeypatch.setattr(ref_kseq, "SORT_AT_MOST", P.shape[1])  # the reference sorts all
    for i in range(P.shape[0]):
        p, q = P[i].numpy(), Q[i].numpy()
        want = ref_kseq._optimal_rho(p, q, int(ms[i]))
        assert abs(float(got[i]) - want) <= 1e-12 * want, (i, float(got[i]), want)
        assert ref_kseq._h(p, q, int(ms[i]), float(got[i])) >= 0.0


def test_kseq_rho_flat_margin_exact_root(monkeypatch):
    """Where h = rho - c(beta) rounds to 0 over a whole interval (beta near 1, m = 16),
    the root is still found to a few ulps: dyadic laws (exact sums) whose smallest root
    is the last breakpoint p(y)/q(y) (above it every token lies below rho, g = D^16 > 0;
    just below it g = D^16 - q(y)(t - rho) turns negative within 1e-20). The Brent
    search this replaced returned up to 7% too large a rho here (1.0746 for 1.0062)."""
    from coupling.torch_backend import kseq_rho, multi

    cases = [
        ([0.591796875, 0.408203125], [0.5634765625, 0.4365234375], 0),
        ([0.6748046875, 0.3251953125], [0.6728515625, 0.3271484375], 0),
        ([0.9521484375, 0.0478515625], [0.9462890625, 0.0537109375], 0),
        ([0.4794921875, 0.12890625, 0.3916015625], [0.4755859375, 0.1318359375, 0.392578125],
         0),
        ([0.6376953125, 0.3623046875], [0.650390625, 0.349609375], 1),
    ]
    for small_rows in (0, 8):
        monkeypatch.setattr(multi, "SMALL_ROWS", small_rows)
        for p, q, y in cases:
            p, q = np.array(p), np.array(q)
            root = p[y] / q[y]
            assert abs(ref_kseq.optimal_rho(p, q, 16) - root) <= 4 * np.finfo(float).eps
            got = kseq_rho(torch.tensor(p)[None], torch.tensor(q)[None], torch.tensor([16]))
            assert abs(float(got[0]) - root) <= 4 * np.finfo(float).eps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("rule", ["rrs", "kseq", "gumbel"])
def test_multi_cuda_matches_cpu(rule):
    rng = np.random.default_rng(17)
    B, k, g, V = 32, 3, 4, 64
    P = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B, k, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.2), size=(B, k, g)))
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * k * g))).reshape(B, k, g)
    fn = {"rrs": rrs, "kseq": kseq, "gumbel": gumbel}[rule]
    a = fn(X, P, Q, seeds=torch.arange(B), positions=9)
    b = fn(X.cuda(), P.cuda(), Q.cuda(), seeds=torch.arange(B).cuda(), positions=9)
    assert torch.equal(a.tokens, b.tokens.cpu())


def test_gumbel_precomputed_noise_gives_the_same_verdict():
    rng = np.random.default_rng(18)
    B, k, g, V = 16, 2, 3, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, k, g)))
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 100, B))
    t = pos.view(B, 1, 1) + torch.arange(g).view(1, 1, g)
    X = gumbel_draft(Q, seeds.view(B, 1, 1), t)
    noise = gumbel_noise(seeds[:, None], pos[:, None] + torch.arange(g + 1), V, dtype=torch.float64)
    a = gumbel(X, P, Q, seeds=seeds, positions=pos)
    b = gumbel(X, P, Q, seeds=seeds, positions=pos, noise=noise)
    assert torch.equal(a.tokens, b.tokens)
    assert a.accepted.sum() > 0  # shared-noise drafts are accepted sometimes
    # the drafter's positions only: the bonus position is hashed in the call, where reached
    # (a drafter with the target's laws drafts the target's tokens: every row reaches it)
    Q2 = P[:, :, :g].clone()
    X2 = gumbel_draft(Q2, seeds.view(B, 1, 1), t)
    for x, q in ((X, Q), (X2, Q2)):
        want = gumbel(x, P, q, seeds=seeds, positions=pos)
        c = gumbel(x, P, q, seeds=seeds, positions=pos, noise=noise[:, :-1])
        assert torch.equal(want.tokens, c.tokens)
        for row in range(B):  # one row: the single-row path reads views of the noise
            one = slice(row, row + 1)
            d = gumbel(x[one], P[one], q[one], seeds=seeds[one], positions=pos[one],
                       noise=noise[one, :-1])
            assert torch.equal(d.tokens, want.tokens[one])
    assert bool((want.accepted == g).all())
    # noise of the wrong positions changes the stream (the check can fail)
    e = gumbel(X, P, Q, seeds=seeds, positions=pos, noise=noise.roll(1, dims=1))
    assert not torch.equal(a.tokens, e.tokens)
    with pytest.raises(ValueError, match="noise must be"):
        gumbel(X, P, Q, seeds=seeds, positions=pos, noise=noise[:, :-2])


# ----------------------------------------------------------------- property: coin for coin
@st.composite
def _instances(draw):
    """A small block (V <= 6, gamma <= 3, k <= 3) with exact zeros, ties and one-hots mixed in."""
    V = draw(st.integers(2, 6))
    g = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    P = np.stack([draw(distributions(V)) for _ in range(g + 1)])
    Q = np.stack([draw(distributions(V)) for _ in range(g)])
    x = np.stack(
        [[draw(st.sampled_from(np.flatnonzero(Q[i]).tolist())) for i in range(g)] for _ in range(k)]
    )
    coins = np.array(
        draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=g * k, max_size=g * k))
    ).reshape(g, k)
    su = np.array(draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=g + 1, max_size=g + 1)))
    return P, Q, x, coins, su


# coupling.block divides p/q in numpy (q may be 1e-300 here: inf, then min(1, inf) = 1)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@given(_instances())
# found by hypothesis in CI: kseq's residual is exactly 0 on token 0 and the two backends
# rounded it to opposite signs, so sample_u = 0 picked different tokens
@example((np.array([[0.5, 0.5], [1.0, 0.0]]), np.array([[1.0, 0.0]]), np.array([[0], [0]]),
          np.array([[0.5, 0.5]]), np.array([0.0, 0.0])))
def test_property_coin_for_coin_with_numpy(inst):
    """Hypothesis instances with zeros/ties: token and block (branch 0) decide exactly like
    coupling.block; at offset 0 the multi-draft rules emit exactly coupling.rules' output."""
    P, Q, x, coins, su = inst
    g, k = Q.shape[0], x.shape[0]
    Pt = torch.tensor(P)[None, None].expand(1, k, g + 1, -1)
    Qt = torch.tensor(Q)[None, None].expand(1, k, g, -1)
    X = torch.tensor(x)[None]
    su_c = torch.tensor(su)[None]
    for rule in ("token", "block"):
        fn = token if rule == "token" else block
        v = fn(
            X[:, :1],
            Pt[:, :1],
            Qt[:, :1],
            seeds=0,
            positions=0,
            accept_u=torch.tensor(coins[:, 0])[None],
            sample_u=su_c,
        )
        n = int(v.accepted[0])
        ref = nb.verify_block(rule, x[0], P, Q, uniforms=np.r_[coins[:, 0], su[n]])
        assert v.tokens[0, : n + 1].tolist() == ref.tolist()
    p0 = P[0] / P[0].sum()
    q0 = Q[0] / Q[0].sum()
    au = torch.tensor(coins)[None]
    y_rrs = rrs(X, Pt, Qt, seeds=0, positions=0, accept_u=au, sample_u=su_c).tokens[0, 0]
    assert int(y_rrs) == ref_rrs.verify(p0, q0, x[:, 0], coins[0], su[0])
    y_kseq = kseq(X, Pt, Qt, seeds=0, positions=0, accept_u=au, sample_u=su_c).tokens[0, 0]
    assert int(y_kseq) == ref_kseq.verify(p0, q0, x[:, 0], coins[0], su[0])


# --------------------------------------------------- one request on a CPU: the numpy walk
def _random_trees(rng, n: int, replacement: bool, sizes=(3, 8, 40)):
    """``n`` single-request trees (k <= 4, gamma <= 4, V in ``sizes``), peaked laws so that
    branches often share prefixes (the walk then continues with several survivors)."""
    for _ in range(n):
        k, g, V = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.choice(sizes))
        a = float(rng.choice([0.05, 0.3, 2.0]))
        P = rng.dirichlet(np.full(V, a), size=g + 1)
        Q = 0.5 * P[:g] + 0.5 * rng.dirichlet(np.full(V, a), size=g) if rng.random() < 0.5 \
            else rng.dirichlet(np.full(V, a), size=g)
        if not replacement:  # successive sampling needs k tokens of positive draft mass
            Q[0] = 0.9 * Q[0] + 0.1 / V
            k = min(k, V)
        X = np.stack([[rng.choice(V, p=Q[i]) for i in range(g)] for _ in range(k)])
        if not replacement:
            X[:, 0] = rng.choice(V, size=k, replace=False, p=Q[0])
        Pt = torch.tensor(P)[None, None].expand(1, k, g + 1, V)
        Qt = torch.tensor(Q)[None, None].expand(1, k, g, V)
        yield torch.tensor(X)[None], Pt, Qt


@pytest.mark.parametrize("rule,replacement", [("rrs", True), ("rrs", False), ("kseq", True),
                                              ("optimal", True), ("optimal", False)])
def test_one_row_numpy_walk_equals_torch_walk(monkeypatch, rule, replacement):
    """A single request on a CPU is walked by the numpy reference (``coupling.rules.tree``
    over the rules' own ``verify``); the batched torch walk (``ONE_ROW_IN_NUMPY = False``)
    gives the same verdict on 200 whole trees, and a batch's rows equal their one-row calls.
    Negative control: kseq's numpy step with rho pinned to 1 disagrees on some tree."""
    from coupling.torch_backend import multi

    fn = {"rrs": rrs, "kseq": kseq, "optimal": optimal}[rule]

    def call(X, P, Q, seed):
        return fn(X, P, Q, seeds=seed, positions=3 * seed, replacement=replacement)

    rng = np.random.default_rng(60)
    # optimal's exact LP plan enumerates V^k tuples: small vocabularies only
    trees = list(_random_trees(rng, 200, replacement, (3, 8) if rule == "optimal" else (3, 8, 40)))
    deep = 0
    for seed, (X, P, Q) in enumerate(trees):
        a = call(X, P, Q, seed)
        monkeypatch.setattr(multi, "ONE_ROW_IN_NUMPY", False)
        b = call(X, P, Q, seed)
        monkeypatch.setattr(multi, "ONE_ROW_IN_NUMPY", True)
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True)), (seed, a, b)
        deep += int(a.accepted[0]) >= 2
    assert deep >= 20  # the walks went past the first offsets
    # rows of a batch (the torch walk) against their one-row calls (the numpy walk)
    same_shape = [t for t in trees if t[1].shape == trees[0][1].shape][:6]
    X, P, Q = (torch.cat([t[i] for t in same_shape]) for i in range(3))
    seeds = torch.arange(len(same_shape))
    batch = fn(X, P, Q, seeds=seeds, positions=3 * seeds, replacement=replacement)
    for r in range(len(same_shape)):
        one = call(X[r:r + 1], P[r:r + 1], Q[r:r + 1], r)
        assert torch.equal(one.tokens[0], batch.tokens[r])
    if rule == "kseq":
        from coupling.rules import kseq as ref

        verify_at = ref.verify
        monkeypatch.setattr(ref, "verify", lambda p, q, x, c, u: verify_at(p, q, x, c, u, rho=1.0))
        differ = 0
        for seed, (X, P, Q) in enumerate(trees):
            a = call(X, P, Q, seed)
            monkeypatch.setattr(multi, "ONE_ROW_IN_NUMPY", False)
            differ += not torch.equal(a.tokens, call(X, P, Q, seed).tokens)
            monkeypatch.setattr(multi, "ONE_ROW_IN_NUMPY", True)
        assert differ > 0
