"""Shared checks of the single-step multi-draft rules whose drafts follow the rule's own law
(``greedy``, ``spechub``) or are selected among (``is``): exact losslessness on laws and on
whole streams, the sampler's statistics, and the torch twin against the numpy core.

Every statistical check runs at a stated false-positive rate with a fixed seed, so each run is
deterministic; ALPHA is the a-priori chance that a correct sampler fails it.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from coupling import RULES, TabularLM, check_rule, sample_stream, stream_law, target_law
from coupling.keyed import call_uniforms
from coupling.rules.base import Rule
from coupling.torch_backend import sample_rows, walk_tree
from coupling.torch_backend.common import coin_uniforms, sample_uniforms

ALPHA = 1e-4


def random_pq(rng: np.random.Generator, V: int, alpha: float = 0.5):
    """Two Dirichlet(alpha) laws on ``V`` tokens."""
    return rng.dirichlet(np.full(V, alpha)), rng.dirichlet(np.full(V, alpha))


def model_pair(V: int = 3, order: int = 1, seed: int = 0) -> tuple[TabularLM, TabularLM]:
    """Context-dependent target and draft models that disagree (Dirichlet 0.6)."""
    return (TabularLM(V, order=order, seed=seed, concentration=0.6),
            TabularLM(V, order=order, seed=seed + 1, concentration=0.6))


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs`` (cells expected below
    ``min_expected`` pooled); 0.0 if an outcome of probability 0 was observed."""
    counts, probs = np.ravel(counts).astype(float), np.ravel(probs).astype(float)
    impossible = probs <= 1e-15
    if counts[impossible].sum() > 0:
        return 0.0
    exp = probs * counts.sum()
    big = (exp >= min_expected) & ~impossible
    obs = np.append(counts[big], counts[~big & ~impossible].sum())
    ex = np.append(exp[big], exp[~big & ~impossible].sum())
    keep = ex > 0
    obs, ex = obs[keep], ex[keep] * obs[keep].sum() / ex[keep].sum()
    return 1.0 if obs.size < 2 else float(stats.chisquare(obs, ex).pvalue)


def check_exact_laws(rule: Rule, cases, optimal: bool) -> None:
    """:func:`coupling.check_rule` on every ``(p, q, k, replacement)``: lossless, the draft
    marginal is the rule's law, the closed form is the trace, within the LP optimum of its own
    law (equal to it when ``optimal``) and its bound."""
    for p, q, k, rep in cases:
        r = check_rule(rule, p, q, k, replacement=rep)
        assert r.ok, r
        if optimal:
            assert abs(r.acceptance - r.optimum) < 1e-9, r


def check_stream_lossless(rule: Rule | str, k: int, replacement: bool, *, V: int = 3,
                          gamma: int = 2, length: int = 3, seeds=(0, 5)) -> None:
    """The exact law of the first ``length`` generated tokens equals the target's, on
    context-dependent model pairs."""
    for seed in seeds:
        t, d = model_pair(V, 1, seed)
        got = stream_law(rule, t, d, gamma, length, k=k, replacement=replacement)
        assert np.abs(got - target_law(t, length)).sum() / 2 < 1e-12, seed


def sampled_stream_pvalue(rule: str, k: int, replacement: bool, seed: int,
                          n: int = 4000) -> float:
    """Chi-square p-value of ``n`` sampled 3-token streams (V = 3, gamma = 2, ``k`` branches)
    against the exact target law."""
    t, d = model_pair(3, 1, 0)
    rng = np.random.default_rng(seed)
    counts = np.zeros(27)
    for _ in range(n):
        s = sample_stream(rule, t, d, 2, 3, rng, k=k, replacement=replacement)
        counts[np.ravel_multi_index(tuple(s), (3, 3, 3))] += 1
    return chi2_pvalue(counts, target_law(t, 3))


