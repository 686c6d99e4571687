"""What the tree rules' tests share: the numpy core and the batched twin run on the same drafted
trees and uniforms, keyed-uniform and batch invariance, and chi-square tests of sampled
outcomes against exact laws."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from coupling.keyed import call_uniforms
from coupling.rules.base import Rule
from coupling.rules.trie import draft_trees
from tests.strategies import drafted_trees


def numpy_verdicts(rule: Rule, drafts, P, Q, coins, u, *, replacement: bool = True,
                   **_) -> list[tuple[int, int, int]]:
    """``rule.verify_block`` request by request: ``[(accepted, branch, next_token)]``."""
    return [tuple(int(v) for v in rule.verify_block(drafts[b], P[b], Q[b], coins[b], u[b],
                                                    replacement=replacement))
            for b in range(drafts.shape[0])]


def twin_verdicts(rule: Rule, drafts, P, Q, coins=None, u=None, *, seeds=0, positions=0,
                  **kwargs) -> list[tuple[int, int, int]]:
    """The batched twin on the same arrays (explicit uniforms if given, else keyed)."""
    extra = {} if coins is None else {"accept_u": torch.tensor(coins),
                                      "sample_u": torch.tensor(u)}
    v = rule.torch.verify(torch.tensor(drafts), torch.tensor(P), torch.tensor(Q), seeds=seeds,
                          positions=positions, **extra, **kwargs)
    return list(zip(v.accepted.tolist(), v.branch.tolist(), v.next_token.tolist(), strict=True))


def keyed_uniforms(seeds, positions, gamma: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The keyed uniforms of each request, stacked: ``(coins [B, g, k], u [B, g + 1])``."""
    pairs = [call_uniforms(int(s), int(t), gamma, k) for s, t in zip(seeds, positions,
                                                                       strict=True)]
    return np.stack([c for c, _ in pairs]), np.stack([u for _, u in pairs])


def outcome_pvalue(rule: Rule, law, drafts, P, Q, n: int, **kwargs) -> float:
    """Chi-square p-value of the twin's outcomes ``(accepted prefix, next token)`` on ``n``
    copies of one tree (keyed by seeds ``0..n-1``) against ``law``, a tree law
    ``[(prefix, probability, next law)]``."""
    cells: dict = {}
    for prefix, pr, nxt in law:
        for y in np.flatnonzero(np.asarray(nxt, dtype=float) > 0):
            cells[prefix + (int(y),)] = float(pr) * float(nxt[y])
    rep = lambda a: torch.tensor(np.repeat(a[None], n, axis=0))  # noqa: E731
    v = rule.torch.verify(rep(drafts), rep(P), rep(Q), seeds=torch.arange(n), positions=7,
                          **kwargs)
    counts: dict = {}
    for b, tau, y in zip(v.branch.tolist(), v.accepted.tolist(), v.next_token.tolist(),
                         strict=True):
        key = tuple(int(t) for t in drafts[b, :tau]) + (y,)
        counts[key] = counts.get(key, 0) + 1
    keys = sorted(set(cells) | set(counts))
    obs = np.array([counts.get(c, 0) for c in keys], dtype=float)
    exp = np.array([cells.get(c, 0.0) for c in keys]) * n
    if (exp[obs > 0] == 0).any():        # an outcome the law forbids
        return 0.0
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def sampled_core_pvalues(rule: Rule, references: list[Rule], t, d, gamma: int, k: int, *,
                         n: int = 20_000, seed: int = 7) -> list[float]:
    """``rule.verify_block`` on ``n`` trees drafted from ``(t, d)`` with ``rng`` uniforms: the
    chi-square p-value of its emitted outcomes against each reference rule's exact law of a
    call (0 where it emits an outcome the law forbids)."""
    trees = list(draft_trees(t, d, gamma, k))
    probs = np.array([float(pr) for _, pr, _, _ in trees])
    rng = np.random.default_rng(seed)
    counts: dict = {}
    for i in rng.choice(len(trees), size=n, p=probs / probs.sum()):
        x, _, P, Q = trees[i]
        tau, b, y = rule.verify_block(x, P, Q, rng.random((gamma, k)), rng.random(gamma + 1))
        key = tuple(int(v) for v in x[b, :tau]) + (y,)
        counts[key] = counts.get(key, 0) + 1
    out = []
    for ref in references:
        law: dict = {}
        for u, _, pr in ref.outcomes(t, d, gamma, (), k=k):
            law[u] = law.get(u, 0.0) + float(pr)
        keys = sorted(set(law) | set(counts))
        obs = np.array([counts.get(c, 0) for c in keys], dtype=float)
        exp = np.array([law.get(c, 0.0) for c in keys]) * n
        keep = exp > 0
        if obs[~keep].sum() > 0:
            out.append(0.0)
            continue
        out.append(float(stats.chisquare(obs[keep],
                                         exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue))
    return out


def assert_one_path_is_block(rule: Rule) -> None:
    """With one path the numpy core decides as block verification on the same uniforms."""
    from coupling import RULES

    drafts, P, Q = drafted_trees(4, 3, 1, 300, seed=5)
    rng = np.random.default_rng(5)
    coins, u = rng.random((300, 3, 1)), rng.random((300, 4))
    assert numpy_verdicts(rule, drafts, P, Q, coins, u) \
        == numpy_verdicts(RULES["block"], drafts, P, Q, coins, u)
