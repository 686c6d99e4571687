"""Drafts with another tokenizer, exactly: SLEM, SLRS and TLI (Timor et al., arXiv:2502.05202)
against block verification of the same proposals, the optimum of what a verifier sees.

On the toy tokenizers (``coupling.vocab.toy_tokenizers``: target pieces ``a b c ab bc``, draft
pieces ``a b c ca``) and ``--pairs`` random order-1 ``TabularLM`` pairs over each vocabulary
(Dirichlet concentration 0.3, 0.6 or 1), for gamma = 1, 2, 3 target tokens per candidate:
tokens per call after the empty context, exact, for

* SLEM: the re-encoded draft string, verified by exact match (``strict``);
* SLRS: the same candidate, rejection sampling against its exact string-level law (``token``);
* TLI: the draft restricted to the shared pieces, rejection sampling (``token``);
* ``block`` on each proposal, which equals the verifier LP of that proposal (checked here);

and the largest exact total variation of each method's first four generated tokens from the
target's over the first ``--tv-pairs`` pairs (every method is lossless: float rounding only).

    .venv/bin/python benchmarks/bench_vocab.py [--pairs 100] [--tv-pairs 5]
"""

from __future__ import annotations

import argparse

import numpy as np

from coupling import SolverError, TabularLM, target_law
from coupling.vocab import (
    METHODS,
    Intersection,
    Retokenized,
    optimum,
    stream_law,
    tokens_per_call,
    toy_tokenizers,
)

TARGET_TOK, DRAFT_TOK = toy_tokenizers()


def pairs(n: int):
    rng = np.random.default_rng(2)
    for s in range(n):
        c = float(rng.choice([0.3, 0.6, 1.0]))
        yield (TabularLM(TARGET_TOK.size, order=1, seed=2 * s, concentration=c),
               TabularLM(DRAFT_TOK.size, order=1, seed=2 * s + 1, concentration=c))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--tv-pairs", type=int, default=5)
    args = ap.parse_args()
    print(f"{args.pairs} random pairs on the toy tokenizers; tokens per call, mean [5%, 95%]")
    print(f"{'gamma':>5}" + "".join(f"{m:>24}" for m in METHODS) + f"{'block - LP':>12}")
    for gamma in (1, 2, 3):
        got = {m: [] for m in METHODS}
        gap, uncertified = 0.0, 0
        for t, d in pairs(args.pairs):
            props = {cls: cls(d, DRAFT_TOK, TARGET_TOK, gamma) for cls in (Retokenized,
                                                                            Intersection)}
            for m, (cls, rule) in METHODS.items():
                got[m].append(tokens_per_call(rule, t, props[cls]))
                if rule == "block":                 # block verification is the LP's optimum
                    try:
                        gap = max(gap, abs(got[m][-1] - optimum(t, props[cls])))
                    except SolverError:             # too ill-conditioned for a certificate
                        uncertified += 1
        cells = [f"{np.mean(v):.4f} [{np.quantile(v, .05):.3f}, {np.quantile(v, .95):.3f}]"
                 for v in got.values()]
        print(f"{gamma:>5}" + "".join(f"{c:>24}" for c in cells) + f"{gap:>12.1e}"
              + (f"  (LP uncertified on {uncertified} of {2 * args.pairs})" if uncertified
                 else ""))
    print(f"\nlargest exact TV of the first 4 tokens from the target's, gamma = 2, "
          f"{args.tv_pairs} pairs")
    for m, (cls, rule) in METHODS.items():
        worst = max(0.5 * float(np.abs(stream_law(rule, t, cls(d, DRAFT_TOK, TARGET_TOK, 2), 4)
                                       - target_law(t, 4)).sum())
                    for t, d in pairs(args.tv_pairs))
        print(f"  {m:<16} {worst:.1e}")


if __name__ == "__main__":
    main()
