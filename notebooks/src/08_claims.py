# Source of notebooks/08_claims.ipynb (percent format; build with scripts/build_notebooks.py).

# %% [markdown]
# # 08 · Published claims, settled exactly
#
# A verification rule's paper makes two kinds of claim: that the rule is lossless, and that it
# accepts more than another rule. Both can be settled exactly on small sequence models: the
# output law by enumeration, the acceptance against the LP of the rule's information model,
# whose optimum no lossless verifier of that model can beat. `docs/claims.md` is the ledger;
# this notebook plots three of its rows on random order-1 `TabularLM` pairs (every number
# exact, no sampling):
#
# * **Hierarchical Speculative Decoding** (Zhou et al., arXiv:2601.05724) calls itself "a
#   provably lossless verification method" and reports more tokens per call than block
#   verification on one drafted path. Block verification is the optimum over every lossless
#   verifier of one path, so both cannot hold where HSD accepts more;
# * **UniVer** (Weng, Hu, Yairi, arXiv:2605.04543) claims the optimal acceptance within its
#   framework and 4.2-8.5% longer acceptance than recursive rejection sampling without
#   replacement. Its text and code are not public here, so what is settled is the ceiling:
#   the full-information tree LP, above which no lossless tree verifier can go;
# * **delayed tree expansion** (Thomas et al., arXiv:2602.16994) says optimal-transport tree
#   rules win near the root while traversal wins deeper.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from coupling import (
    TabularLM,
    Tree,
    accepted_length_law,
    full_information_tree_accepted,
    tree_verifier_lp,
)
from coupling.conformance import check_verifier, from_rule
from coupling.conformance.museum import HsdSinglePath
from coupling.lm import path_laws


def random_pairs(n, seed=0):
    rng = np.random.default_rng(seed)
    for s in range(n):
        c = float(rng.choice([0.3, 0.6, 1.0]))
        yield (TabularLM(3, order=1, seed=2 * s, concentration=c),
               TabularLM(3, order=1, seed=2 * s + 1, concentration=c))


# %% [markdown]
# ## HSD: more tokens than the single-path optimum, and lossy wherever it has them
#
# For each pair, with $\gamma = 3$: tokens per call of HSD's single-path verification (as its
# public code runs it, `proofs/hsd_lossy.py`) and of block verification, one call after the
# empty context, from each verifier's exact law given the drafted path; and the exact total
# variation between the first four tokens HSD generates and the target's
# (`check_verifier(..., exact=True)` on that pair). Block verification's own TV is the control.

# %%
GAMMA = 3


def tokens_per_call(verify, target, draft):
    total = 0.0
    for x, prob, P, Q in path_laws(target, draft, GAMMA):
        law = verify.law(x[None], P[None], Q[None])
        total += prob * sum(len(e) * w for e, w in law.items())
    return total


hsd, block = HsdSinglePath(), from_rule("block")
rows = []
for t, d in random_pairs(40):
    exact = dict(exact=True, gamma=GAMMA, length=GAMMA + 1, id_space=None, pairs=[(t, d)])
    rows.append((tokens_per_call(hsd, t, d), tokens_per_call(block, t, d),
                 check_verifier(hsd, **exact).tv, check_verifier(block, **exact).tv))
h, b, tv_hsd, tv_block = map(np.array, zip(*rows, strict=True))
assert (tv_block < 1e-12).all()               # the control: block verification is lossless
assert ((h > b) <= (tv_hsd > 1e-9)).all()     # wherever HSD beats the optimum, it is lossy

fig, ax = plt.subplots(figsize=(7, 4.2))
ax.scatter(tv_hsd, h / b - 1, s=18)
ax.axhline(0, color="k", lw=0.8)
ax.set_xlabel("exact TV of HSD's first four tokens from the target's")
ax.set_ylabel("HSD's tokens per call over block verification's")
ax.yaxis.set_major_formatter(plt.matplotlib.ticker.PercentFormatter(1.0))
ax.set_title(f"HSD against the single-path optimum, {len(h)} pairs, gamma = {GAMMA}")
fig.tight_layout()
plt.show()
print(f"HSD ahead of block on {np.mean(h > b):.0%} of pairs (mean {np.mean(h / b - 1):+.1%}); "
      f"TV {tv_hsd.min():.3f} to {tv_hsd.max():.3f}; block's TV at most {tv_block.max():.0e}")

