"""Shared pieces of the torch-twin tests: the chi-square harness, random laws and trees, batched
tabular models that decode many requests at once, and the numpy core's verdict on a batch.

Every chi-square test runs at a stated false-positive rate ``ALPHA = 1e-4`` (fixed seeds make
each run deterministic; ALPHA is the a-priori chance that a correct sampler fails it).
Outcomes of probability 0 must have count 0 (checked separately from the chi-square).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from scipy import stats

from coupling import TabularLM
from coupling.keyed import call_uniforms
from coupling.rules import RULES
from coupling.torch_backend import Verdict, sample_rows

from .strategies import distributions

ALPHA = 1e-4
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# ----------------------------------------------------------------------------- statistics
def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square goodness-of-fit p-value; 0.0 if an outcome of probability 0 was observed.

    Cells with expected count below ``min_expected`` are pooled into one cell so the
    chi-square approximation holds.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    impossible = probs <= 1e-15
    if counts[impossible].sum() > 0:  # no sampling noise explains an impossible outcome
        return 0.0
    exp = probs * n
    small = (exp < min_expected) & ~impossible
    big = ~small & ~impossible
    obs = list(counts[big])
    ex = list(exp[big])
    if small.any():
        obs.append(counts[small].sum())
        ex.append(exp[small].sum())
    obs, ex = np.array(obs), np.array(ex)
    ex *= obs.sum() / ex.sum()  # remove float dust in the normalisation
    if obs.size < 2:
        return 1.0
    return float(stats.chisquare(obs, ex).pvalue)


def string_counts(tokens: torch.Tensor, V: int) -> np.ndarray:
    """Counts of the rows of ``tokens [B, L]`` as base-``V`` strings (lexicographic order)."""
    L = tokens.shape[1]
    idx = torch.zeros(tokens.shape[0], dtype=torch.int64)
    for j in range(L):
        idx = idx * V + tokens[:, j]
    return np.bincount(idx.numpy(), minlength=V**L)


# ----------------------------------------------------------------------------- random laws
def random_pq(rng: np.random.Generator, V: int, alpha: float = 0.5):
    """Two Dirichlet(alpha) laws on V tokens."""
    return rng.dirichlet(np.full(V, alpha)), rng.dirichlet(np.full(V, alpha))


def random_path(
    rng: np.random.Generator, V: int, gamma: int, alpha: float = 0.5, zeros: bool = False
):
    """A random drafted path with Dirichlet target/draft laws (optionally with exact zeros)."""
    P = rng.dirichlet(np.full(V, alpha), size=gamma + 1)
    Q = rng.dirichlet(np.full(V, alpha), size=gamma)
    if zeros:
        P = np.where(rng.random(P.shape) < 0.3, 0.0, P)
        Q = np.where(rng.random(Q.shape) < 0.3, 0.0, Q)
        P[:, 0] += 1e-3
        Q[:, 0] += 1e-3
        P /= P.sum(1, keepdims=True)
        Q /= Q.sum(1, keepdims=True)
    x = np.array([rng.choice(V, p=Q[i]) for i in range(gamma)], dtype=np.int64)
    return x, P, Q


def stack_paths(paths, dtype=torch.float64, device="cpu"):
    """Single-branch paths ``(x, P, Q)`` as a batch ``[B, 1, g]``, ``[B, 1, g+1, V]``,
    ``[B, 1, g, V]``."""
    x = torch.tensor(np.stack([a for a, _, _ in paths]), device=device)[:, None]
    P = torch.tensor(np.stack([b for _, b, _ in paths]), dtype=dtype, device=device)[:, None]
    Q = torch.tensor(np.stack([c for _, _, c in paths]), dtype=dtype, device=device)[:, None]
    return x, P, Q


def random_trees(rng: np.random.Generator, n: int, replacement: bool, sizes=(3, 8, 40)):
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


def draft_replacement(rule: str, k: int) -> bool:
    """The ``replacement`` a test gives ``k`` branches of ``rule``: i.i.d. where the rule takes
    them, else distinct drafts of the rule's own law (``greedy``, ``spechub``)."""
    return k == 1 or True in RULES[rule].draft_laws


