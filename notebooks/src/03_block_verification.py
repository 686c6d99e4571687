# Source of notebooks/03_block_verification.ipynb (percent format; build with scripts/build_notebooks.py).

# %% [markdown]
# # 03 · Block verification: verify the draft block jointly, not token by token
#
# One speculative-decoding iteration drafts $X_1..X_\gamma$ from the draft model, calls the
# target once, and emits the accepted prefix plus one token: **block efficiency** is the
# expected number of tokens per target call, $E[\tau] + 1$.
#
# * **Token verification** (Leviathan et al. 2023) accepts $X_i$ w.p.
#   $\min(1, p_i(X_i)/q_i(X_i))$ and stops at the first rejection.
# * **Block verification** (Sun et al., *Block Verification Accelerates Speculative
#   Decoding*, ICLR 2025) carries a running weight
#   $w_i = \min(1, w_{i-1}\,p_i(X_i)/q_i(X_i))$ and picks the *longest* prefix that passes,
#   correcting with $\mathrm{norm}(\max(w_\tau p_{\tau+1} - q_{\tau+1}, 0))$. It is lossless and
#   optimal among verifiers that see only the drafted path's conditionals, so
#   block $\ge$ token for every model pair.
# * The **block transport LP** $\max_{\pi \in \Pi(Q^\gamma, P^\gamma)} E_\pi[\mathrm{LCP}(X, Y)]$
#   over whole blocks is an upper bound for any verifier (not always achievable).
#
# Everything below is exact enumeration over the $V^\gamma$ draft blocks
# (`coupling.block_efficiency`), checked against Monte Carlo with sampled calls
# (`RULES[rule].sample_call`); the last section runs both rules on next-token laws recorded
# from a real LLM.

# %%
%matplotlib inline
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import coupling
from coupling import (
    RULES,
    TabularLM,
    block_efficiency,
    expected_accepted,
    full_information_accepted,
    motivating_example,
    optimal_block_efficiency,
    optimal_expected_accepted,
)
from coupling.sequence import path_law

# %% [markdown]
# ## The paper's motivating example, in exact rationals
#
# Binary vocabulary, target $(1/3, 2/3)$, draft $(2/3, 1/3)$ at every position, $\gamma = 2$.
# Accepted draft tokens per iteration: token verification $10/9$, block verification $11/9$;
# the best lossless verifier that knows both models completely (an LP over all
# one-iteration verifiers) also reaches $11/9$; the transport bound says $12/9$, which no
# lossless verifier attains here.

# %%
t_exact, d_exact, g = motivating_example(exact=True)
t_float, d_float, _ = motivating_example(exact=False)
tok = expected_accepted("token", t_exact, d_exact, g)
blk = expected_accepted("block", t_exact, d_exact, g)
full = full_information_accepted(t_float, d_float, g)
bound = optimal_expected_accepted(t_float, d_float, g)
print(f"token {tok} | block {blk} | full-information LP {full:.6f} | transport bound {bound:.6f}")
from fractions import Fraction
assert tok == Fraction(10, 9) and blk == Fraction(11, 9)
assert abs(full - 11 / 9) < 1e-9 and abs(bound - 12 / 9) < 1e-9

# %% [markdown]
# ## Block efficiency against $\gamma$ on toy models
#
# `TabularLM(V, order=1)` is a random bigram model. We build a target and three drafts of
# decreasing quality by mixing the target's table with an unrelated one
# (draft $= \lambda\,$target $+ (1-\lambda)\,$other), $V = 4$, $\gamma = 1..6$
# (4096 draft blocks at $\gamma = 6$; the transport LP is solved up to $\gamma = 5$).

# %%
V, GAMMAS = 4, np.arange(1, 7)
target = TabularLM(V, order=1, seed=0, concentration=0.5)
other = TabularLM(V, order=1, seed=1, concentration=0.5)
drafts = {f"lambda = {lam}": TabularLM.from_table(lam * target.table + (1 - lam) * other.table)
          for lam in (0.9, 0.6, 0.3)}

