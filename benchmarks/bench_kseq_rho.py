#!/usr/bin/env python
"""K-SEQ's rho root (``torch_backend.kseq_rho``) against the Illinois iteration it replaced,
in the same process, with the largest difference of the roots.

Modes: ``illinois`` (the baseline, kept below as it was up to stop 13: regula falsi on the
bracket until it is 1e-15 wide, one pass over V per evaluation, no sort); ``torch`` (the
torch path, forced with ``SMALL_ROWS = 0``: Illinois only while many breakpoints p/q lie in
the bracket, then the few left ordered and the smooth segment solved exactly); ``default``
(what the engine runs: on a CPU, ``B <= SMALL_ROWS`` rows of at most ``SMALL_V`` tokens take
the numpy reference row by row). Laws: the demo's sampling transforms (T = 0.7,
top-k 50, top-p 0.95) of N(0, 3^2) target logits and target + N(0, 1) draft logits at
V = 49152 (``top-k``), or the plain softmax at T = 1 where every token has mass and
thousands of ratios p/q fall inside (1, m) (``dense``); ``U`` = the support the engine hands
the rule (the union support of the batch), or the full vocabulary.

Usage::

    python benchmarks/bench_kseq_rho.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time


def illinois_rho(p, q, m, iters: int = 200):
    """The root as computed up to stop 13 (the baseline)."""
    import torch

    from coupling.torch_backend.multi import _geometric_c

    B, V = p.shape
    rho = torch.ones(B, dtype=torch.float64, device=p.device)
    mf_all = m.to(torch.float64)
    need = mf_all > 1
    if not bool(need.any()):
        return rho
    kmax = int(m.max())
    b1 = torch.minimum(p, q).sum(-1)
    h1 = 1.0 - _geometric_c(b1, mf_all, kmax)
    need = need & (b1 > 0) & (h1 < 0)
    if not bool(need.any()):
        return rho
    idx = torch.nonzero(need).squeeze(1)
    P, Q, mf = p[idx], q[idx], mf_all[idx]

    def h_of(x):
        return x - _geometric_c(torch.minimum(Q, P / x.unsqueeze(1)).sum(-1), mf, kmax)

    lo, hi = torch.ones_like(mf), mf.clone()
    hlo, hhi = h1[idx], h_of(hi).clamp(min=0.0)
    side = torch.zeros_like(mf)
    for it in range(iters):
        x = hi - hhi * (hi - lo) / torch.where(hhi > hlo, hhi - hlo, 1.0)
        x = torch.where((x > lo) & (x < hi), x, 0.5 * (lo + hi))
        hx = h_of(x)
        good = hx >= 0
        hlo = torch.where(good & (side > 0), 0.5 * hlo, hlo)
        hhi = torch.where(~good & (side < 0), 0.5 * hhi, hhi)
        hi, hhi = torch.where(good, x, hi), torch.where(good, hx, hhi)
        lo, hlo = torch.where(good, lo, x), torch.where(good, hlo, hx)
        side = torch.where(good, 1.0, -1.0)
        if it % 4 == 3 and float(((hi - lo) / hi).amax()) <= 1e-15:
            break
    return rho.index_put((idx,), hi)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm.sampling import SamplingConfig, probs
    from coupling.torch_backend import kseq_rho, multi

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=58.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SamplingConfig(0.7, 50, 0.95)
    V = 49152
    gen = torch.Generator().manual_seed(0)
    small = multi.SMALL_ROWS

    def torch_path(p, q, m):
        multi.SMALL_ROWS = 0
        try:
            return kseq_rho(p, q, m)
        finally:
            multi.SMALL_ROWS = small

    modes = {"illinois": illinois_rho, "torch": torch_path, "default": kseq_rho}
    print(f"{args.threads} thread(s), medians of {args.repeats} calls (ms); ratios against "
          f"illinois; % of a {args.step_ms:g} ms target step for the default")
    dense_cfg = SamplingConfig(1.0, 0, 1.0)
    print(f"{'law':6s} {'B':>3s} {'U':>6s} {'m':>2s} {'illinois':>9s} {'torch':>8s} "
          f"{'default':>8s} {'torch/ill':>9s} {'default/ill':>11s} {'% step':>7s} "
          f"{'max |drho|/rho':>14s}")
    for law, B, full, m in [("top-k", 1, False, 2), ("top-k", 1, False, 4), ("top-k", 1, False, 8),
                            ("top-k", 1, True, 2), ("top-k", 1, True, 4), ("dense", 1, True, 2),
                            ("dense", 1, True, 4), ("top-k", 8, False, 4),
                            ("top-k", 64, False, 4), ("top-k", 64, True, 4),
                            ("dense", 64, True, 4)]:
        lp = torch.randn(B, V, generator=gen) * 3
        lq = lp + torch.randn(B, V, generator=gen)
        c = cfg if law == "top-k" else dense_cfg
        p, q = probs(lp, c).double(), probs(lq, c).double()
        if not full:   # the engine's compression: the union support of the batch
            idx = ((p > 0) | (q > 0)).any(0).nonzero().squeeze(1)
            p, q = p[:, idx].contiguous(), q[:, idx].contiguous()
        mm = torch.full((B,), m)
        times = {k: [] for k in modes}
        roots = {}
        reps = args.repeats if not (full and B > 1) else max(3, args.repeats // 10)
        for i in range(reps + 2):
            for name, fn in modes.items():
                t0 = time.perf_counter()
                roots[name] = fn(p, q, mm)
                if i >= 2:
                    times[name].append(time.perf_counter() - t0)
        t = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        d = max(float(((roots[k] - roots["illinois"]).abs() / roots["illinois"]).max())
                for k in ("torch", "default"))
        print(f"{law:6s} {B:3d} {p.shape[1]:6d} {m:2d} {t['illinois']:9.2f} {t['torch']:8.2f} "
              f"{t['default']:8.2f} {t['torch'] / t['illinois']:9.2f} "
              f"{t['default'] / t['illinois']:11.2f} {100 * t['default'] / args.step_ms:6.1f}% "
              f"{d:14.1e}")
    kernel_ab(args, illinois_rho)
    return 0


def kernel_ab(args, baseline_root) -> None:
    """Whole calls with the root swapped, alternated call by call: the ``kseq`` kernel on
    ``bench_kernels.py``'s inputs (B = 1, gamma = 4, V = 49152, full-support laws) and the
    engine's ``rules_adapter.decide`` on ``bench_decide.py``'s (gamma = 2, on the support)."""
    import torch
    from ab_common import demo_laws

    from coupling.llm import rules_adapter
    from coupling.llm.sampling import SamplingConfig
    from coupling.torch_backend import VERIFIERS, multi

    current = multi.kseq_rho
    gen = torch.Generator().manual_seed(20240315)
    V = 49152
    cfg = SamplingConfig(0.7, 50, 0.95)
    print(f"\nwhole calls, root swapped (medians of {args.repeats}; % of a "
          f"{args.step_ms:g} ms step)")
    print(f"{'call':34s} {'illinois, ms':>12s} {'current, ms':>11s} {'ratio':>6s} "
          f"{'% step':>7s}")
    cases = []
    for k in (1, 4):  # bench_kernels: dense laws over the full vocabulary
        z = torch.randn(1, k, 5, V, generator=gen) * 3.0
        p = torch.softmax(z, -1)
        q = torch.softmax(z[:, :, :4] + torch.randn(1, k, 4, V, generator=gen), -1)
        x = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(1, k, 4)
        cases.append((f"kernel kseq, k = {k}, dense, full V",
                      lambda x=x, p=p, q=q: VERIFIERS["kseq"](x, p, q, seeds=0, positions=100,
                                                              validate=False)))
    for k in (2, 4):  # bench_decide: the engine's call on the laws' support
        p, q = demo_laws(k, 2, V, cfg, gen)
        d = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(k, 2)
        cases.append((f"engine decide kseq, k = {k}",
                      lambda d=d, p=p, q=q: rules_adapter.decide("kseq", d, q, p, 0, 100)))
    for name, call in cases:
        times = {"illinois": [], "current": []}
        for i in range(args.repeats + 2):
            for mode, root in (("illinois", baseline_root), ("current", current)):
                multi.kseq_rho = root
                t0 = time.perf_counter()
                call()
                if i >= 2:
                    times[mode].append(time.perf_counter() - t0)
        multi.kseq_rho = current
        a, b = (1e3 * statistics.median(times[m]) for m in ("illinois", "current"))
        print(f"{name:34s} {a:12.2f} {b:11.2f} {b / a:6.2f} {100 * b / args.step_ms:6.1f}%")


if __name__ == "__main__":
    raise SystemExit(main())