def own_roots(rule: str, X: torch.Tensor, Q: torch.Tensor, replacement: bool,
              rng: np.random.Generator) -> torch.Tensor:
    """``X [B, k, g]`` with each request's first tokens drawn from the rule's draft law on its
    first draft law ``Q[b, 0, 0]`` (``RULES[rule].draw_drafts`` on the float64-normalised row);
    ``X`` itself where the rule has no single-step law of ``k`` drafts (a rule that judges
    blocks drafts its branches i.i.d. or successively; ``gumbel``'s walk takes any tree)."""
    B, k, g = X.shape
    if g == 0 or RULES[rule].unit != "token" or not RULES[rule].supports(k, replacement):
        return X
    X = X.clone()
    for b in range(B):
        q0 = Q[b, 0, 0].double().numpy()
        X[b, :, 0] = torch.as_tensor(RULES[rule].draw_drafts(q0 / q0.sum(), k, replacement, rng))
    return X


def draw_tuples(q: np.ndarray, k: int, B: int, replacement: bool, seed: int) -> torch.Tensor:
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


def single_step_inputs(p, q, X, g=1):
    """Laws for a depth-g tree whose laws do not depend on the prefix."""
    B, k = X.shape
    V = p.size
    drafts = X[:, :, None].expand(B, k, g).contiguous()
    P = torch.tensor(p).expand(B, k, g + 1, V)
    Q = torch.tensor(q).expand(B, k, g, V)
    return drafts, P, Q


@st.composite
def tree_instances(draw, max_k: int = 3):
    """A small tree (V <= 6, gamma <= 3, k <= max_k, one set of laws shared by the branches)
    with exact zeros, ties and one-hots mixed in, and explicit uniforms in [0, 1):
    ``(P [g+1, V], Q [g, V], x [k, g], coins [g, k], u [g+1])``."""
    V = draw(st.integers(2, 6))
    g = draw(st.integers(1, 3))
    k = draw(st.integers(1, max_k))
    P = np.stack([draw(distributions(V)) for _ in range(g + 1)])
    Q = np.stack([draw(distributions(V)) for _ in range(g)])
    x = np.stack(
        [[draw(st.sampled_from(np.flatnonzero(Q[i]).tolist())) for i in range(g)] for _ in range(k)]
    )
    coins = np.array(
        draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=g * k, max_size=g * k))
    ).reshape(g, k)
    u = np.array(draw(st.lists(st.floats(0, 1, exclude_max=True), min_size=g + 1, max_size=g + 1)))
    return P, Q, x, coins, u


# ----------------------------------------------------------------------------- numpy cores
def verdict_rows(v: Verdict) -> list[tuple[int, int, int]]:
    """``(accepted, branch, next_token)`` per request of a twin's verdict."""
    return list(zip(v.accepted.tolist(), v.branch.tolist(), v.next_token.tolist(), strict=True))


def numpy_keyed_rows(rule: str, drafts, p, q, seeds, positions, *,
                     replacement: bool = True) -> list[tuple[int, int, int]]:
    """The numpy core ``RULES[rule].verify_block`` on each request of a batch
    (``drafts [B, k, g]``, ``p [B, k, g+1, V]``, ``q [B, k, g, V]``), fed the keyed uniforms
    :func:`coupling.keyed.call_uniforms` of the request's seed and position."""
    B, k, g = drafts.shape
    out = []
    for b in range(B):
        coins, u = call_uniforms(int(seeds[b]), int(positions[b]), g, k)
        out.append(tuple(RULES[rule].verify_block(
            drafts[b].cpu().numpy(), p[b].detach().cpu().numpy(), q[b].detach().cpu().numpy(),
            coins, u, replacement=replacement)))
    return out