# %% [markdown]
# ## UniVer: how much room a lossless tree verifier has over recursive rejection sampling
#
# Two draft trees whose siblings are drawn without replacement (EAGLE's and SpecInfer's
# layout): two children under each of two levels, and two distinct chains of three tokens.
# For each pair, the gain in tokens per call over `rrs` of traversal verification, of the
# per-node optimal transport (`optimal`) and of the tree LP, the ceiling of every lossless
# verifier that sees the tree. The band is UniVer's claimed 4.2-8.5%.

# %%
TREES = {"[2, 2]": Tree.from_branching([2, 2], "distinct"),
         "2 chains of 3": Tree.from_chains(2, 3, replacement=False)}


def tpc(rule, t, d, tree):
    law = accepted_length_law(rule, t, d, tree=tree)
    return 1 + law @ np.arange(law.size)


gain = {name: {r: [] for r in ("traversal", "optimal", "LP")} for name in TREES}
for t, d in random_pairs(30, seed=1):
    for name, tree in TREES.items():
        base = tpc("rrs", t, d, tree)
        gain[name]["traversal"].append(tpc("traversal", t, d, tree) / base - 1)
        gain[name]["optimal"].append(tpc("optimal", t, d, tree) / base - 1)
        gain[name]["LP"].append((1 + full_information_tree_accepted(t, d, tree=tree)) / base - 1)
for name in TREES:
    for r in ("traversal", "optimal"):          # the LP is a ceiling
        assert (np.array(gain[name][r]) <= np.array(gain[name]["LP"]) + 1e-9).all()

fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
for ax, (name, rs) in zip(axes, gain.items(), strict=True):
    bins = np.linspace(0, max(max(v) for v in rs.values()) + 0.01, 16)
    for r, v in rs.items():
        ax.hist(v, bins, histtype="step", lw=2, label=f"{r} (mean {np.mean(v):+.1%})")
    ax.axvspan(0.042, 0.085, color="C3", alpha=0.15, label="UniVer's claimed gain")
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.PercentFormatter(1.0))
    ax.set_xlabel("tokens per call over rrs without replacement")
    ax.set_title(f"tree {name}, V = 3")
    ax.legend(fontsize=8)
axes[0].set_ylabel("pairs")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Delayed tree expansion: where each rule's acceptance sits
#
# Two i.i.d. paths of three tokens from the root; for each rule, the mean probability of
# accepting at least $d$ tokens, and the LP's (one optimal solution: the optimum's split by
# depth need not be unique).

# %%
root = Tree.from_chains(2, 3)
depth = {r: [] for r in ("rrs", "kseq", "optimal", "traversal", "LP")}
for t, d in random_pairs(30, seed=2):
    for r in depth:
        if r == "LP":
            _, emitted = tree_verifier_lp(t, d, tree=root).solve()
            law = np.bincount([len(u) - 1 for u in emitted], list(emitted.values()), 4)
        else:
            law = accepted_length_law(r, t, d, tree=root)
        depth[r].append(law[::-1].cumsum()[::-1][1:])
fig, ax = plt.subplots(figsize=(7, 4.2))
for r, v in depth.items():
    ax.plot([1, 2, 3], np.mean(v, axis=0), "o-", label=r, lw=2 if r == "LP" else 1.2)
ax.set_xticks([1, 2, 3])
ax.set_xlabel("depth d")
ax.set_ylabel("mean P(accepted >= d)")
ax.set_title("two i.i.d. paths of three tokens, 30 pairs")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** HSD's public code beats the single-path optimum only by leaving the target's
# law; UniVer's claimed gain is inside the room the tree LP leaves on some pairs and outside it
# on others, so it can only be settled on its own trees and models; and the per-node optimal
# transport leads near the root while traversal catches up deeper, as the delayed-expansion
# paper says. The full ledger, with 1,000-pair runs and their commands, is `docs/claims.md`.
