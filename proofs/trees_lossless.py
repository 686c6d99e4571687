"""Claim: traversal verification and GBV generate the target's law on whole sequences.

Iterating speculative decoding with a draft tree of k paths verified by ``traversal`` (k
i.i.d. paths, or k distinct first tokens) or by ``gbv`` (k i.i.d. paths, ranked by
min(1, p/q) or by p/q) generates a token stream whose law equals the target model's.

Sources: Weng et al., arXiv:2505.12398 (traversal; lossless is the paper's theorem) and
Thomas & Pal, arXiv:2602.16961 (GBV); the papers' full texts were not available, the
algorithms were reconstructed from their abstracts and the GBV authors' reference code
(coupling/rules/traversal, coupling/rules/gbv).

Method: exhaustive check in exact rational arithmetic (fractions.Fraction) of the package's
own code: coupling.stream_law enumerates every ordered draft tree, accepted prefix and emitted
token with exact probabilities, iterating until L = 3 tokens are produced, and is compared
with coupling.target_law:
  * V = 2 and 3; gamma = 1, 2, 3; k = 2, 3 (at most 729 ordered trees per call); random
    rational models of context order 0, 1 (with exact zeros) and 2, weights below 5 so that
    ranking keys tie often;
  * traversal with both draft models, GBV with both ranks.
The check can fail: each deliberately broken variant (coupling.rules.traversal.CONTROLS,
coupling.rules.gbv.CONTROLS) must be found lossy on some case of the same harness (the
reference code's tie rule on the instance p = (1/5, 2/5, 2/5), q = (3/5, 1/5, 1/5), where it
puts 11/25 on token 1 instead of 2/5).
Not a symbolic proof for all V, gamma and k; exact, not floating point, on every case.

Status: verified (exhaustive exact check over the stated cases).
"""

from __future__ import annotations

import sys

import numpy as np
from _block_common import constant_lm
from _tree_common import tree_cases

from coupling import stream_law, target_law
from coupling.rules.gbv import CONTROLS as GBV_CONTROLS
from coupling.rules.gbv import GBV, GBVControl
from coupling.rules.traversal import CONTROLS as TRAVERSAL_CONTROLS
from coupling.rules.traversal import Traversal, TraversalControl

L = 3


def rules_for(replacement_ok: bool):
    rules = [(Traversal(), True)]
    if replacement_ok:
        rules.append((Traversal(), False))
    return rules + [(GBV("capped"), True), (GBV("ratio"), True)]


def main() -> int:
    checked = 0
    lossy = set()
    controls = [TraversalControl(c) for c in TRAVERSAL_CONTROLS] + \
        [GBVControl(c) for c in GBV_CONTROLS]
    for V, gamma, k, t, d, zeros in tree_cases((2, 3), 700, denom=5):
        want = target_law(t, L)
        for rule, rep in rules_for(not zeros and k <= V):
            got = stream_law(rule, t, d, gamma, L, k=k, replacement=rep)
            if not np.array_equal(got, want):
                print(f"LOSSY: {rule!r} replacement={rep} V={V} gamma={gamma} k={k} "
                      f"{t.describe}")
                return 1
            checked += 1
        if gamma == 2:
            for control in controls:
                for rep in (True, False) if k <= V and not zeros else (True,):
                    if control.supports(k, rep) and control.name not in lossy and not \
                            np.array_equal(stream_law(control, t, d, gamma, L, k=k,
                                                      replacement=rep), want):
                        lossy.add(control.name)
    tie_t = constant_lm(["1/5", "2/5", "2/5"])
    tie_d = constant_lm(["3/5", "1/5", "1/5"])
    tie = GBVControl("first_child_ties")
    if not np.array_equal(stream_law(tie, tie_t, tie_d, 1, 2, k=2), target_law(tie_t, 2)):
        lossy.add(tie.name)
    print(f"{checked} (rule, draft model, models, gamma, k) cases: stream law == target law "
          f"exactly (L = {L})")
    missed = [c.name for c in controls if c.name not in lossy]
    if missed:
        print(f"negative controls not detected: {missed}: the harness cannot fail")
        return 1
    print(f"every negative control is detected as lossy: {sorted(lossy)}")
    print("VERIFIED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