# ----------------------------------------------------------------------------- decoding
class BatchedTabular:
    """Vectorised lookup of a :class:`coupling.TabularLM` for B contexts at once."""

    def __init__(self, lm: TabularLM, dtype=torch.float64):
        self.V, self.order = lm.vocab_size, lm.order
        self.table = torch.tensor(lm.table.reshape(-1, self.V), dtype=dtype)

    def start(self, B: int) -> torch.Tensor:
        return torch.full((B, self.order), self.V, dtype=torch.int64)  # BOS padding

    def push(
        self, tail: torch.Tensor, tok: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.order == 0:
            return tail
        new = torch.cat([tail[:, 1:], tok[:, None]], 1)
        return new if mask is None else torch.where(mask[:, None], new, tail)

    def laws(self, tail: torch.Tensor) -> torch.Tensor:
        if self.order == 0:
            return self.table[0].expand(tail.shape[0], -1)
        key = torch.zeros(tail.shape[0], dtype=torch.int64)
        for j in range(self.order):
            key = key * (self.V + 1) + tail[:, j]
        return self.table[key]


def simulate_stream(
    verifier, target, draft, gamma: int, length: int, B: int, seed: int, dtype=torch.float64
) -> torch.Tensor:
    """Batched speculative decoding along one branch from the empty context until
    >= ``length`` tokens. Returns the first ``length`` tokens of each of the ``B`` requests,
    ``[B, length]``."""
    T, D = BatchedTabular(target, dtype), BatchedTabular(draft, dtype)
    gen = torch.Generator().manual_seed(seed)
    out = torch.full((B, length * (gamma + 2)), -1, dtype=torch.int64)
    n = torch.zeros(B, dtype=torch.int64)
    tt, td = T.start(B), D.start(B)
    seeds = torch.arange(B, dtype=torch.int64) + 1_000_003 * seed
    rows = torch.arange(B)
    while bool((n < length).any()):
        xs, qs, ps = [], [], []
        a, b = tt, td
        for _ in range(gamma):
            qi = D.laws(b)
            xi = sample_rows(qi, torch.rand(B, generator=gen, dtype=torch.float64))
            ps.append(T.laws(a))
            qs.append(qi)
            xs.append(xi)
            a, b = T.push(a, xi), D.push(b, xi)
        ps.append(T.laws(a))
        x = torch.stack(xs, 1)[:, None]
        P = torch.stack(ps, 1)[:, None]
        Q = torch.stack(qs, 1)[:, None]
        ver = verifier(x, P, Q, seeds=seeds, positions=n)
        for j in range(gamma + 1):
            m = ver.tokens[:, j] >= 0
            out[rows[m], (n + j)[m]] = ver.tokens[m, j]
            tt, td = T.push(tt, ver.tokens[:, j], m), D.push(td, ver.tokens[:, j], m)
        n = n + ver.accepted + 1
    return out[:, :length]


def iid_drafter(seed):
    """A drafter drawing each token from its row of ``q`` with a seeded generator."""
    gen = torch.Generator().manual_seed(seed)

    def draw(q_rows, seeds, pos):
        return sample_rows(q_rows, torch.rand(q_rows.shape[0], generator=gen, dtype=torch.float64))

    return draw


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
    dtype=torch.float64,
) -> torch.Tensor:
    """Batched speculative decoding with k draft branches per request; first ``length`` tokens.

    Branches are i.i.d. continuations (``replacement=True``), or, without replacement, the
    k first tokens are drawn by successive sampling and each branch continues alone. A
    ``drafter(q_rows [N,V], seeds [N], positions [N]) -> [N]`` draws each token (default i.i.d.).
    The laws reach the verifier in ``dtype``.
    """
    T, D = BatchedTabular(target, dtype), BatchedTabular(draft, dtype)
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


def path_counts(fn, x, P, Q, B, seed_offset=0):
    """Verify one drafted path B times under B distinct seeds; counts over (tau, y)."""
    g, V = x.size, P.shape[1]
    xs = torch.tensor(x)[None, None].expand(B, 1, g)
    Ps = torch.tensor(P)[None, None].expand(B, 1, g + 1, V)
    Qs = torch.tensor(Q)[None, None].expand(B, 1, g, V)
    ver = fn(xs, Ps, Qs, seeds=torch.arange(B) + seed_offset, positions=0)
    cell = ver.accepted * V + ver.next_token
    return np.bincount(cell.numpy(), minlength=(g + 1) * V)


def disagreeing_pair() -> tuple[TabularLM, TabularLM]:
    """Order-1 target and draft models on V = 4 that disagree a lot (small Dirichlet
    concentration)."""
    return (TabularLM(4, order=1, seed=11, concentration=0.6),
            TabularLM(4, order=1, seed=12, concentration=0.6))


# ----------------------------------------------------------------------------- multi-draft checks


