#!/usr/bin/env python
"""Fit a shipped draft's logit scale to the demo's sampling settings (coupling.llm.calibrate).

For each corpus sequence (the target's answers with its top-K log-probabilities stored at
every generated position, from ``scripts/train_feature_draft.py --corpus-only``), the draft
reads the text as at run time and gives its logits over its head's tokens:

* feature draft, drafted position 1: pairs ``(x_i, f_{i-1})`` with the target's features;
  drafted position 2: pairs ``(x_i, f^_{i-1})`` with its own predicted features (as the
  second drafted token sees them);
* token-level draft: its logits along the text (its drafted positions differ only in context).

For every ``s`` of the grid it computes the exact mean overlap ``sum_x min(p, q_s)`` with
``q_s = probs(s * logits, cfg)`` and ``p`` the target's law under the same ``cfg`` (exact from the
stored top-K since top-k <= K), and picks the ``s`` of highest overlap at drafted position 1,
where the token rule accepts or rejects most blocks. ``--write`` stores it in the weights file
(a float64 tensor ``logit_scale``) and the sidecar; loaders apply it from then on.

The draft is evaluated as the demo runs it (``--head-tokens`` ``drafts.DRAFT_HEAD_TOKENS``,
weight-only int8 unless ``--draft-quant none``), uncalibrated (``logit_scale=1.0``) whatever
the file holds.

Usage: ``python scripts/calibrate_draft.py --draft feature|token [--corpus PATH ...]
[--sequences 80] [--write]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from coupling.llm import calibrate as C
from coupling.llm import drafts, models
from coupling.llm import feature_draft as FD
from coupling.llm.sampling import SamplingConfig

# the feature draft's stage-6 training corpora, E and D (its sidecar has the commands that make
# them; stages 4-5 were calibrated on A-D); the token-level draft never trained on them
DEFAULT_CORPORA = ("feature_corpus_diverse4_s6_n640.pt", "feature_corpus_diverse3_s5_n640.pt")


@torch.no_grad()
def draft_logits(kind: str, draft, seq: dict) -> list[torch.Tensor]:
    """Subset logits [G, S] for the G stored laws of one sequence: [position 1(, position 2)]."""
    ids, P, G = seq["ids"], seq["n_prompt"], seq["idx"].shape[0]
    if kind == "token":
        h = draft.model(input_ids=ids[None]).last_hidden_state[0]          # h_j: law of x_{j+1}
        return [draft.lm_head.subset_logits(h[P - 1:P - 1 + G]).float()]
    feat = seq["feat"][None]
    pairs = ids[None, 1:]                                                 # pair i = (x_i, f_{i-1})
    f1 = draft.features(pairs, feat[:, :-1])                              # f^_i, i = 1 .. N-1
    f_in2 = torch.cat([feat[:, :1], f1[:, :-1]], 1)                       # pair i reads f^_{i-1}
    f2 = draft.features(pairs, f_in2)
    # pair i (array index i - 1) gives the law of x_{i+1}: x_P .. x_{P+G-1} <- indices P-2 ..
    return [draft.head_logits(f[0, P - 2:P - 2 + G]).float() for f in (f1, f2)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", choices=("feature", "token"), required=True)
    ap.add_argument("--weights", type=Path, default=None, help="default: the shipped file")
    ap.add_argument("--corpus", type=Path, action="append", default=[],
                    help=f"repeatable; default these in ~/.cache/coupling: {DEFAULT_CORPORA}")
    ap.add_argument("--sequences", type=int, default=80, help="first N sequences of each corpus")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--head-tokens", type=int, default=drafts.DRAFT_HEAD_TOKENS)
    ap.add_argument("--draft-quant", choices=("int8", "none"), default="int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write", action="store_true", help="store the fitted scale in the weights")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = SamplingConfig(args.temperature, args.top_k, args.top_p)
    t0 = time.perf_counter()

    target = models.load_target("bfloat16")
    weights = args.weights or (FD.FEATURE_DRAFT_WEIGHTS if args.draft == "feature"
                               else drafts.DRAFT_WEIGHTS)
    if args.draft == "feature":
        draft = FD.load_feature_draft(target, weights, head_tokens=args.head_tokens,
                                      int8=args.draft_quant == "int8", logit_scale=1.0)
        tokens = draft.head.tokens
    else:
        draft = drafts.load_draft(target, weights, head_tokens=args.head_tokens,
                                  logit_scale=1.0)
        if args.draft_quant == "int8":
            drafts.quantize_draft_int8(draft)
        tokens = draft.lm_head.tokens
    lookup = C.subset_positions(tokens, target.config.vocab_size)

    corpora = args.corpus or [models.cache_dir() / name for name in DEFAULT_CORPORA]
    logits: list[list[torch.Tensor]] = []
    laws, where = [], []
    for path in corpora:
        if not Path(path).is_file():
            raise FileNotFoundError(f"corpus {path} is missing; make it with "
                                    "scripts/train_feature_draft.py --corpus-only (see the "
                                    "feature draft's sidecar for the exact commands)")
        for seq in torch.load(path)[: args.sequences]:
            if seq["n_prompt"] < 2 or seq["idx"].shape[0] == 0:
                continue
            logits.append(draft_logits(args.draft, draft, seq))
            laws.append(C.target_law_on_topk(seq["logp"].float(), cfg))
            where.append(lookup[seq["idx"].long()])
    p, pos = torch.cat(laws), torch.cat(where)
    tables = [C.overlap_by_scale(torch.cat([lg[i] for lg in logits]), p, pos, cfg)
              for i in range(len(logits[0]))]
    best = C.best_scale(tables[0])
    print(f"{args.draft} draft, {len(laws)} sequences, {p.shape[0]} positions, cfg {cfg}")
    for i, table in enumerate(tables):
        row = " ".join(f"{s:.2f}:{v:.4f}" for s, v in table.items())
        print(f"drafted position {i + 1}: best {C.best_scale(table):.2f} "
              f"({table[C.best_scale(table)]:.4f}; at 1.00: {table[1.0]:.4f})\n  {row}")
    print(f"chosen scale {best:.2f} (best at drafted position 1), "
          f"{(time.perf_counter() - t0) / 60:.1f} min")
    if args.write:
        drafts.store_logit_scale(Path(weights), best, {
            "logit_scale": best,
            "calibration_settings": cfg.as_dict(),
            "calibration_positions": int(p.shape[0]),
            "calibration_overlap": {f"position{i + 1}": {"at_1.00": round(t[1.0], 4),
                                                         f"at_{best:.2f}": round(t[best], 4)}
                                    for i, t in enumerate(tables)},
            "calibration_corpora": [Path(c).name for c in corpora],
            "calibration_command": "python scripts/calibrate_draft.py "
            + " ".join(sys.argv[1:] if argv is None else argv)})
        print(f"wrote logit_scale {best} into {weights} and its sidecar")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
