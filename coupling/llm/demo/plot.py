"""The demo's figure: speedups, and measured against predicted block efficiency."""

from __future__ import annotations

from pathlib import Path


def plot(res: dict, path: Path) -> None:
    """Write the run's figure to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    speedups(a1, res)
    predictions(a2, res)
    s = res["settings"]
    gated = f"@{s['draft_confidence']:g}" if s.get("draft_confidence") is not None else ""
    fig.suptitle(f"SmolLM2-135M, gamma={s['gamma']}{gated}, T={s['temperature']}, "
                 f"top-k={s['top_k']}, top-p={s['top_p']}, {s['prompts']} prompts x "
                 f"{s['max_new_tokens']} tokens")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speedups(ax, res: dict) -> None:
    """Bars: every method's tokens/s over autoregressive sampling's in the same run."""
    names = list(res["baselines"]) + list(res["rules"])
    sp = [res["baselines"][n]["speedup_vs_autoregressive"] for n in res["baselines"]]
    sp += [res["rules"][n]["speedup_vs_autoregressive"] for n in res["rules"]]
    ax.barh(names, sp, color=["grey"] * len(res["baselines"]) + ["C0"] * len(res["rules"]))
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("tokens/s relative to autoregressive (same run)")
    ax.invert_yaxis()


def predictions(ax, res: dict) -> None:
    """Points: each rule's measured block efficiency against the coupling prediction."""
    meas = [res["rules"][n]["block_efficiency"] for n in res["rules"]]
    pred = [res["rules"][n]["predicted_block_efficiency"] for n in res["rules"]]
    ax.scatter(pred, meas)
    for n, x, y in zip(res["rules"], pred, meas, strict=True):
        ax.annotate(n, (x, y), fontsize=7)
    lo, hi = min(pred + meas) * 0.95, max(pred + meas) * 1.05
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("predicted block efficiency")
    ax.set_ylabel("measured block efficiency")
