"""The batched torch twins against a plain-torch token verifier, per call, at serving sizes.

For every rule of ``coupling.RULES`` it times the twin (``RULES[name].torch.verify``,
``validate=False``: the engine's hot path) on draft trees of ``B`` requests, ``gamma`` drafted
tokens and a vocabulary of ``V`` (default ``B`` in 1, 8, 64, ``gamma = 8``, ``V = 49152``,
SmolLM2's vocabulary; ``k = 4`` branches for the multi-draft rules), float32 laws, against a
baseline in the same process:

* **baseline**: the plain token verifier of the shape engines use (:func:`plain_token`):
  gather ``p`` and ``q`` at the drafts, one ``torch.rand`` uniform per position, the
  cumulative product of the accepts, ``max(p - q, 0)`` at the stop (``p`` at the bonus) and
  ``torch.multinomial``. Single-branch rules (``token``, ``block``, ``minhash``) are compared
  with it on the same ``B`` chains; multi-draft rules at ``k`` with it on the ``B k`` chains
  of the tree, every branch verified as an independent chain (the ``k x gamma`` laws the
  rule reads).

Laws (``--laws``): target logits ``z ~ N(0, 3^2)`` per tree node, draft logits ``z + N(0,
1)`` (a correlated but imperfect drafter), softmaxed in float32 (``softmax``), then both
truncated to their 50 largest entries (``topk``) or to their top-0.95 nucleus (``topp``) and
renormalised. Trees are real trees: branches that drafted the same prefix share the laws
after it; drafts are i.i.d. from ``q`` (``gumbel``: branch 0 is the coupling's drafter,
``argmax log q + G(seed, t + i)``, the others i.i.d.). Each configuration draws ``--trees``
trees (default 3) from a generator seeded by the configuration alone, and a rule's own root
draws by the rule alone, so a row is the same whichever rules and configurations run with
it.

The timing table: median ms per call over ``--repeats`` calls, interleaved (baseline, rule,
baseline, rule, ...; call ``r`` of both on tree ``r mod trees``; each of the twin's calls under
other seeds but ``gumbel``'s, whose drafts hold its keys), the ratio of the two medians and
the twin's mean accepted length over the trees. One tree decides little: a rule's cost
depends on how far its walk goes (optimal's exact race runs only where two drafts survive).
The optimal rule's plan cache is emptied before each twin call: the repeats reuse the trees,
where a serving engine brings new laws to every call.
CUDA timings use CUDA events.

The memory table: the peak memory above the live inputs during one call, against one copy of
``p`` in float32. On the CPU the peak is the resident set's high-water mark (``VmHWM`` after
resetting it through ``/proc/self/clear_refs``) minus the resident set before the call, in a
process of its own where glibc maps every allocation above 128 KiB afresh
(``MALLOC_MMAP_THRESHOLD_``), so freed blocks are not reused unseen (that process is not
timed: fresh mappings cost page faults); on CUDA ``torch.cuda.max_memory_allocated`` minus
the allocation before the call.

Run: ``python benchmarks/bench_twins.py`` (1 thread; ``--threads``; about 15 minutes on 2
shared cores), ``--batches 64 --k 4 --laws softmax`` for one configuration, ``--vocab 512``
for a smoke run, ``--device cuda`` (``--target-step`` adds each twin's share of the real
target's verification call), ``--no-memory`` / ``--memory`` for one table, ``--rules
token,block`` for some rules.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable

import torch

from coupling import RULES
from coupling.rules.gumbel.torch import draft as gumbel_draft
from coupling.rules.optimal import clear_plan_cache

VOCAB = 49152
GAMMA = 8
TOP_K, TOP_P = 50, 0.95
MMAP_THRESHOLD = "131072"
SEED = 20240315


# ------------------------------------------------------------------------------ inputs
def _laws(n: int, V: int, kind: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` fresh (target, draft) law pairs ``[n, V]`` float32 (module doc)."""
    z = torch.randn(n, V, generator=gen) * 3.0
    zq = z + torch.randn(n, V, generator=gen)
    return _truncate(torch.softmax(z, -1), kind), _truncate(torch.softmax(zq, -1), kind)