def check_keyed_tree_parity(rule: str, replacement: bool, trees) -> None:
    """Whole trees verified by the twin with its own keyed draws get the numpy core's verdict
    on ``call_uniforms(seed, position)``; the walks must go past their first offsets; a batch
    of trees gets its rows' verdicts."""
    core = RULES[rule]
    deep = 0
    for seed, (X, P, Q) in enumerate(trees):
        kw = {"seeds": torch.tensor([seed]), "positions": torch.tensor([3 * seed])}
        got = verdict_rows(core.torch.verify(X, P, Q, replacement=replacement, **kw))
        assert got == numpy_keyed_rows(rule, X, P, Q, replacement=replacement, **kw), seed
        deep += got[0][0] >= 2
    assert deep >= 20  # the walks went past the first offsets
    same_shape = [t for t in trees if t[1].shape == trees[0][1].shape][:6]
    assert len(same_shape) >= 2
    X, P, Q = (torch.cat([t[i] for t in same_shape]) for i in range(3))
    seeds = torch.arange(len(same_shape))
    batch = core.torch.verify(X, P, Q, seeds=seeds, positions=3 * seeds, replacement=replacement)
    assert verdict_rows(batch) == numpy_keyed_rows(rule, X, P, Q, seeds, 3 * seeds,
                                                   replacement=replacement)


def tuple_rows(X: torch.Tensor, tuples: np.ndarray, V: int) -> torch.Tensor:
    """The row of :func:`coupling.dist.tuple_law` of each draft tuple ``X [B, k]``."""
    k = X.shape[1]
    lut = torch.full((V**k,), -1, dtype=torch.int64)  # flat tuple id -> row of tuple_law
    weights = torch.tensor([V ** (k - 1 - i) for i in range(k)])
    lut[(torch.tensor(tuples) * weights).sum(-1)] = torch.arange(len(tuples))
    return lut[(X * weights).sum(-1)]


def check_single_step_joint_law(rule: str, replacement: bool, V: int, k: int, B: int) -> None:
    """Frequencies of (draft tuple, output) over ``B`` keyed draws vs the core's exact joint
    (chi-square at ALPHA); the acceptance rate vs its closed form (binomial, 5 sigma)."""
    from coupling.dist import tuple_law

    rng = np.random.default_rng(12)
    p, q = random_pq(rng, V, 0.8)
    X = draw_tuples(q, k, B, replacement, seed=3)
    drafts, P, Q = single_step_inputs(p, q, X)
    ver = RULES[rule].torch.verify(drafts, P, Q, seeds=torch.arange(B), positions=0,
                                   replacement=replacement)
    tuples, _ = tuple_law(q, k, replacement=replacement)
    row = tuple_rows(X, tuples, V)
    assert (row >= 0).all()
    counts = np.bincount((row * V + ver.tokens[:, 0]).numpy(), minlength=len(tuples) * V)
    J = RULES[rule].joint(p, q, k, replacement=replacement)
    assert chi2_pvalue(counts, J.ravel()) > ALPHA
    # acceptance = P(output is one of the drafts): binomial, 5 sigma
    acc = ver.accepted.double().mean().item()
    want = RULES[rule].acceptance(p, q, k, replacement=replacement)
    assert abs(acc - want) < 5 * (want * (1 - want) / B) ** 0.5 + 1e-12


def check_degenerate_parity(rule: str, inst) -> None:
    """A hypothesis tree (:func:`tree_instances`): the twin's verdict is the core's, and where
    the core refuses the tree (a ValueError) the twin refuses it with the same message."""
    P, Q, x, coins, u = inst
    k, g = x.shape
    Pt = torch.tensor(P)[None, None].expand(1, k, g + 1, -1)
    Qt = torch.tensor(Q)[None, None].expand(1, k, g, -1)

    def twin():
        return RULES[rule].torch.verify(torch.tensor(x)[None], Pt, Qt, seeds=0, positions=0,
                                        accept_u=torch.tensor(coins)[None],
                                        sample_u=torch.tensor(u)[None])

    try:
        want = RULES[rule].verify_block(x, Pt[0].numpy(), Qt[0].numpy(), coins, u)
    except ValueError as err:
        with pytest.raises(ValueError, match=re.escape(str(err))):
            twin()
        return
    assert verdict_rows(twin()) == [want]
