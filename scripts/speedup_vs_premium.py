#!/usr/bin/env python
"""Across saved demo runs, how a rule's speedup follows its verification call's premium.

Each ``coupling demo --json`` / ``benchmarks/bench_llm.py --json`` file records, for plain
sampling, the mean target call (``autoregressive_target_call_ms``) and, for every rule, its
own mean target call (``target_call_ms``), block efficiency and speedup, all measured in one
run with the methods interleaved prompt by prompt. The premium is the ratio of the two calls.
With the same decisions (the same seeded text, hence the same block efficiency) in every run,
what moves a rule's speedup from run to run is mostly that premium, which the machine's load
sets (``docs/RESULTS.md``, stop 27).

Prints one line per file (sorted by name), then the least-squares line of speedup on premium
and Pearson's correlation over the files that have the rule.

Usage::

    python scripts/speedup_vs_premium.py out/bench_llm_s2*.json --rule block_feature
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def rows(paths: list[Path], rule: str) -> list[tuple[str, float, float, float, float]]:
    """(file stem, premium, rule call ms, block efficiency, speedup) per file with ``rule``."""
    out = []
    for path in sorted(paths):
        demo = json.loads(path.read_text())
        demo = demo.get("demo", demo)           # bench_llm.py nests the demo's JSON
        r = demo.get("rules", {}).get(rule)
        ar_ms = demo.get("autoregressive_target_call_ms")
        if not r or not ar_ms or not r.get("target_call_ms"):
            continue
        out.append((path.stem, r["target_call_ms"] / ar_ms, r["target_call_ms"],
                    r["block_efficiency"], r["speedup_vs_autoregressive"]))
    return out


def fit(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares slope and intercept of y on x, and Pearson's r."""
    line = statistics.linear_regression(x, y)
    return line.slope, line.intercept, statistics.correlation(x, y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--rule", default="block_feature")
    args = ap.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        ap.error(f"no such file: {', '.join(missing)}")
    table = rows(args.files, args.rule)
    if not table:
        ap.error(f"no file records rule {args.rule!r} with its target call time")
    print(f"{'run':<24}{'premium':>9}{'call ms':>9}{'BE':>7}{'speedup':>9}")
    for stem, prem, ms, be, sp in table:
        print(f"{stem:<24}{prem:>9.3f}{ms:>9.1f}{be:>7.3f}{sp:>8.3f}x")
    if len(table) >= 3:
        slope, icept, r = fit([t[1] for t in table], [t[4] for t in table])
        print(f"speedup ~ {icept:.3f} {slope:+.3f} * premium over {len(table)} runs "
              f"(Pearson r = {r:.2f}); at premium 1.00: {icept + slope:.3f}x, at 1.05: "
              f"{icept + 1.05 * slope:.3f}x, at 1.10: {icept + 1.10 * slope:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
