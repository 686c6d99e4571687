# Source of notebooks/06_multidraft_frontier.ipynb (percent format; build with scripts/build_notebooks.py).

# %% [markdown]
# # 06 · The multi-draft frontier: draft laws, their optima, and the rules that reach them
#
# A multi-draft verifier sees a *set* of drafts; the best lossless acceptance it can reach is
# the LP over the law of that set (`coupling.solve_draft_law`, or `rule.optimum`). Different
# drafters give different laws, hence different optima:
#
# * **i.i.d.**: $k$ independent draws from $q$ (`replacement=True`);
# * **without replacement**: $k$ distinct draws by successive sampling (`replacement=False`);
# * **greedy** (Hu et al., ICLR 2025): the $k-1$ likeliest tokens of $q$ and one draw from
#   $q$ restricted to the rest. The `greedy` rule tests that draw against its own law $g$ and
#   attains the optimum of the law, $p(T) + \sum_{y \notin T} \min(p(y), g(y))$.
#
# Rules of the registry on these laws: `kseq` (SpecTr), `rrs` (SpecInfer), `optimal` (the LP),
# `is` (Khisti et al.: select one draft by importance weights $p/q$, then speculative
# sampling against the selected draft's law $\tilde q$; with an optimal plan's weights it
# attains the i.i.d. optimum), `greedy`, and `spechub` (Sun et al., EMNLP 2024: the hub
# $\arg\max q$ and one more token; its *set* law is the greedy law at $k = 2$, and its staged
# plan attains that optimum).
#
# **What to look at:** per draft law, every rule sits at or below the LP of its own law (the
# open circles); no law dominates another; then Khisti et al.'s Figure 2, exactly, in both
# readings of which law is the target.

# %%
%matplotlib inline
import matplotlib.pyplot as plt
import numpy as np

from coupling import RULES, check_rule, solve_draft_law, tuple_law, tv
from coupling.draftsets import group_by_set
from coupling.rules.importance import ImportanceSampling
from coupling.rules.importance.figure2 import CURVES, PANELS, figure2_curves, panel_laws

IS_OPTIMAL = ImportanceSampling("optimal")
LAWS = ("iid", "wor", "greedy")
TITLES = {"iid": "k i.i.d. draws", "wor": "k distinct draws (successive sampling)",
          "greedy": "greedy: top k-1 tokens + one draw"}

p = np.array([0.30, 0.20, 0.15, 0.12, 0.10, 0.06, 0.04, 0.03])
q = np.array([0.04, 0.06, 0.10, 0.12, 0.15, 0.20, 0.18, 0.15])
print(f"TV(p, q) = {tv(p, q):.4f}")

# %% [markdown]
# ## Acceptance against k, per draft law
#
# A rule is drawn in the panel of the law whose *set* law it verifies (the set is what the LP
# sees), found from the rule's own `draft_law`; the multi-draft rules of the registry are
# listed automatically, and `is` also with the optimal selection (a parameter). Every rule is
# checked exactly (`check_rule`: lossless, its draft law, within the LP of that law).

# %%
ks = np.arange(1, 6)


def law_tuples(law, q, k):
    if law == "greedy":
        return RULES["greedy"].draft_law(q, k, replacement=k == 1)
    return tuple_law(q, k, replacement=law == "iid")


def same_sets(a, b, V):
    (_, ma, sa), (_, mb, sb) = group_by_set(*a, V), group_by_set(*b, V)
    return sa.shape == sb.shape and bool((sa == sb).all()) and np.allclose(ma, mb, atol=1e-15)


multi = {n: r for n, r in RULES.items() if r.unit == "token" and r.max_drafts != 1}
multi["is(optimal)"] = IS_OPTIMAL
lp = {law: [solve_draft_law(p, *law_tuples(law, q, k)).acceptance for k in ks] for law in LAWS}
curves = {}
for law in LAWS:
    rep = law == "iid"
    for name, rule in multi.items():
        pts = []
        for k in ks:
            if k > 1 and rule.supports(k, rep) and same_sets(
                    rule.draft_law(q, k, replacement=rep), law_tuples(law, q, k), q.size):
                report = check_rule(rule, p, q, k, replacement=rep)
                assert report.ok and abs(report.optimum - lp[law][k - 1]) < 1e-9, report
                pts.append((k, report.acceptance))
        if pts:
            curves[(law, name)] = [(1, lp[law][0])] + pts   # k = 1: every rule is the token rule

for (law, name), pts in curves.items():
    if name in ("optimal", "greedy", "spechub", "is(optimal)"):      # each attains its LP
        assert all(abs(a - lp[law][k - 1]) < 1e-9 for k, a in pts), (law, name)

fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
for ax, law in zip(axes, LAWS):
    ax.plot(ks, lp[law], "o", mfc="none", mec="k", ms=11, label="LP of this law")
    for j, ((lw, name), pts) in enumerate(curves.items()):
        if lw == law:
            x, y = zip(*pts)
            ax.plot(x, y, "-", marker="s.^vD*x"[j % 7], ms=5, label=name)
    ax.axhline(1 - tv(p, q), c="0.6", lw=0.8, ls="--")
    ax.set_title(TITLES[law], fontsize=10)
    ax.set_xlabel("number of drafts k")
    ax.legend(fontsize=7, loc="lower right")
axes[0].set_ylabel("acceptance P(Y among the drafts)")
fig.tight_layout()
plt.show()

print(" k " + "".join(f"{'LP ' + law:>12}" for law in LAWS))
for i, k in enumerate(ks):
    print(f"{k:2d} " + "".join(f"{lp[law][i]:12.5f}" for law in LAWS))

