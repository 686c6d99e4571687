#!/usr/bin/env python
"""K-SEQ's rho root (``torch_backend.kseq_rho``) against the roots it replaced, in the same
process, with the largest difference of the roots.

Modes: ``illinois`` (kept below as it was up to stop 13: regula falsi on the bracket until
it is 1e-15 wide, one pass over V per evaluation, no sort); ``stop14`` (the baseline, kept
below as it was at stop 14: Illinois only while many breakpoints p/q lie in the bracket,
then the few left ordered and the smooth segment solved exactly; a few CPU rows of at most
4096 tokens took the numpy reference, sorting every ratio); ``torch`` (the torch path,
forced with ``SMALL_ROWS = 0``: a histogram of the ratios narrows the bracket to a few bins,
then the same exact segment); ``default`` (what the engine runs: on a CPU, ``B <=
SMALL_ROWS`` rows take the numpy reference row by row, which bins the same way). Laws: the
demo's sampling transforms (T = 0.7, top-k 50, top-p 0.95) of N(0, 3^2) target logits and
target + N(0, 1) draft logits at V = 49152 (``top-k``), or the plain softmax at T = 1 where
every token has mass and thousands of ratios p/q fall inside (1, m) (``dense``); ``U`` = the
support the engine hands the rule (the union support of the batch), or the full vocabulary.

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


def stop14_rho(p, q, m, iters: int = 100):
    """The root as computed at stop 14 (the baseline of this change): on a CPU, up to 8 rows
    of at most 4096 tokens took the numpy reference sorting every ratio inside (1, m);
    otherwise the Illinois iteration over V narrowed the bracket while more than 64 ratios
    lay inside it, then a ``topk`` and the exact segment, as now."""
    import torch
    from coupling.torch_backend.multi import _TORCH_OPS, _direct_margin, _geometric_c

    from coupling.rules import kseq as ref_kseq

    B, V = p.shape
    if p.device.type == "cpu" and B <= 8 and V <= 4096:  # the reference, sorting every ratio
        P, Q = p.detach().numpy(), q.detach().numpy()
        sort_at_most, ref_kseq.SORT_AT_MOST = ref_kseq.SORT_AT_MOST, V
        try:
            return torch.tensor([ref_kseq._optimal_rho(P[b], Q[b], int(mb))
                                 for b, mb in enumerate(m.tolist())], dtype=torch.float64)
        finally:
            ref_kseq.SORT_AT_MOST = sort_at_most
    rho = torch.ones(B, dtype=torch.float64, device=p.device)
    b1 = torch.minimum(p, q).sum(-1)  # beta(1)
    need = (m > 1) & (b1 > 0)  # else token / nothing to accept
    if not bool(need.any()):
        return rho
    kmax = int(m[need].max())
    mf_all = m.to(torch.float64)
    dp_all, dq_all = 1.0 - p.sum(-1), 1.0 - q.sum(-1)
    f1 = 1.0 - _geometric_c(b1, mf_all, kmax)  # _cheap_h at 1
    unsure = f1.abs() <= ref_kseq.h_tolerance(kmax)
    if bool((need & unsure).any()):  # a flat margin at 1: the exact sign
        f1 = torch.where(unsure, _direct_margin(p, q, dp_all, dq_all, mf_all, kmax, rho), f1)
    need = need & (f1 < 0)  # rho = 1 invalid
    if not bool(need.any()):
        return rho
    idx = torch.nonzero(need).squeeze(1)
    P, Q, mf, dp, dq = p[idx], q[idx], mf_all[idx], dp_all[idx], dq_all[idx]
    mm = kmax if bool((mf == kmax).all()) else mf  # a Python int: the margin's fast path
    mcol = mm if isinstance(mm, int) else mm.unsqueeze(1)

    def f_of(x: torch.Tensor) -> torch.Tensor:
        return _direct_margin(P, Q, dp, dq, mm, kmax, x)

    # 1. Illinois on [1, m] while many breakpoints p/q lie inside the bracket, on the cheap
    # h = rho - c(beta) (three passes over V); a row whose |h| falls to its rounding error
    # stops there (its sign is no longer certain; stage 2 is exact on whatever it kept)
    R = P / Q  # q = 0 < p: +inf, above every rho; p = q = 0: NaN, in no comparison (no mass)
    tol = ref_kseq.h_tolerance(kmax)
    lo, hi = torch.ones_like(mf), mf.clone()
    flo, fhi = f1[idx], torch.zeros_like(mf)  # h(m) >= 0; 0 is a safe secant end
    side = torch.zeros_like(mf)
    active = torch.ones_like(need[idx])
    inside = None
    for it in range(iters):
        if it % 2 == 0:  # the count costs three passes: every second step
            inside = (R > lo[:, None]) & (R < hi[:, None])
            if not bool((active & (inside.sum(-1) > 64)).any()):
                break
        x = hi - fhi * (hi - lo) / torch.where(fhi > flo, fhi - flo, 1.0)
        x = torch.where((x > lo) & (x < hi), x, 0.5 * (lo + hi))
        hx = x - _geometric_c(torch.minimum(Q, P / x.unsqueeze(1)).sum(-1), mf, kmax)
        active = active & (hx.abs() > tol)
        good, bad = active & (hx >= 0), active & (hx < 0)
        # the end that stayed put twice in a row has its value halved (Illinois step)
        flo = torch.where(good & (side > 0), 0.5 * flo, flo)
        fhi = torch.where(bad & (side < 0), 0.5 * fhi, fhi)
        hi, fhi = torch.where(good, x, hi), torch.where(good, hx, fhi)
        lo, flo = torch.where(bad, x, lo), torch.where(bad, hx, flo)
        side = torch.where(good, 1.0, torch.where(bad, -1.0, side))
        inside = None
    # 2. the n breakpoints left, in order, on top of the masses below lo and above hi
    if inside is None:  # the loop ran out: count for the final bracket
        inside = (R > lo[:, None]) & (R < hi[:, None])
    n = int(inside.sum(-1).max())
    zero = torch.zeros((), dtype=P.dtype, device=P.device)
    low, high = R <= lo[:, None], R >= hi[:, None]
    base_lt = ((P * low).sum(-1, keepdim=True), (Q * low).sum(-1, keepdim=True))
    base_ge = ((P * high).sum(-1, keepdim=True), (Q * high).sum(-1, keepdim=True))
    n = max(n, 1)  # at least one (+inf) column: amin needs it
    t, order = torch.where(inside, R, torch.inf).topk(n, -1, largest=False, sorted=True)
    real = torch.isfinite(t)  # rows with fewer than n breakpoints left are padded with +inf
    ps = torch.where(real, P.gather(1, order), zero)
    qs = torch.where(real, Q.gather(1, order), zero)
    pad = torch.zeros_like(lo)[:, None]
    p_lt, q_lt = (b + torch.cat([pad, x.cumsum(-1)], 1)
                  for b, x in zip(base_lt, (ps, qs), strict=True))      # [A, n+1]: first j
    p_ge, q_ge = (b + torch.cat([x.flip(-1).cumsum(-1).flip(-1), pad], 1)
                  for b, x in zip(base_ge, (ps, qs), strict=True))
    f_t, _ = ref_kseq.segment_margin(torch.where(real, t, 1.0), (p_lt[:, :n], q_lt[:, :n]),
                                     (p_ge[:, :n], q_ge[:, :n]), (dp[:, None], dq[:, None]),
                                     mcol, kmax, _TORCH_OPS)
    hi = torch.where(real & (f_t >= 0), t, hi[:, None]).amin(-1)
    lo = torch.where(real & (t < hi[:, None]), t, lo[:, None]).amax(-1)
    s = (t <= lo[:, None]).sum(-1, keepdim=True)       # breakpoints left at or below lo
    below = (p_lt.gather(1, s).squeeze(1), q_lt.gather(1, s).squeeze(1))
    above = (p_ge.gather(1, s).squeeze(1), q_ge.gather(1, s).squeeze(1))
    # 3. the smooth root on the segment
    x = ref_kseq.segment_root(lo, hi, below, above, (dp, dq), mm, kmax, _TORCH_OPS)
    # 4. the root may sit an ulp below the true root: step up until the margin is >= 0
    # (after the first pass, only over the rows still short)
    step = torch.finfo(torch.float64).eps * x
    rows = torch.nonzero((x < mf) & (f_of(x) < 0)).squeeze(1)
    while rows.numel():
        x[rows] = torch.minimum(mf[rows], x[rows] + step[rows])
        step[rows] *= 2.0
        xr = x[rows]
        mr = mm if isinstance(mm, int) else mm[rows]
        f = _direct_margin(P[rows], Q[rows], dp[rows], dq[rows], mr, kmax, xr)
        rows = rows[(xr < mf[rows]) & (f < 0)]
    return rho.index_put((idx,), x)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coupling.llm.sampling import SamplingConfig, probs
    from coupling.torch_backend import kseq_rho, multi

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--step-ms", type=float, default=None,
                    help="a fixed target step in ms (default: the real target's one-token "
                    "step, timed in this process before the tables, median of 9)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.step_ms is None:
        from ab_common import TargetStep

        timer = TargetStep()
        args.step_ms = statistics.median(timer.time_ms() for _ in range(9))
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

    modes = {"illinois": illinois_rho, "stop14": stop14_rho, "torch": torch_path,
             "default": kseq_rho}
    print(f"{args.threads} thread(s), medians of {args.repeats} calls (ms); ratios against "
          f"stop14; % of a {args.step_ms:g} ms target step for the default")
    dense_cfg = SamplingConfig(1.0, 0, 1.0)
    print(f"{'law':6s} {'B':>3s} {'U':>6s} {'m':>2s} {'illinois':>9s} {'stop14':>8s} "
          f"{'torch':>8s} {'default':>8s} {'torch/s14':>9s} {'default/s14':>11s} "
          f"{'% step':>7s} {'max |drho|/rho':>14s}")
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
        d = max(float(((roots[k] - roots["stop14"]).abs() / roots["stop14"]).max())
                for k in ("torch", "default"))
        print(f"{law:6s} {B:3d} {p.shape[1]:6d} {m:2d} {t['illinois']:9.2f} {t['stop14']:8.2f} "
              f"{t['torch']:8.2f} {t['default']:8.2f} {t['torch'] / t['stop14']:9.2f} "
              f"{t['default'] / t['stop14']:11.2f} {100 * t['default'] / args.step_ms:6.1f}% "
              f"{d:14.1e}")
    kernel_ab(args, stop14_rho)
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
    print(f"{'call':34s} {'stop14, ms':>12s} {'current, ms':>11s} {'ratio':>6s} "
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
        times = {"stop14": [], "current": []}
        for i in range(args.repeats + 2):
            for mode, root in (("stop14", baseline_root), ("current", current)):
                multi.kseq_rho = root
                t0 = time.perf_counter()
                call()
                if i >= 2:
                    times[mode].append(time.perf_counter() - t0)
        multi.kseq_rho = current
        a, b = (1e3 * statistics.median(times[m]) for m in ("stop14", "current"))
        print(f"{name:34s} {a:12.2f} {b:11.2f} {b / a:6.2f} {100 * b / args.step_ms:6.1f}%")


if __name__ == "__main__":
    raise SystemExit(main())
