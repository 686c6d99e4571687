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
# (`coupling.block.block_efficiency`), checked against Monte Carlo with `sample_block`;
# the last section runs both rules on next-token laws recorded from a real LLM.

# %%
%matplotlib inline
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import coupling
from coupling.block import (
    TabularLM,
    block_efficiency,
    expected_accepted,
    full_information_accepted,
    motivating_example,
    optimal_block_efficiency,
    optimal_expected_accepted,
    path_law,
    sample_block,
)

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
    lengths = np.array([len(sample_block(rule, target, draft, 4, mc_rng)) for _ in range(4000)])
    exact = block_efficiency(rule, target, draft, 4)
    half = 3.29 * lengths.std(ddof=1) / np.sqrt(lengths.size)
    print(f"{rule:>6}: sampled {lengths.mean():.4f} +- {half:.4f}  exact {exact:.4f}")
    assert abs(lengths.mean() - exact) < half, rule