def _truncate(p: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "softmax":
        return p
    if kind == "topk":
        vals, idx = p.topk(TOP_K, -1)
        out = torch.zeros_like(p).scatter_(-1, idx, vals)
    elif kind == "topp":
        vals, idx = p.sort(-1, descending=True)
        keep = (vals.cumsum(-1) - vals) < TOP_P       # the smallest prefix reaching TOP_P
        out = torch.zeros_like(p).scatter_(-1, idx, torch.where(keep, vals, 0.0))
    else:
        raise ValueError(f"unknown laws {kind!r}: softmax, topk or topp")
    return out / out.sum(-1, keepdim=True)


def make_tree(B: int, k: int, g: int, V: int, kind: str, gen: torch.Generator,
              gumbel: bool = False):
    """A draft tree of ``k`` branches per request: ``drafts [B, k, g]``, ``p [B, k, g+1, V]``,
    ``q [B, k, g, V]`` (float32); branches that share a prefix share the laws after it."""
    p = torch.empty(B, k, g + 1, V)
    q = torch.empty(B, k, g, V)
    drafts = torch.zeros(B, k, g, dtype=torch.int64)
    seeds, pos = torch.arange(B), torch.full((B,), 100)
    for i in range(g + 1):
        # the lowest branch that drafted this prefix owns the node's laws
        same = (drafts[:, :, None, :i] == drafts[:, None, :, :i]).all(-1)   # [B, k, k]
        owner = same.to(torch.uint8).argmax(-1).unsqueeze(-1).expand(B, k, V)
        pi, qi = (law.view(B, k, V).gather(1, owner) for law in _laws(B * k, V, kind, gen))
        p[:, :, i] = pi
        if i == g:
            break
        q[:, :, i] = qi
        drafts[:, :, i] = torch.multinomial(qi.reshape(-1, V), 1, generator=gen).view(B, k)
        if gumbel:  # branch 0 is the coupling's drafter
            drafts[:, 0, i] = gumbel_draft(qi[:, 0], seeds, pos + i)
    return drafts, p, q, seeds, pos


# ------------------------------------------------------------------------------ baseline
def plain_token(drafts: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token verification as engines write it, on ``N`` chains: ``drafts [N, g]``,
    ``p [N, g+1, V]``, ``q [N, g, V]`` -> (accepted ``[N]``, next token ``[N]``)."""
    N, g = drafts.shape
    x = drafts.unsqueeze(-1)
    px = p[:, :g].gather(-1, x).squeeze(-1)
    qx = q.gather(-1, x).squeeze(-1)
    u = torch.rand(N, g, generator=gen, device=p.device)
    n = (u * qx < px).to(torch.int64).cumprod(-1).sum(-1)
    rows = torch.arange(N, device=p.device)
    p_n, q_n = p[rows, n], q[rows, n.clamp(max=g - 1)]
    res = torch.where((n < g).unsqueeze(-1), (p_n - q_n).clamp_(min=0.0), p_n)
    return n, torch.multinomial(res, 1, generator=gen).squeeze(-1)


# ------------------------------------------------------------------------------ measuring
class Clock:
    """Wall time of one call: ``perf_counter`` on the CPU, CUDA events on a GPU."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")

    def ms(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+)", f.read()).group(1))


def peak_mib(fn: Callable[[], object], device: str) -> float:
    """Peak memory above what was live before one call of ``fn`` (module doc), MiB."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
    fn()
    return (_status_kib("VmHWM") - before) / 1024


# ------------------------------------------------------------------------------ the table
def configurations(k: int) -> list[tuple[str, int]]:
    """``(rule, branches)``: one branch for the rules that take one draft, ``k`` (or the
    rule's maximum) for the others, and both for ``gumbel``, whose twin walks any tree (its
    single step takes one draft; the walk follows the branches that drafted the target's
    Gumbel-max token)."""
    rows = [(name, 1 if rule.max_drafts == 1 else min(k, rule.max_drafts or k))
            for name, rule in RULES.items()]
    return list(dict.fromkeys(rows + [("gumbel", k)]))          # once at k = 1


def own_roots(rule, name: str, d: torch.Tensor, q: torch.Tensor, tree: int) -> torch.Tensor:
    """``d`` with the first tokens drawn by the rule's own draft law where it has one (its
    twin's ``draft_roots``: greedy, spechub), the rest of each branch as drafted; the draws
    are seeded by the rule and the tree alone."""
    if len(d) == 0 or not hasattr(rule.torch, "draft_roots"):
        return d
    gen = seeded(f"{name}/{tree}")
    u = torch.rand(d.shape[0], d.shape[1], generator=gen, dtype=torch.float64)
    d = d.clone()
    d[:, :, 0] = rule.torch.draft_roots(q[:, 0, 0].cpu(), u).to(d.device)
    return d


def seeded(label: str) -> torch.Generator:
    """A generator seeded by ``SEED`` and ``label``: a configuration's trees do not depend on
    which other configurations or rules run."""
    return torch.Generator().manual_seed(SEED + zlib.crc32(label.encode()))


def cases(B: int, k: int, g: int, V: int, kind: str, device: str, n_trees: int,
          only: set[str] | None = None):
    """``(rule, k, twin call, baseline call, p's float32 MiB)`` for every row of
    :func:`configurations`; call ``r`` of either reads tree ``r % n_trees``."""
    gen = seeded(f"{kind}/{B}/{k}/{g}/{V}")
    trees = [{gumbel: tuple(t.to(device) for t in make_tree(B, k, g, V, kind, gen,
                                                            gumbel=gumbel))
              for gumbel in (False, True)} for _ in range(n_trees)]
    bgen = torch.Generator(device=device).manual_seed(1)
    for name, kk in configurations(k):
        if only and name not in only:
            continue
        rule = RULES[name]
        replacement = True in rule.draft_laws    # distinct drafts where the rule takes only them
        calls = []
        for n, tree in enumerate(trees):
            d, p, q, seeds, pos = tree[name == "gumbel"]
            d, p, q = d[:, :kk], p[:, :kk], q[:, :kk]
            if kk > 1:
                d = own_roots(rule, name, d, q, n)
            calls.append((d, p, q, seeds, pos))

        def twin(rep: int = 0, rule=rule, calls=calls, shift=name != "gumbel",
                 replacement=replacement):
            # each repeat draws other uniforms (gumbel's drafts hold its keys: they stay);
            # in serving every call brings new laws, so no plan built for a tree's laws may
            # serve a later call on the same tree
            clear_plan_cache()
            d, p, q, seeds, pos = calls[rep % len(calls)]
            return rule.torch.verify(d, p, q, seeds=seeds + 7919 * rep * shift, positions=pos,
                                     replacement=replacement, validate=False)

        def base(rep: int = 0, calls=calls):
            d, p, q = calls[rep % len(calls)][:3]
            N = d.shape[0] * d.shape[1]
            return plain_token(d.reshape(N, g), p.reshape(N, g + 1, V), q.reshape(N, g, V),
                               bgen)

        yield name, kk, twin, base, calls[0][1].numel() * 4 / 2**20


class TargetSteps:
    """The real target's verification call of each ``[B, k, gamma]`` tree (``B k`` rows of
    ``gamma + 1`` tokens at context 100, ``ab_common.TargetStep``: SmolLM2-135M, float16 on
    CUDA, bfloat16 on a CPU), median ms, timed once per shape in this process: what
    verification is a fraction of."""

    def __init__(self, device: str, g: int):
        self.device, self.g, self.ms = device, g, {}

    def __call__(self, rows: int) -> float:
        if rows not in self.ms:
            from ab_common import TargetStep

            step = TargetStep(self.device, batch=rows, new=self.g + 1)
            step.time_ms()
            self.ms[rows] = statistics.median(step.time_ms() for _ in range(9))
        return self.ms[rows]


def run(B: int, k: int, g: int, V: int, kind: str, device: str, repeats: int, n_trees: int,
        memory: bool = False, steps: TargetSteps | None = None,
        only: set[str] | None = None) -> None:
    """Print the rows of one (laws, B): timings, or with ``memory`` the peaks."""
    clock = Clock(device)
    for name, kk, twin, base, p_mib in cases(B, k, g, V, kind, device, n_trees, only):
        head = f"| {kind} | {B} | {kk} | {name} |"
        try:
            acc = statistics.mean(float(twin(r).accepted.double().mean())
                                  for r in range(n_trees))
        except ValueError as exc:
            print(f"{head} n/a: {str(exc).split(';')[0][:80]} |", flush=True)
            continue
        base()
        if memory:
            peak_b, peak_t = peak_mib(base, device), peak_mib(twin, device)
            print(f"{head} {p_mib:.1f} | {peak_t:.1f} ({peak_t / p_mib:.2f}) "
                  f"| {peak_b:.1f} ({peak_b / p_mib:.2f}) |", flush=True)
            continue
        tb, tt = [], []
        for rep in range(repeats):  # interleaved: both see the same phase of a shared machine
            tb.append(clock.ms(lambda rep=rep, base=base: base(rep)))
            tt.append(clock.ms(lambda rep=rep, twin=twin: twin(rep)))
        mb, mt = statistics.median(tb), statistics.median(tt)
        share = "" if steps is None else f" {100 * mt / steps(B * kk):.2f}% |"
        print(f"{head} {mt:.2f} | {mb:.2f} | {mt / mb:.2f} | {acc:.2f} |{share}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,64", help="comma-separated B values")
    ap.add_argument("--k", type=int, default=4, help="branches of the multi-draft rules")
    ap.add_argument("--gamma", type=int, default=GAMMA)
    ap.add_argument("--vocab", type=int, default=VOCAB, help="V (default SmolLM2's)")
    ap.add_argument("--laws", default="softmax,topk,topp", help="softmax, topk, topp")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--trees", type=int, default=3, help="draft trees per configuration")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--target-step", action="store_true",
                    help="add each twin's share of the real target's verification call")
    ap.add_argument("--memory", action="store_true",
                    help="only the peak-memory table (on the CPU, run in a process of its own)")
    ap.add_argument("--no-memory", action="store_true", help="only the timing table")
    ap.add_argument("--rules", default="", help="comma-separated rule names (default: all)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = [(kind, int(b)) for kind in args.laws.split(",") for b in args.batches.split(",")]
    shape = (args.k, args.gamma, args.vocab)
    only = set(filter(None, args.rules.split(","))) or None
    if not args.memory:
        print(f"torch {torch.__version__}, device {args.device}, intra-op threads "
              f"{torch.get_num_threads()}, V = {args.vocab}, gamma = {args.gamma}, float32 "
              f"laws, {args.repeats} interleaved repeats over {args.trees} trees\n")
        steps = TargetSteps(args.device, args.gamma) if args.target_step else None
        extra = " % of the target's call |" if steps else ""
        print(f"| laws | B | k | rule | twin ms | baseline ms | ratio | mean accepted |{extra}")
        print("|" + "---|" * (8 + bool(steps)), flush=True)
        for kind, B in configs:
            run(B, *shape, kind, args.device, args.repeats, args.trees, steps=steps, only=only)
        if args.no_memory:
            return 0
        if args.device == "cpu":  # the memory method needs a process of its own (module doc)
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD)
            return subprocess.call([sys.executable, *sys.argv, "--memory"], env=env)
    print("\n| laws | B | k | rule | p MiB (float32) | twin peak MiB (x p) "
          "| baseline peak MiB (x p) |")
    print("|" + "---|" * 7, flush=True)
    for kind, B in configs:
        run(B, *shape, kind, args.device, args.repeats, 1, memory=True, only=only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