def stream_tv(rule: Rule | str, k: int, replacement: bool, *, V: int = 3, gamma: int = 2,
              length: int = 3, seed: int = 0) -> float:
    """TV between the exact stream law of ``rule`` and the target law (a negative control's
    distortion)."""
    t, d = model_pair(V, 1, seed)
    got = stream_law(rule, t, d, gamma, length, k=k, replacement=replacement)
    return float(np.abs(got - target_law(t, length)).sum() / 2)


def own_law_trees(rule: Rule, rng: np.random.Generator, n: int, replacement: bool, kmax: int,
                  sizes=(3, 5, 12)):
    """``n`` single-request trees ``(X [1, k, g], P [1, k, g+1, V], Q [1, k, g, V])`` whose ``k``
    first tokens come from ``rule.draw_drafts``; the branches continue i.i.d. from ``q``
    (peaked laws, so that i.i.d. branches often share prefixes)."""
    for _ in range(n):
        V, g = int(rng.choice(sizes)), int(rng.integers(1, 4))
        a = float(rng.choice([0.1, 0.4, 2.0]))
        P = rng.dirichlet(np.full(V, a), size=g + 1)
        Q = rng.dirichlet(np.full(V, a), size=g)
        Q[0] = 0.9 * Q[0] + 0.1 / V
        k = int(rng.integers(1, min(V, kmax) + 1))
        roots = rule.draw_drafts(Q[0], k, replacement or k == 1, rng)
        X = np.array([[r] + [rng.choice(V, p=Q[i]) for i in range(1, g)] for r in roots])
        yield (torch.tensor(X)[None], torch.tensor(P)[None, None].expand(1, k, g + 1, V),
               torch.tensor(Q)[None, None].expand(1, k, g, V))


def core_verdict(rule: Rule, X, P, Q, coins, u, replacement: bool) -> tuple[int, int, int]:
    """The numpy core's verdict on one request (tensors ``[1, ...]``)."""
    k = X.shape[1]
    return tuple(rule.verify_block(X[0].numpy(), P[0].numpy(), Q[0].numpy(), coins, u,
                                   replacement=replacement or k == 1))


def twin_verdict(rule: Rule, X, P, Q, replacement: bool, **kw) -> tuple[int, int, int]:
    """The torch twin's verdict on one request."""
    v = rule.torch.verify(X, P, Q, replacement=replacement or X.shape[1] == 1, **kw)
    return int(v.accepted[0]), int(v.branch[0]), int(v.next_token[0])


def check_parity(rule: Rule, trees, replacement: bool, seed: int = 0, **twin_kw) -> None:
    """The twin fed explicit uniforms (``accept_u``, ``sample_u``) and the twin on its own keyed
    uniforms both decide like the numpy core on the same numbers; some walks go past their
    first offset."""
    rng = np.random.default_rng(seed)
    deep = 0
    for n, (X, P, Q) in enumerate(trees):
        _, k, g = X.shape
        coins, u = rng.random((g, k)), rng.random(g + 1)
        want = core_verdict(rule, X, P, Q, coins, u, replacement)
        got = twin_verdict(rule, X, P, Q, replacement, seeds=0, positions=0,
                           accept_u=torch.tensor(coins)[None], sample_u=torch.tensor(u)[None],
                           **twin_kw)
        assert got == want, (n, got, want)
        kc, ku = call_uniforms(n, 3 * n, g, k)
        assert twin_verdict(rule, X, P, Q, replacement, seeds=n, positions=3 * n, **twin_kw) \
            == core_verdict(rule, X, P, Q, kc, ku, replacement), n
        deep += want[0] >= 1
    assert deep >= 10


