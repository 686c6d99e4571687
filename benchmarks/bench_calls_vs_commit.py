#!/usr/bin/env python
"""Verification calls of this tree against those of an earlier commit, in one process.

The earlier commit's ``coupling`` package is exported with ``git archive`` into a temporary
folder and imported under another name (``coupling_base``; its absolute imports rewritten),
so both versions run side by side on the same inputs, alternated call by call: on this shared
CPU, timings from separate runs move by 1.5-4x between phases, ratios within one process do
not. Every pair of calls must return the same verdict (the script stops otherwise).

Calls timed (B = 1, V = 49152):

* the kernels on ``bench_kernels.py``'s full-support laws (target logits N(0, 3^2), draft
  logits the target's plus N(0, 1), plain softmax; drafts i.i.d. from q), k = 1 and 4,
  gamma = 4, ``validate=False``; verdicts compared over 20 seeds;
* the engine's call ``rules_adapter.decide`` on ``bench_decide.py``'s laws (the demo's
  sampling transforms, gamma = 2), every rule.

Usage::

    python benchmarks/bench_calls_vs_commit.py --commit 8fe3907 --threads 1
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def import_commit(commit: str, dest: Path):
    """``coupling`` as of ``commit``, importable as ``coupling_base`` from ``dest``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              "coupling"], check=True, capture_output=True).stdout
    tar = dest / "base.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    pkg = dest / "coupling_base"
    (dest / "coupling").rename(pkg)
    for f in pkg.rglob("*.py"):
        src = f.read_text()
        src = re.sub(r"\b(from|import) coupling\b", r"\1 coupling_base", src)
        src = re.sub(r"\bcoupling\.(rules|torch_backend|dist|solve|llm|block|check|optimal)\b",
                     r"coupling_base.\1", src)
        f.write_text(src)
    sys.path.insert(0, str(dest))
    import coupling_base

    return coupling_base


def alternate(calls: dict, repeats: int, same) -> dict[str, float]:
    """Median ms of each call, alternated call by call; ``same(outputs)`` checks verdicts."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(repeats + 3):
        outs = []
        for name, fn in calls.items():
            t0 = time.perf_counter()
            outs.append(fn(i))
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
        same(outs)
    return {name: 1e3 * statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commit", default="HEAD~1",
                    help="the baseline commit (default: the parent of HEAD)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args(argv)
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ab_common import demo_laws
    from bench_kernels import make_inputs

    import coupling.torch_backend as now_tb
    from coupling.llm import rules_adapter as now_ra
    from coupling.llm.sampling import SamplingConfig

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        base = import_commit(args.commit, Path(tmp))
        import coupling_base.llm.rules_adapter as base_ra
        import coupling_base.torch_backend as base_tb

        def equal(outs):
            a, b = outs
            if not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
                raise SystemExit(f"verdicts differ: {a} vs {b}")

        print(f"this tree against {args.commit} ({base.__file__}), {args.threads} thread(s), "
              f"medians of {args.repeats} alternated calls")
        print(f"{'call':44s} {'base, ms':>9s} {'now, ms':>8s} {'now/base':>8s}")
        gen = torch.Generator().manual_seed(20240315)
        for k in (1, 4):
            _, drafts, p, q = make_inputs(1, k, 4, "cpu", gen)
            rules = ["token", "block"] * (k == 1) + ["kseq", "rrs", "gumbel"]
            for rule in rules:
                calls = {tag: (lambda i, tb=tb, rule=rule, d=drafts, p=p, q=q: tb.VERIFIERS[rule](
                    d, p, q, seeds=i % 20, positions=100, validate=False))
                         for tag, tb in (("base", base_tb), ("now", now_tb))}
                t = alternate(calls, args.repeats, equal)
                print(f"{f'kernel {rule}, k = {k}, full support':44s} {t['base']:9.2f} "
                      f"{t['now']:8.2f} {t['now'] / t['base']:8.2f}")
        cfg, V = SamplingConfig(0.7, 50, 0.95), 49152
        gen = torch.Generator().manual_seed(0)
        for rule, k in [("token", 1), ("block", 1), ("gumbel", 1), ("rrs", 2), ("kseq", 2),
                        ("optimal", 2), ("rrs", 4), ("kseq", 4)]:
            p, q = demo_laws(k, 2, V, cfg, gen)
            if rule == "gumbel":
                d = torch.stack([now_ra.gumbel_draft(q[:, i], 0, 100 + i) for i in range(2)], 1)
            else:
                d = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(k, 2)
            calls = {tag: (lambda i, ra=ra, rule=rule, d=d, p=p, q=q:
                           ra.decide(rule, d, q, p, 0, 100 + i))
                     for tag, ra in (("base", base_ra), ("now", now_ra))}

            def same(outs):
                if str(outs[0]) != str(outs[1]):
                    raise SystemExit(f"decisions differ: {outs}")

            t = alternate(calls, args.repeats, same)
            print(f"{f'engine decide {rule}, k = {k}':44s} {t['base']:9.2f} {t['now']:8.2f} "
                  f"{t['now'] / t['base']:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