eff = {}
for name, draft in drafts.items():
    eff[name] = {
        "token": np.array([block_efficiency("token", target, draft, g) for g in GAMMAS]),
        "block": np.array([block_efficiency("block", target, draft, g) for g in GAMMAS]),
        "LP": np.array([optimal_block_efficiency(target, draft, g) if g <= 5 else np.nan for g in GAMMAS]),
    }
    e = eff[name]
    assert np.all(e["block"] >= e["token"] - 1e-12), name           # block >= token, always
    assert abs(e["block"][0] - e["token"][0]) < 1e-12                 # identical at gamma = 1
    assert np.all(e["block"][:5] <= e["LP"][:5] + 1e-9), name         # LP is an upper bound

fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
for c, (name, e) in enumerate(eff.items()):
    axes[0].plot(GAMMAS, e["block"], "o-", c=f"C{c}", label=f"block, {name}")
    axes[0].plot(GAMMAS, e["token"], "s--", c=f"C{c}", mfc="none", label=f"token, {name}")
    axes[0].plot(GAMMAS, e["LP"], ":", c=f"C{c}", lw=2)
    axes[1].plot(GAMMAS, 100 * (e["block"] / e["token"] - 1), "o-", c=f"C{c}", label=name)
axes[0].plot([], [], "k:", lw=2, label="transport LP bound")
axes[0].set_xlabel("draft length gamma")
axes[0].set_ylabel("block efficiency (tokens per target call)")
axes[0].set_title(f"exact, TabularLM V = {V}")
axes[0].legend(fontsize=7)
axes[1].set_xlabel("draft length gamma")
axes[1].set_ylabel("block / token - 1  (%)")
axes[1].set_title("gain of block verification")
axes[1].legend()
fig.tight_layout()
plt.show()

print(f"{'draft':>14} {'gamma':>5} {'token':>7} {'block':>7} {'LP':>7} {'gain %':>7}")
for name, e in eff.items():
    for i, g in enumerate(GAMMAS):
        print(f"{name:>14} {g:5d} {e['token'][i]:7.4f} {e['block'][i]:7.4f} {e['LP'][i]:7.4f} "
              f"{100 * (e['block'][i] / e['token'][i] - 1):7.2f}")

# %% [markdown]
# ## Monte Carlo agrees with the exact values
#
# 4000 sampled iterations per rule at $\gamma = 4$ with the middle draft; the exact value
# must lie within the 99.9% confidence interval of the sample mean.

# %%
draft = drafts["lambda = 0.6"]
mc_rng = np.random.default_rng(11)
for rule in ("token", "block"):
    lengths = np.array([len(RULES[rule].sample_call(target, draft, 4, mc_rng, ()))
                        for _ in range(4000)])
    exact = block_efficiency(rule, target, draft, 4)
    half = 3.29 * lengths.std(ddof=1) / np.sqrt(lengths.size)
    print(f"{rule:>6}: sampled {lengths.mean():.4f} +- {half:.4f}  exact {exact:.4f}")
    assert abs(lengths.mean() - exact) < half, rule

# %% [markdown]
# ## Real (p, q) traces: SmolLM2 with two drafts, and Gemma 3
#
# `scripts/make_traces.py` ran the engine (token verification, temperature 0.7, top-p 0.95,
# $\gamma = 4$) on three model pairs and recorded, at every drafted position of every
# verification step, the drafted token, the target law $p_i$ and the draft law $q_i$ along the
# drafted path (restricted to the union of each law's top-$m$ tokens and renormalised; with
# nucleus sampling this usually *is* the whole support, and the dropped mass is stored):
#
# * **SmolLM2-135M-Instruct + the trained 1-layer token-level draft** (`traces_smollm2.npz`);
# * **SmolLM2-135M-Instruct + the feature-level (EAGLE-style) draft**, which reads the
#   target's hidden states (`traces_smollm2_feature.npz`);
# * **Gemma 3 270M base + its naive early exit** after 15 of its 18 layers, a different model
#   family and tokenizer (vocabulary 262144; `traces_gemma3.npz`).
#
# For each recorded block and each $\gamma$ up to the recorded
# length we compute the **exact** conditional law of the accepted length given the drafted
# block (`coupling.sequence.path_law` on the first $\gamma$ positions) for both rules, so the
# average of $E[\tau + 1 \mid X]$ over blocks estimates the block efficiency on this run's
# contexts with no verification noise (bars: $\pm 1$ s.e. over blocks). For block
# verification a second unbiased estimate comes from Sun et al.'s identity
# $P(\tau \ge i \mid X^{i}) = w_i$: $1 + \sum_{i \le \gamma} w_i$ (`RULES["block"].weights`); it dominates
# token verification's $1 + \sum_{i \le \gamma} \prod_{j \le i} \min(1, p_j(x_j)/q_j(x_j))$ on
# every single block. Blocks with a drafted token outside the stored support (possible when
# the draft law is broad) cannot be evaluated and are left out; their number is printed. The
# grey curve is Leviathan et al.'s i.i.d. formula
# $(1-\bar\alpha^{\gamma+1})/(1-\bar\alpha)$ with $\bar\alpha$ the mean full-vocabulary overlap
# $\sum_x \min(p_i, q_i)$ of the recorded positions.

