"""``coupling record``: tree traces of a real model pair (:mod:`coupling.sequence.traces`).

At every call the drafter fills a superset tree (``width`` children under every node, down to
``depth``; i.i.d. or without replacement) by tree attention, level by level, and one target
call scores every node by tree attention (:meth:`CachedLM.forward_nodes`); both laws at every
node, processed by the run's sampling settings, are kept on the union of their supports (the
whole law under top-k; under top-p alone the tokens of mass below ``1e-7`` of the peak are
dropped and the rest renormalised). The text goes on as ``rrs`` verifies the superset, so the
recorded contexts follow the target's own law.

    coupling record --prompts 4 --tokens 64 --width 3 --depth 3 --out traces.npz
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

from coupling.sequence.traces import FORMAT_VERSION, TreeTraces
from coupling.tree import Tree

from . import rules_adapter
from .cache import CachedLM, prefill
from .drafters import ModelDrafter
from .sampling import SamplingConfig, probs

__all__ = ["record", "profile", "main", "profile_main", "HELP"]

#: the line ``coupling --help`` shows for this command
HELP = "record tree traces of the demo's model pair for the planner"

#: the smallest probability, relative to a row's largest, that a recorded law keeps
KEEP = 1e-7


def _support(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """The token ids where some row of ``p`` or ``q`` keeps mass (:data:`KEEP`), and the
    drafted ones, ascending."""
    keep = torch.zeros(p.shape[-1], dtype=torch.bool, device=p.device)
    for law in (p, q):
        keep |= ((law >= KEEP * law.amax(-1, keepdim=True)) & (law > 0)).any(0)
    keep[drafts] = True
    return keep.nonzero().squeeze(-1)


def record(target_model, drafter: ModelDrafter, prompts: list[list[int]], *, width: int,
           depth: int, max_new_tokens: int, cfg: SamplingConfig, seed: int = 0,
           children: str = "iid", progress=None) -> TreeTraces:
    """Tree traces of ``target_model`` with ``drafter`` on ``prompts`` (module doc)."""
    superset = Tree.from_branching([width] * depth, children)
    tlm = CachedLM(target_model)
    gen = torch.Generator().manual_seed(seed)
    calls: list[tuple] = []
    for c, prompt in enumerate(prompts):
        prefill(tlm, prompt)
        drafter.reset(prompt)
        seq = list(prompt)
        while len(seq) - len(prompt) < max_new_tokens:
            drafts, q = drafter.propose_tree(seq, superset, cfg, gen)
            feed = tlm.sync(seq)
            logits = tlm.forward_nodes(feed, drafts.tolist(), list(superset.parent))
            p = probs(logits[len(feed) - 1:], cfg)                     # [N + 1, V]
            idx = _support(p, q, drafts)
            pos = torch.searchsorted(idx, drafts)
            keep_p, keep_q = p[:, idx].double(), q[:, idx].double()
            calls.append((idx.numpy().astype(np.int32), pos.numpy().astype(np.int32),
                          (keep_p / keep_p.sum(-1, keepdim=True)).float().numpy(),
                          (keep_q / keep_q.sum(-1, keepdim=True)).float().numpy(), c))
            _, node, emitted = rules_adapter.decide_tree("rrs", superset, drafts, q, p, seed,
                                                         len(seq))
            path = superset.path_to(node)
            tlm.select_path(path)
            drafter.accept_path(path)
            seq.extend(emitted)
            if progress is not None:
                progress(len(calls))
    return _assemble(calls, superset, target_model.config.vocab_size, cfg, width, depth)


def _assemble(calls: list[tuple], superset: Tree, vocab_size: int, cfg: SamplingConfig,
              width: int, depth: int) -> TreeTraces:
    """Pad the calls' supports to one width ``U`` (ids ``-1``, mass 0) and stack them."""
    S, U, N = len(calls), max(c[0].size for c in calls), superset.size
    idx = np.full((S, U), -1, dtype=np.int32)
    p = np.zeros((S, N + 1, U), dtype=np.float32)
    q = np.zeros((S, N + 1, U), dtype=np.float32)
    for s, (ids, _, ps, qs, _) in enumerate(calls):
        idx[s, :ids.size], p[s, :, :ids.size], q[s, :, :ids.size] = ids, ps, qs
    header = {"version": FORMAT_VERSION, "vocab_size": int(vocab_size), "width": width,
              "depth": depth, "children": superset.children, "sampling": cfg.as_dict(),
              "models": {}}
    return TreeTraces(header, idx, np.stack([c[1] for c in calls]), p, q,
                      np.array([c[4] for c in calls], dtype=np.int32))


