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
from .pairs import add_pair_args, pair_from_args
from .sampling import SamplingConfig, probs

__all__ = ["record", "profile", "main", "profile_main", "HELP"]

#: the line ``coupling --help`` shows for this command
HELP = "record tree traces of a model pair for the planner"

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


#: the trees a step's own work is measured on, per rule (``coupling profile``)
OVERHEAD_TREES = {"token": ("1", "1,1", "1,1,1", "1,1,1,1,1,1"),
                  "rrs": ("2", "3", "3,2", "3,3", "3,3,3"),
                  "traversal": ("2", "3", "3,2", "3,3", "3,3,3")}


def profile(target_model, drafter: ModelDrafter, prompt: list[int], *, sizes: list[int],
            repeats: int = 9, rules: tuple[str, ...] = ("token", "rrs", "traversal"),
            cfg: SamplingConfig | None = None, context: int | None = None,
            batches: tuple[int, ...] = ()) -> dict:
    """Milliseconds, in one process, of: a target call scoring ``n`` tree tokens after
    ``prompt`` (tree attention, one row) and a draft call feeding ``n`` tree tokens, for each
    ``n`` of ``sizes`` (medians of ``repeats``); per rule of ``rules`` a speculative step's
    own work on trees of a few sizes (:data:`OVERHEAD_TREES`, :func:`_overhead_ms`); and plain
    sampling's own work per token (short runs from ``prompt``). ``context``: time the model
    calls after this many tokens (the prompt repeated), where a run spends its steps (a call
    after 130 tokens costs more than after 30). ``batches``: also the target's and the
    draft's calls on that many rows (:func:`batch_ms`), for plans at a batch size. The JSON
    ``coupling plan --cost`` reads (:class:`coupling.planner.Cost`)."""
    import time

    from .engine import autoregressive

    cfg = cfg or SamplingConfig()
    text = list(prompt)
    if context is not None and context > len(prompt):
        prompt = (text * (context // len(text) + 1))[:context]
    tlm = CachedLM(target_model)
    prefill(tlm, prompt)
    drafter.reset(prompt)

    def tree_call(lm: CachedLM, n: int) -> float:
        # the prompt's last token and n - 1 tree entries; sync() rolls the cache back after
        t0 = time.perf_counter()
        lm.forward_nodes(lm.sync(prompt), [prompt[-1]] * (n - 1), [-1] * (n - 1))
        lm.select_path([])
        return 1e3 * (time.perf_counter() - t0)

    # rounds over every size, so that a machine slowing down for a while moves every size
    # alike, and medians over the rounds
    laps: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for name, lm in (("target_ms", tlm), ("draft_ms", drafter.lm)):
            for n in sizes:
                laps.setdefault((name, n), []).append(tree_call(lm, n))
    table = {name: {str(n): float(np.median(laps[name, n])) for n in sizes}
             for name in ("target_ms", "draft_ms")}
    # the runs start from the real text: a repeated prompt drafts unlike real text
    overhead = {rule: {str(Tree.from_spec(t).size): _overhead_ms(
        target_model, drafter, text, cfg, rule, Tree.from_spec(t))
        for t in OVERHEAD_TREES[rule]} for rule in rules}
    run = autoregressive(target_model, text, max_new_tokens=32, cfg=cfg, seed=0)
    plain = 1e3 * (run.seconds - run.target_seconds) / len(run.tokens)
    batched = {f"{name}_batch": batch_ms(model, prompt, batches=batches, sizes=sizes,
                                         repeats=repeats)
               for name, model in (("target_ms", target_model), ("draft_ms", drafter.lm.model))
               } if batches else {}
    return {**table, **batched, "step_overhead_ms": overhead, "plain_overhead_ms": plain,
            "threads": torch.get_num_threads(), "context_tokens": len(prompt)}


def batch_ms(model, prompt: list[int], *, batches: tuple[int, ...], sizes: list[int],
             repeats: int) -> dict:
    """``{B: {n: ms}}``: a call of ``model`` scoring ``n`` new tokens in each of ``B`` rows
    after ``prompt`` (every row the same text; a tree's mask costs what a causal one does),
    medians over rounds of every size, the cache rolled back after each call."""
    import time

    from transformers import DynamicCache

    out = {}
    for B in batches:
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=torch.tensor([prompt] * B), cache=cache, use_cache=True)
            laps: dict[int, list[float]] = {n: [] for n in sizes}
            for _ in range(repeats):
                for n in sizes:
                    ids = torch.tensor([prompt[-n:] if n <= len(prompt) else
                                        (prompt * n)[:n]] * B)
                    t0 = time.perf_counter()
                    model(input_ids=ids, cache=cache, use_cache=True)
                    laps[n].append(1e3 * (time.perf_counter() - t0))
                    cache.crop(-n)
        out[str(B)] = {str(n): float(np.median(v)) for n, v in laps.items()}
    return out


def _overhead_ms(target_model, drafter: ModelDrafter, prompt: list[int],
                 cfg: SamplingConfig, rule: str, tree: Tree) -> float:
    """What a speculative step of ``rule`` on ``tree`` costs beyond its model calls (the
    laws, the rule, the caches' bookkeeping): a 32-token run, its time outside the target's
    and the draft's calls per step."""
    from .engine import generate

    run = generate(target_model, drafter, prompt, max_new_tokens=32, rule=rule, cfg=cfg,
                   seed=0, tree=tree, record_alpha=False)
    return 1e3 * (run.seconds - run.target_seconds - run.draft_seconds) / len(run.steps)


def add_sampling_args(ap) -> None:
    """The demo's sampling settings, which the recorded laws and the profiled step include."""
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)