# %% [markdown]
# ## No draft law dominates
#
# Over 300 random pairs ($V = 6$, Dirichlet concentration 0.3 / 1 / 3), the optimum of the
# greedy law against the optima of $k$ i.i.d. and of $k$ distinct draws, $k = 2, 3$ (all exact:
# the greedy optimum is the `greedy` rule's closed form, the other two the min cut). Points
# above the diagonal are pairs where the greedy drafter is the better drafter.

# %%
rng = np.random.default_rng(7)
N, V = 300, 6
pairs = []
for _ in range(N):
    a = rng.choice([0.3, 1.0, 3.0])
    pairs.append((rng.dirichlet(np.full(V, a)), rng.dirichlet(np.full(V, a))))

fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
for ax, k in zip(axes, (2, 3)):
    g = np.array([RULES["greedy"].acceptance(a, b, k, replacement=False) for a, b in pairs])
    iid = np.array([RULES["optimal"].acceptance(a, b, k) for a, b in pairs])
    wor = np.array([RULES["optimal"].acceptance(a, b, k, replacement=False) for a, b in pairs])
    ax.scatter(iid, g, s=8, c="C0", label=f"vs i.i.d.: greedy higher on {(g > iid + 1e-12).sum()}")
    ax.scatter(wor, g, s=8, c="C1", label=f"vs distinct: greedy higher on {(g > wor + 1e-12).sum()}")
    ax.plot([0, 1], [0, 1], "k-", lw=0.8)
    ax.set_xlabel("optimum of k i.i.d. / k distinct draws")
    ax.set_ylabel("optimum of the greedy law")
    ax.set_title(f"k = {k}, {N} random pairs")
    ax.legend(fontsize=8, loc="upper left")
    assert (g > wor + 1e-12).any() and (g < wor - 1e-12).any()       # neither law dominates
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Khisti et al., Figure 2, exactly
#
# Alphabet $\{1, 2, 3\}$, two identical drafts, the uniform law against
# $(q_1, q_2, s - q_2)$ with $(q_1, s) = (1/3, 2/3)$ (left) and $(1/6, 5/6)$ (right). Top row:
# the uniform law is the target $p$ (this package's reading); bottom row: the other reading,
# the uniform law is the draft. Curves: the optimum (min cut), IS with an optimal plan's
# weights (markers, equal to the optimum), IS with weights $p/q$ (P(the selected draft is
# accepted), the paper's quantity, and P(the output is one of the drafts)), SpecTr (`kseq`)
# and SpecInfer (`rrs`).
#
# Derived from the min cut (asserted below): two i.i.d. drafts accept with probability 1 iff
# every token set $H$ has $p(H) \le 1 - (1 - q(H))^2$. With a uniform target that is
# $1 - \sqrt{2/3} \le q_i \le 1/\sqrt 3$: $q_2 \in [0.1835, 0.4832]$ on the left panel,
# never on the right one. With a uniform draft every target entry must lie in $[1/9, 5/9]$:
# $q_2 \in [1/9, 5/9]$ (left) and $[5/18, 5/9]$ (right). The practical rules reach 1 only at
# $p = q$.

# %%
styles = {"optimal": ("k", "-", 2.2), "is weighted, selected": ("C2", "--", 1.5),
          "is weighted": ("C2", ":", 1.8), "kseq": ("C0", "-", 1.3), "rrs": ("C3", "-", 1.3)}
intervals = {("uniform", "left"): (1 - np.sqrt(2 / 3), np.sqrt(2 / 3) - 1 / 3),
             ("uniform", "right"): None,
             ("varied", "left"): (1 / 9, 5 / 9), ("varied", "right"): (5 / 18, 5 / 9)}
fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey=True)
for r, target in enumerate(("uniform", "varied")):
    for c, panel in enumerate(PANELS):
        q1, s = PANELS[panel]
        xs = np.linspace(0.0, s, 121)
        cur = figure2_curves(panel, xs, target=target)
        assert np.abs(cur["is optimal selection"] - cur["optimal"]).max() < 1e-9
        for name in CURVES:
            assert (cur[name] <= cur["optimal"] + 1e-9).all(), name
        one = cur["optimal"] > 1 - 1e-12
        span = intervals[(target, panel)]
        want = np.zeros_like(one) if span is None else (xs >= span[0] - 1e-12) & (xs <= span[1] + 1e-12)
        assert (one == want).all(), (target, panel)
        ax = axes[r, c]
        for name, (col, ls, lw) in styles.items():
            ax.plot(xs, cur[name], color=col, ls=ls, lw=lw, label=name)
        ax.plot(xs[::8], cur["is optimal selection"][::8], "o", mfc="none", mec="k", ms=5,
                label="is optimal selection")
        who = "target uniform, draft" if target == "uniform" else "draft uniform, target"
        ax.set_title(f"{who} ({q1:.3g}, q2, {s:.3g} - q2)", fontsize=10)
        ax.set_xlabel("q2")
        ax.grid(alpha=0.3)
    axes[r, 0].set_ylabel("acceptance, two identical drafts")
axes[0, 0].legend(fontsize=8, loc="lower center")
fig.tight_layout()
plt.show()

print("target uniform, left panel: the paper's quantities at a few points")
print("   q2      OPT   IS-w sel     IS-w    K-SEQ      RRS")
for x in (0.0, 1 / 9, 1 / 6, 1 / 4, 1 / 3):
    c = figure2_curves("left", [x])
    print(f"{x:.4f}" + "".join(f"{c[n][0]:9.5f}" for n in ("optimal", "is weighted, selected",
                                                         "is weighted", "kseq", "rrs")))
p0, q0 = panel_laws("left", 1 / 9)
print(f"\n(at q2 = 1/9: target {np.round(p0, 4)}, draft {np.round(q0, 4)})")
