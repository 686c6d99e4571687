#!/usr/bin/env python
"""Record real (p, q) pairs along engine runs for the block-efficiency notebook.

Two sources (``--model``):

* ``smollm2`` (default): the SmolLM2-135M-Instruct target with the project's trained 1-layer
  draft, chat-formatted demo prompts -> ``coupling/data/traces_smollm2.npz``;
* ``smollm2 --draft feature``: the same target with the feature-level (EAGLE-style) draft of
  :mod:`coupling.llm.feature_draft` (head restricted to 8192 tokens, as it was trained)
  -> ``coupling/data/traces_smollm2_feature.npz``;
* ``gemma``: Gemma 3 270M base (vocabulary 262144, its own tokenizer) with its naive early
  exit after ``--exit-layer`` of 18 layers as the draft (:func:`coupling.llm.models.early_exit`),
  demo prompts as "Question: ...\nAnswer:" -> ``coupling/data/traces_gemma3.npz``.

For each demo prompt, the engine runs token verification with the draft and, at every
drafted position of every step, stores the target law p_i and the draft law q_i restricted to
the union of their top-``m`` tokens (renormalised; the dropped mass is stored too), plus the
drafted token and whether it was accepted. Output: one ``.npz`` under ``coupling/data/``.

Arrays (N = recorded positions, m2 = 2 m + 1 union slots: top-m of p, top-m of q, the drafted
token; padded with index -1 / prob 0):
``idx [N, m2] int32``, ``p [N, m2] float32``, ``q [N, m2] float32``, ``p_mass``/``q_mass [N]``
(mass kept before renormalising), ``step [N]``, ``offset [N]`` (position in the block),
``drafted [N]`` token, ``accepted [N]`` bool, ``alpha [N]`` = sum min(p, q) at full vocabulary.

Usage: ``python scripts/make_traces.py [--model gemma] [--prompts 6] [--tokens 96] [--top-m 32]``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv=None) -> int:
    import torch

    from coupling.llm import demo, drafts, models
    from coupling.llm import engine as E
    from coupling.llm.sampling import SamplingConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--top-m", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--model", choices=("smollm2", "gemma"), default="smollm2")
    ap.add_argument("--draft", choices=("trained", "feature"), default="trained",
                    help="smollm2: token-level trained draft or feature-level draft")
    ap.add_argument("--exit-layer", type=int, default=15, help="gemma: early-exit draft depth")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--draft-logit-scale", type=float, default=None,
                    help="SmolLM2 drafts: override the calibrated logit scale stored with the "
                         "weights (recorded in the settings either way)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default coupling/data/traces_{smollm2,gemma3}.npz")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.model == "gemma":
        args.draft = f"early exit after layer {args.exit_layer}"   # recorded in settings
        target, tok = models.load_gemma()
        drafter = E.ModelDrafter(models.early_exit(target, args.exit_layer))
        out_path = args.out or models.DATA_DIR / "traces_gemma3.npz"

        def encode(text: str) -> list[int]:
            return tok(f"Question: {text}\nAnswer:").input_ids
    else:
        target = models.load_target()
        tok = models.load_tokenizer()
        if args.draft == "feature":
            from coupling.llm.feature_draft import FeatureDrafter, load_feature_draft

            fd = load_feature_draft(target, head_tokens=8192, logit_scale=args.draft_logit_scale)
            args.draft_logit_scale = fd.logit_scale
            drafter = FeatureDrafter(fd)
            out_path = args.out or models.DATA_DIR / "traces_smollm2_feature.npz"
        else:
            d = drafts.load_draft(target, logit_scale=args.draft_logit_scale)
            args.draft_logit_scale = d.coupling_logit_scale
            drafter = E.ModelDrafter(d)
            out_path = args.out or models.DATA_DIR / "traces_smollm2.npz"

        def encode(text: str) -> list[int]:
            return models.chat_prompt(tok, text)
    cfg = SamplingConfig(args.temperature, 0, args.top_p)
    m = args.top_m
    rows: dict[str, list] = {k: [] for k in ("idx", "p", "q", "p_mass", "q_mass", "step",
                                             "offset", "drafted", "accepted", "alpha", "prompt")}
    step_counter = [0]

    def on_step(rec, drafts, q, p, prompt_i):
        c = rec.branch
        for i in range(rec.drafted):
            pi, qi = p[c, i].double(), q[c, i].double()
            # the drafted token always belongs to the stored support, so that every recorded
            # block can be replayed (a rejected draft is often outside both top-m sets)
            x = drafts[c, i : i + 1].to(pi.device)
            union = torch.unique(torch.cat([pi.topk(m).indices, qi.topk(m).indices, x]))
            pad = 2 * m + 1 - union.numel()
            pm, qm = pi[union].sum().item(), qi[union].sum().item()
            rows["idx"].append(np.pad(union.numpy().astype(np.int32), (0, pad), constant_values=-1))
            rows["p"].append(np.pad((pi[union] / max(pm, 1e-300)).float().numpy(), (0, pad)))
            rows["q"].append(np.pad((qi[union] / max(qm, 1e-300)).float().numpy(), (0, pad)))
            rows["p_mass"].append(pm)
            rows["q_mass"].append(qm)
            rows["step"].append(step_counter[0])
            rows["offset"].append(i)
            rows["drafted"].append(int(drafts[c, i]))
            rows["accepted"].append(i < rec.accepted)
            rows["alpha"].append(torch.minimum(pi, qi).sum().item())
            rows["prompt"].append(prompt_i)
        step_counter[0] += 1

    for j, text in enumerate(demo.load_prompts()[: args.prompts]):
        prompt = encode(text)
        E.generate(target, drafter, prompt, max_new_tokens=args.tokens,
                   rule="token", gamma=args.gamma, cfg=cfg, seed=j, eos_token_id=tok.eos_token_id,
                   on_step=lambda rec, d, q, p, j=j: on_step(rec, d, q, p, j))
    out = {k: np.asarray(v) for k, v in rows.items()}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out_path, **out, settings=np.array(str(vars(args))))
    print(f"wrote {out_path}: {len(out['alpha'])} positions, "
          f"{out_path.stat().st_size / 1e6:.2f} MB, mean alpha {out['alpha'].mean():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