def profile_main(argv: list[str] | None = None) -> int:
    """``coupling profile ...``: a pair's call costs on this machine."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(prog="coupling profile", description=profile_main.help)
    ap.add_argument("--sizes", default="1,2,3,5,9,13,17,25,33,41",
                    help="tokens scored per target call and fed per draft call (1 = a "
                         "decoding call)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--context", type=int, default=96,
                    help="time the calls after this many tokens of context (96)")
    ap.add_argument("--batches", default="4,16",
                    help="also time the calls on this many rows, for `coupling plan --batch` "
                         "(4,16; empty: none)")
    add_sampling_args(ap)
    add_pair_args(ap)
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        sizes = sorted({int(n) for n in args.sizes.split(",")})
        batches = tuple(sorted({int(b) for b in args.batches.split(",") if b.strip()}))
        if sizes[0] < 1 or (batches and batches[0] < 2):
            raise ValueError("--sizes must be >= 1 and --batches >= 2")
        pair = pair_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"coupling profile: error: {exc}", file=sys.stderr)
        return 2
    run = dict(sizes=sizes, cfg=SamplingConfig(args.temperature, args.top_k, args.top_p),
               context=args.context)
    profile(pair.target, pair.drafter, pair.prompts[0], repeats=1, **run)       # warm-up
    cost = profile(pair.target, pair.drafter, pair.prompts[0], repeats=args.repeats,
                   batches=batches, **run)
    cost["models"] = pair.names
    with open(args.out, "w") as f:
        json.dump(cost, f, indent=2)
    print(json.dumps(cost, indent=2))
    return 0


#: the line ``coupling --help`` shows for ``coupling profile``
PROFILE_HELP = "measure a model pair's call costs on this machine for the planner"
profile_main.help = PROFILE_HELP


def main(argv: list[str] | None = None) -> int:
    """``coupling record ...``: record a pair's tree traces on its prompts."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(prog="coupling record", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts to record (4)")
    ap.add_argument("--first-prompt", type=int, default=0,
                    help="start at this prompt of the file (0)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (64)")
    ap.add_argument("--width", type=int, default=3, help="children per superset node (3)")
    ap.add_argument("--depth", type=int, default=3, help="superset depth (3)")
    ap.add_argument("--children", choices=("iid", "distinct"), default="iid")
    add_sampling_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    add_pair_args(ap)
    ap.add_argument("--out", required=True, help="the .npz file to write")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        pair = pair_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"coupling record: error: {exc}", file=sys.stderr)
        return 2
    prompts = pair.prompts[args.first_prompt:args.first_prompt + args.prompts]
    if not prompts:
        print("coupling record: error: no prompts in that range", file=sys.stderr)
        return 2
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    try:
        traces = record(pair.target, pair.drafter, prompts, width=args.width, depth=args.depth,
                        max_new_tokens=args.tokens, cfg=cfg, seed=args.seed,
                        children=args.children,
                        progress=lambda n: print(f"\r{n} calls", end="", file=sys.stderr))
    except ValueError as exc:       # e.g. distinct children beyond a top-p law's support
        print(f"\ncoupling record: error: {exc}", file=sys.stderr)
        return 2
    traces.header["models"] = pair.names
    traces.save(args.out)
    print(f"\nwrote {args.out}: {traces.calls} calls, superset {args.width} x {args.depth} "
          f"({traces.superset.size} nodes), support {traces.idx.shape[1]}; header "
          f"{json.dumps(traces.header)}", file=sys.stderr)
    return 0