def profile(target_model, drafter: ModelDrafter, prompt: list[int], *, sizes: list[int],
            repeats: int = 9) -> dict:
    """Milliseconds of a target call scoring ``n`` tree tokens after ``prompt`` (tree
    attention, one row), for each ``n`` of ``sizes``, and of one draft call on the tokens of
    a tree level; medians of ``repeats``, in one process. The JSON ``coupling plan --cost``
    reads."""
    import time

    tlm = CachedLM(target_model)
    prefill(tlm, prompt)

    def median_ms(run) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - t0))
        return float(np.median(times))

    def target_call(n: int) -> None:
        tlm.forward_nodes([prompt[-1]], [prompt[-1]] * (n - 1), [-1] * (n - 1))
        tlm.select_path([])

    target_ms = {n: median_ms(lambda n=n: target_call(n)) for n in sizes}
    drafter.reset(prompt)
    tree = Tree.from_branching([2])
    gen = torch.Generator().manual_seed(0)
    cfg = SamplingConfig()

    def draft_call() -> None:
        drafter.propose_tree(prompt, tree, cfg, gen)
        drafter.accept_path([])

    draft_ms = median_ms(draft_call)
    return {"target_ms": {str(n): ms for n, ms in target_ms.items()}, "draft_ms": draft_ms,
            "step_overhead_ms": _overhead_ms(target_model, drafter, prompt, cfg),
            "threads": torch.get_num_threads(), "prompt_tokens": len(prompt)}


def _overhead_ms(target_model, drafter: ModelDrafter, prompt: list[int],
                 cfg: SamplingConfig) -> float:
    """What a speculative step costs beyond its model calls (the laws, the rule, the caches'
    bookkeeping): a short ``rrs`` run on a two-node tree, its time outside the target's and
    the draft's calls per step."""
    from .engine import generate

    run = generate(target_model, drafter, prompt, max_new_tokens=32, rule="rrs", cfg=cfg,
                   seed=0, tree=Tree.from_branching([2]), record_alpha=False)
    return 1e3 * (run.seconds - run.target_seconds - run.draft_seconds) / len(run.steps)


def _demo_pair(threads: int | None, first: int, count: int):
    """The demo's target (bf16), its trained draft (4096-token head) as a drafter, and its
    chat prompts ``first .. first + count - 1``, tokenised."""
    from . import drafts, models
    from .demo import load_prompts

    if threads:
        torch.set_num_threads(threads)
    target = models.load_target("bfloat16")
    drafter = ModelDrafter(drafts.load_draft(target, head_tokens=4096))
    tok = models.load_tokenizer()
    prompts = [models.chat_prompt(tok, t) for t in load_prompts()[first:first + count]]
    return target, drafter, prompts


def profile_main(argv: list[str] | None = None) -> int:
    """``coupling profile ...``: the call costs of the demo pair on this machine."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(prog="coupling profile", description=profile_main.help)
    ap.add_argument("--sizes", default="1,2,3,5,9,13,17,25,33,41",
                    help="tokens scored per target call (1 = a decoding call)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    target, drafter, prompts = _demo_pair(args.threads, 0, 1)
    prompt = prompts[0]
    sizes = sorted({int(n) for n in args.sizes.split(",")})
    if sizes[0] < 1:
        print("coupling profile: error: --sizes must be >= 1", file=sys.stderr)
        return 2
    profile(target, drafter, prompt, sizes=sizes, repeats=1)            # warm-up
    cost = profile(target, drafter, prompt, sizes=sizes, repeats=args.repeats)
    with open(args.out, "w") as f:
        json.dump(cost, f, indent=2)
    print(json.dumps(cost, indent=2))
    return 0


#: the line ``coupling --help`` shows for ``coupling profile``
PROFILE_HELP = "measure the demo pair's call costs on this machine for the planner"
profile_main.help = PROFILE_HELP


def main(argv: list[str] | None = None) -> int:
    """``coupling record ...``: record the demo pair's tree traces on the demo's prompts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(prog="coupling record", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="demo prompts to record (4)")
    ap.add_argument("--first-prompt", type=int, default=0,
                    help="start at this prompt of the demo's file (0)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (64)")
    ap.add_argument("--width", type=int, default=3, help="children per superset node (3)")
    ap.add_argument("--depth", type=int, default=3, help="superset depth (3)")
    ap.add_argument("--children", choices=("iid", "distinct"), default="iid")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True, help="the .npz file to write")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    target, drafter, prompts = _demo_pair(args.threads, args.first_prompt, args.prompts)
    if not prompts:
        print("coupling record: error: no prompts in that range", file=sys.stderr)
        return 2
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    try:
        traces = record(target, drafter, prompts, width=args.width, depth=args.depth,
                        max_new_tokens=args.tokens, cfg=cfg, seed=args.seed,
                        children=args.children,
                        progress=lambda n: print(f"\r{n} calls", end="", file=sys.stderr))
    except ValueError as exc:       # e.g. distinct children beyond a top-p law's support
        print(f"\ncoupling record: error: {exc}", file=sys.stderr)
        return 2
    from .models import TARGET_NAME

    traces.header["models"] = {"target": TARGET_NAME,
                               "draft": "the demo's 1-layer draft (4096-token head)"}
    traces.save(args.out)
    print(f"\nwrote {args.out}: {traces.calls} calls, superset {args.width} x {args.depth} "
          f"({traces.superset.size} nodes), support {traces.idx.shape[1]}; header "
          f"{json.dumps(traces.header)}", file=sys.stderr)
    return 0
