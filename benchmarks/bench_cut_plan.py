#!/usr/bin/env python
"""The optimal rule's plan for two drafts: the whole transport against the plan built through
the min cut (:class:`coupling.rules.optimal.CutPlan`), on the same laws, in the same process.

Laws: ``synthetic``, the demo's sampling transforms (T = 0.7, top-k 50, top-p 0.95) on target
logits N(0, 3^2) and draft logits the target's plus N(0, 1) (``ab_common.demo_laws``), one
first-position pair per draw; and, with ``--real``, the laws the optimal rule verified in a
run of the engine (the bundled target and feature draft, the demo's prompts, gamma = 2,
``--prompts`` prompts; loads the model). Each law is restricted to the union of its supports
(as the rule does); drafts are two i.i.d. (or, ``--without-replacement``, distinct) draws
from ``q``.

Per law, timed alternately; means over the laws (what a run pays per call) and medians:

* ``tuple LP``: ``solve_coupling(..., solver="pot")`` (the tuple
  law enumerated, grouped into sets, POT, the plan split back over the ``U^2`` tuples), then
  the drafted tuple's row;
* ``whole LP``: ``solve_sets(..., solver="pot")`` on the pair sets, then the drafted set's row
  (the same LP without the tuple enumeration);
* ``cut, one row``: a fresh :class:`CutPlan` and the drafted set's row (what the sampler does
  per call: it solves only the parts that row needs);
* ``cut, whole plan``: both parts solved and the dense plan built.

It also prints how often each part of the cut plan took a closed form or fell back to POT.

Usage::

    python benchmarks/bench_cut_plan.py
    python benchmarks/bench_cut_plan.py --real --prompts 4 --threads 2
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def synthetic_laws(n: int, seed: int):
    import torch
    from ab_common import demo_laws

    from coupling.llm.sampling import SamplingConfig

    gen = torch.Generator().manual_seed(seed)
    cfg = SamplingConfig(0.7, 50, 0.95)
    for _ in range(n):
        p, q = demo_laws(1, 1, 49152, cfg, gen)
        yield p[0, 0].double().numpy(), q[0, 0].double().numpy()


def real_laws(prompts: int, threads: int):
    """The (p, q) pairs the optimal rule verified in an engine run (captured at its core)."""
    import torch
    from ab_common import demo_prompts

    from coupling.llm import engine as E
    from coupling.llm import feature_draft as FD
    from coupling.llm import models
    from coupling.llm.drafts import DRAFT_HEAD_TOKENS
    from coupling.rules import optimal as ref

    torch.set_num_threads(threads)
    target = models.load_target("bfloat16")
    draft = FD.load_feature_draft(target, head_tokens=DRAFT_HEAD_TOKENS, int8=True)
    tok, cfg, texts = demo_prompts(prompts)
    seen = []
    verify = ref.verify

    def capture(p, q, drafts, u, **kw):
        seen.append((p.copy(), q.copy()))
        return verify(p, q, drafts, u, **kw)

    ref.verify = capture
    try:
        for i, text in enumerate(texts):
            E.generate(target, FD.FeatureDrafter(draft), text, seed=i, max_new_tokens=96,
                       cfg=cfg, eos_token_id=tok.eos_token_id, rule="optimal", gamma=2, k=2)
    finally:
        ref.verify = verify
    return seen


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    from coupling import solve_coupling
    from coupling.lp.draftsets import pair_index, pair_sets, set_members
    from coupling.lp.solve import solve_sets
    from coupling.rules.optimal import CutPlan

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--laws", type=int, default=300, help="synthetic laws")
    ap.add_argument("--real", action="store_true", help="also the laws of an engine run")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--without-replacement", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rep = not args.without_replacement
    sources = [("synthetic", list(synthetic_laws(args.laws, args.seed)))]
    if args.real:
        sources.append(("real", real_laws(args.prompts, args.threads)))
    import ot  # noqa: F401  (imported before timing: its import alone takes 0.4 s)

    rng = np.random.default_rng(args.seed)
    print(f"two drafts {'i.i.d.' if rep else 'without replacement'}; ms per law, mean (median)")
    print(f"{'laws':10s} {'n':>5s} {'support':>9s} {'tuple LP':>15s} {'whole LP':>15s} "
          f"{'cut, one row':>15s} {'vs tuple':>10s} {'vs LP':>6s} {'cut, whole plan':>16s}")
    for name, laws in sources:
        t = collections.defaultdict(list)
        how: collections.Counter = collections.Counter()
        sizes = []
        for p, q in laws:
            keep = np.flatnonzero((p > 0) | (q > 0))
            p, q = p[keep] / p[keep].sum(), q[keep] / q[keep].sum()
            if not rep and np.count_nonzero(q) < 2:
                continue
            sizes.append(p.size)
            x = rng.choice(p.size, 2, replace=rep, p=q)
            s = int(pair_index(int(x[0]), int(x[1]), p.size, rep))
            sets, mass = pair_sets(q, rep)
            members = set_members(sets, p.size)

            tm = time.perf_counter()
            c = solve_coupling(p, q, 2, replacement=rep, solver="pot")
            c.plan[np.flatnonzero((c.tuples == x).all(1))[0]]
            t0 = time.perf_counter()
            solve_sets(p, q, 2, rep, mass, members, solver="pot")[0][s]
            t1 = time.perf_counter()
            CutPlan(p, q, 2, rep, *pair_sets(q, rep)).row(s)
            t2 = time.perf_counter()
            cp = CutPlan(p, q, 2, rep, *pair_sets(q, rep))
            cp.dense()
            t3 = time.perf_counter()
            t["old"].append(t0 - tm)
            t["whole"].append(t1 - t0)
            t["row"].append(t2 - t1)
            t["dense"].append(t3 - t2)
            for part, way in cp.how.items():
                how[f"{part} {way}"] += 1
        mean = {k: 1e3 * statistics.fmean(v) for k, v in t.items()}
        med = {k: 1e3 * statistics.median(v) for k, v in t.items()}
        cell = {k: f"{mean[k]:.3f} ({med[k]:.3f})" for k in t}
        print(f"{name:10s} {len(sizes):5d} {statistics.median(sizes):3.0f}/{max(sizes):<5d} "
              f"{cell['old']:>15s} {cell['whole']:>15s} {cell['row']:>15s} "
              f"{mean['old'] / mean['row']:9.1f}x {mean['whole'] / mean['row']:5.1f}x "
              f"{cell['dense']:>16s}")
        n = len(sizes)
        print("           parts: " + ", ".join(f"{k} {100 * v / n:.1f}%"
                                               for k, v in sorted(how.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