# %%
import re

from coupling.sequence import constant_acceptance_efficiency

DATA = Path(coupling.__file__).parent / "data"
TRACES = {
    "SmolLM2-135M, trained token-level draft": DATA / "traces_smollm2.npz",
    "SmolLM2-135M, feature-level draft": DATA / "traces_smollm2_feature.npz",
    "Gemma 3 270M, early exit at layer 15": DATA / "traces_gemma3.npz",
}


def trace_blocks(z):
    """Yield (drafts as local indices, P [d+1, |S|], Q [d, |S|], realised accepted) per step.

    S is the union of the step's stored supports. The accepted-length law does not depend on
    the bonus law p_{d+1} (it is only used to draw the bonus token), which the trace does not
    store: a copy of p_d stands in for it so path_law gets a well-formed path.
    """
    step, offset = z["step"], z["offset"]
    for s in np.unique(step):
        rows = np.flatnonzero(step == s)
        rows = rows[np.argsort(offset[rows])]
        idx = z["idx"][rows]
        S = np.unique(idx[idx >= 0])
        P = np.zeros((rows.size + 1, S.size))
        Q = np.zeros((rows.size, S.size))
        for i, r in enumerate(rows):
            keep = idx[i] >= 0
            loc = np.searchsorted(S, idx[i][keep])
            P[i, loc] = z["p"][r][keep]
            Q[i, loc] = z["q"][r][keep]
        P[-1] = P[-2]
        P /= P.sum(1, keepdims=True)
        Q /= Q.sum(1, keepdims=True)
        drafted = z["drafted"][rows]
        x = np.minimum(np.searchsorted(S, drafted), S.size - 1)
        x[S[x] != drafted] = -1  # drafted token outside the stored support
        yield x, P, Q, int(z["accepted"][rows].sum())


def replay(z):
    """Exact per-block conditional block efficiencies for token and block verification."""
    blocks = list(trace_blocks(z))
    g_max = max(len(b[0]) for b in blocks)
    full = [b for b in blocks if len(b[0]) == g_max]  # steps cut short at the end of a reply are left out
    usable = [b for b in full if np.all(b[0] >= 0) and np.all(b[2][np.arange(g_max), b[0]] > 0)]
    gam = np.arange(1, g_max + 1)
    per_step = {"token": [], "block": [], "block, w identity": []}
    realised = []
    for x, P, Q, acc in usable:
        for rule in ("token", "block"):
            row = []
            for g in gam:
                tau_law, _ = path_law(rule, x[:g], P[:g + 1], Q[:g])
                row.append(float(np.dot(np.arange(g + 1), tau_law)) + 1.0)
            per_step[rule].append(row)
        w, _ = RULES["block"].weights(x, P, Q)
        per_step["block, w identity"].append(1.0 + np.cumsum(w[1:]))
        realised.append(acc + 1)
    per_step = {r: np.array(v) for r, v in per_step.items()}
    return gam, per_step, np.array(realised, dtype=float), len(blocks), len(full)


