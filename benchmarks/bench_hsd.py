"""Hierarchical Speculative Decoding (Zhou et al., arXiv:2601.05724) against block verification,
exactly, over many random pairs.

The claims, in their words: HSD is "a provably lossless verification method" (abstract), and on
one drafted path it accepts more tokens per target call than blockwise verification (its
README's GSM8K table: 6.30 / 6.47 / 6.65 against 6.13 / 6.26 / 6.53). Block verification is
the optimum over every lossless verifier of one drafted path (Sun et al., arXiv:2403.10444), so
the two claims cannot both hold wherever HSD accepts more.

Here, on ``--pairs`` random order-1 ``TabularLM`` pairs (V = 2 or 3, Dirichlet concentration
0.3, 0.6 or 1; the pairs of ``bench_delayed.py``) and gamma = 2, 3, 4, every number is an exact
enumeration over the drafted paths of one call after the empty context:

* tokens per call of HSD as its public code runs it
  (:func:`coupling.conformance.museum.hsd_path_law`) and of block verification;
* one call's distortion: the total variation between the target's first gamma + 1 tokens and
  the call's emission continued by the target. A verifier is lossless iff this is 0 after
  every context (the constraint of the verifier LP, ``coupling.verifier_lp``), so a positive
  value is an exact certificate of loss. Block verification's own distortion is printed as
  the control (float rounding, below 1e-12).

    .venv/bin/python benchmarks/bench_hsd.py [--pairs 1000]
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_delayed import pairs

from coupling import target_law
from coupling.conformance.museum import hsd_path_law
from coupling.lm import path_laws
from coupling.sequence.paths import path_law

GAMMAS = (2, 3, 4)
#: distortions at or below this are float rounding of a lossless call
LOSSLESS = 1e-12


def emission_law(target, draft, gamma: int, law) -> dict[tuple[int, ...], float]:
    """{emitted string: probability} of one call after the empty context, every drafted path
    weighted by its draft probability; ``law(x, P, Q)`` is a rule's ``(tau, next)`` law."""
    out: dict[tuple[int, ...], float] = {}
    for x, prob, P, Q in path_laws(target, draft, gamma):
        tau, nxt = law(x, P, Q)
        for i in np.flatnonzero(tau):
            for y in np.flatnonzero(nxt[i]):
                u = tuple(x[:i].tolist()) + (int(y),)
                out[u] = out.get(u, 0.0) + prob * tau[i] * nxt[i][y]
    return out


def distortion(target, emitted: dict, gamma: int) -> float:
    """TV between the target's first ``gamma + 1`` tokens and ``emitted`` continued by the
    target (module doc)."""
    V = target(()).size
    truth = target_law(target, gamma + 1)
    mixed = np.zeros_like(truth)
    for u, m in emitted.items():
        # every string extending u, in lexicographic order, with the target's continuation
        rest = gamma + 1 - len(u)
        cont = target_law(target, rest, context=u) if rest else np.ones(1)
        start = int(np.ravel_multi_index(u, (V,) * len(u))) * V**rest
        mixed[start:start + V**rest] += m * cont
    return 0.5 * float(np.abs(mixed - truth).sum())


def tokens(emitted: dict) -> float:
    return float(sum(len(u) * m for u, m in emitted.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1000)
    args = ap.parse_args()

    def block(x, P, Q):
        return path_law("block", x, P, Q)

    print(f"{args.pairs} random pairs, one call after the empty context, exact")
    print(f"{'gamma':>5} {'HSD tok/call':>13} {'block':>8} {'HSD > block':>12} "
          f"{'mean gain':>10} {'lossy':>7} {'TV median':>10} {'TV max':>8} "
          f"{'lossy where ahead':>18} {'block TV max':>13}")
    for gamma in GAMMAS:
        h, b, tv, control = [], [], [], 0.0
        for t, d in pairs(args.pairs):
            em, eb = emission_law(t, d, gamma, hsd_path_law), emission_law(t, d, gamma, block)
            h.append(tokens(em))
            b.append(tokens(eb))
            tv.append(distortion(t, em, gamma))
            control = max(control, distortion(t, eb, gamma))
        h, b, tv = np.array(h), np.array(b), np.array(tv)
        ahead, lossy = h > b + 1e-12, tv > LOSSLESS
        print(f"{gamma:>5} {h.mean():>13.4f} {b.mean():>8.4f} {100 * ahead.mean():>11.1f}% "
              f"{(h - b)[ahead].mean() if ahead.any() else 0.0:>+10.4f} "
              f"{100 * lossy.mean():>6.1f}% {np.median(tv):>10.2e} {tv.max():>8.4f} "
              f"{100 * (lossy[ahead].mean() if ahead.any() else 1.0):>17.1f}% {control:>13.1e}")


if __name__ == "__main__":
    main()