def check_k1_is_token(rule: Rule, **twin_kw) -> None:
    """With one branch the twin is the token twin, coin for coin along a block."""
    rng = np.random.default_rng(11)
    B, g, V = 300, 4, 30
    P = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g + 1)))
    Q = torch.tensor(rng.dirichlet(np.full(V, 0.3), size=(B, 1, g)))
    X = sample_rows(Q.reshape(-1, V), torch.tensor(rng.random(B * g))).reshape(B, 1, g)
    seeds, pos = torch.arange(B), torch.tensor(rng.integers(0, 1000, B))
    want = RULES["token"].torch.verify(X, P, Q, seeds=seeds, positions=pos).tokens
    assert torch.equal(want, rule.torch.verify(X, P, Q, seeds=seeds, positions=pos,
                                               **twin_kw).tokens)


def single_step_counts(verify, rule: Rule, p, q, k: int, replacement: bool, B: int,
                       seed: int, **twin_kw) -> tuple[np.ndarray, np.ndarray, float]:
    """``B`` one-offset trees with roots from ``rule.draw_drafts``, verified by ``verify``
    (a twin, or a broken step fed to the walk) under ``B`` keyed seeds: counts over
    (row of the rule's draft law, output), the law ``rule.joint``, and the rate at which the
    output was one of the drafts."""
    rng = np.random.default_rng(seed)
    tuples, _ = rule.draft_law(q, k, replacement=replacement)
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    X = np.array([rule.draw_drafts(q, k, replacement, rng) for _ in range(B)])
    drafts = torch.tensor(X)[:, :, None]
    P = torch.tensor(p).expand(B, k, 2, p.size)
    Q = torch.tensor(q).expand(B, k, 1, p.size)
    ver = verify(drafts, P, Q, seeds=torch.arange(B), positions=0, replacement=replacement,
                 **twin_kw)
    rows = np.array([index[tuple(t)] for t in X.tolist()])
    cells = rows * p.size + ver.tokens[:, 0].numpy()
    counts = np.bincount(cells, minlength=tuples.shape[0] * p.size)
    rate = float((ver.accepted >= 1).double().mean())
    return counts, rule.joint(p, q, k, replacement=replacement), rate


def check_single_step_law(rule: Rule, p, q, k: int, replacement: bool, B: int = 100_000,
                          **twin_kw) -> None:
    """The twin's (tuple, output) frequencies over ``B`` keyed draws against ``rule.joint``
    (chi-square at ALPHA), and its acceptance rate against ``rule.acceptance`` (5 sigma)."""
    counts, J, rate = single_step_counts(rule.torch.verify, rule, p, q, k, replacement, B, 3,
                                         **twin_kw)
    assert chi2_pvalue(counts, J) > ALPHA
    want = rule.acceptance(p, q, k, replacement=replacement)
    assert abs(rate - want) < 5 * (want * (1 - want) / B) ** 0.5 + 1e-12


def check_draft_roots(rule: Rule, q: np.ndarray, k: int, B: int = 100_000,
                      seed: int = 0) -> None:
    """The twin's batched drafter (``draft_roots``, what ``coupling.hf`` drafts with) draws the
    rule's draft law: over ``B`` rows of uniforms every tuple is a row of ``rule.draft_law``
    and their frequencies pass a chi-square against its probabilities at ALPHA."""
    tuples, probs = rule.draft_law(q, k, replacement=False)
    index = {tuple(t): i for i, t in enumerate(tuples.tolist())}
    u = torch.rand(B, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    X = rule.torch.draft_roots(torch.tensor(q).expand(B, -1), u)
    rows = [index.get(tuple(x)) for x in X.tolist()]
    assert None not in rows, "a tuple outside the draft law"
    assert chi2_pvalue(np.bincount(rows, minlength=len(probs)), probs) > ALPHA


def broken_twin(step):
    """A twin made of a (deliberately broken) single-step function and the shared walk."""

    def verify(drafts, P, Q, *, seeds, positions, replacement=True, **kw):
        B, k, g = drafts.shape
        return walk_tree(step, drafts, P, Q, coin_uniforms(seeds, positions, g, k),
                         sample_uniforms(seeds, positions, g))

    return verify