fig, axes = plt.subplots(len(TRACES), 2, figsize=(12, 4.0 * len(TRACES)))
summary = {}
for row_axes, (name, path) in zip(axes, TRACES.items()):
    z = np.load(path)
    print(f"{name}: recorded with", re.sub(r",? ?'out': [^,}]*", "", str(z["settings"])))
    gam, per_step, realised, n_blocks, n_full = replay(z)
    n = len(realised)
    se = {r: v.std(0, ddof=1) / np.sqrt(n) for r, v in per_step.items()}
    # pathwise, w_i >= prod_{j<=i} min(1, p_j/q_j) (induction), so this holds on every block:
    assert np.all(per_step["block, w identity"] >= per_step["token"] - 1e-9)
    # the two unbiased block estimates agree within 4 standard errors of their difference
    diff = per_step["block"] - per_step["block, w identity"]
    assert np.all(np.abs(diff.mean(0)) <= 4 * diff.std(0, ddof=1) / np.sqrt(n) + 1e-12)
    # the run used token verification: its realised tokens per call match the exact conditional mean
    gap = realised - per_step["token"][:, -1]
    assert abs(gap.mean()) <= 4 * gap.std(ddof=1) / np.sqrt(n)
    alpha_bar = float(np.mean(z["alpha"]))
    iid = np.array([constant_acceptance_efficiency(alpha_bar, g) for g in gam])
    ax0, ax1 = row_axes
    for rule, c, fmt in (("token", "C0", "o-"), ("block", "C3", "o-"), ("block, w identity", "C3", "x--")):
        ax0.errorbar(gam, per_step[rule].mean(0), yerr=se[rule], fmt=fmt, c=c, capsize=3, label=rule)
    ax0.plot(gam, iid, "-", c="0.6", label=f"i.i.d. formula, mean alpha = {alpha_bar:.3f}")
    ax0.errorbar([gam[-1] + 0.1], [realised.mean()], yerr=[realised.std(ddof=1) / np.sqrt(n)], fmt="s",
                 c="k", mfc="none", capsize=3, label="realised in the recorded run (token)")
    ax0.set_xlabel("draft length gamma")
    ax0.set_ylabel("block efficiency (tokens per target call)")
    ax0.set_title(f"{name}: {n} blocks", fontsize=10)
    ax0.set_xticks(gam)
    ax0.legend(fontsize=7)
    # paired differences: far less noisy than either level
    tok_mean = per_step["token"].mean(0)
    for key, fmt, lab in (("block", "o-", "path_law"), ("block, w identity", "x--", "w identity")):
        d = per_step[key] - per_step["token"]
        ax1.errorbar(gam, 100 * d.mean(0) / tok_mean, yerr=100 * d.std(0, ddof=1) / np.sqrt(n) / tok_mean,
                     fmt=fmt, c="C3", capsize=3, label=f"{lab} (+- 1 paired s.e.)")
    gain = per_step["block"].mean(0) / tok_mean - 1
    ax1.set_xlabel("draft length gamma")
    ax1.set_ylabel("block / token - 1  (%)")
    ax1.set_title("gain of block verification", fontsize=10)
    ax1.set_xticks(gam)
    ax1.legend(fontsize=8)
    kept = np.concatenate([z["p_mass"], z["q_mass"]])
    print(f"  {n_blocks} recorded steps, {n_full} with gamma = {gam[-1]} drafts, {n} usable "
          f"(drafted token inside the stored support); stored rows keep >= {kept.min():.4f} of the "
          f"mass (median {np.median(kept):.6f})")
    print(f"  realised tokens per call {realised.mean():.3f} vs exact conditional mean "
          f"{per_step['token'][:, -1].mean():.3f} (token verification, gamma = {gam[-1]})")
    print(f"  {'gamma':>5} {'token':>7} {'block':>7} {'block (w)':>9} {'gain %':>7} {'iid formula':>12}")
    for i, g in enumerate(gam):
        print(f"  {g:5d} {per_step['token'][:, i].mean():7.3f} {per_step['block'][:, i].mean():7.3f} "
              f"{per_step['block, w identity'][:, i].mean():9.3f} {100 * gain[i]:7.2f} {iid[i]:12.3f}")
    summary[name] = (alpha_bar, gain)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** block verification never loses to token verification (exactly on toy
# models; on every recorded real block through the $w$ identity), and its gain grows with
# $\gamma$ and with how often drafts survive: on the toy pairs it reaches 4-15% at
# $\gamma = 6$. On the real traces the gains are small (under one percent at $\gamma = 4$,
# printed above): most rejections happen at the first drafted
# position, where the two rules coincide, and a higher mean overlap alone does not widen the
# gap (Gemma's early exit accepts far more often than either SmolLM2 draft, yet gains about
# as little as the token-level draft).
