"""Single-step verification rules as exact couplings.

``RULES`` maps a name to a :class:`~coupling.rules._base.Rule` with ``supports``,
``acceptance`` (closed form), ``joint`` (exact law of (draft tuple, output)), ``sample``
(one verification step), ``bound`` and ``bound_text``.

========  ===========================================================  =================
name      rule                                                         drafts
========  ===========================================================  =================
token     speculative sampling (Leviathan et al. 2023; Chen et al.)    k = 1
kseq      SpecTr k-sequential selection (Sun et al. 2023)              k >= 1, i.i.d.
rrs       recursive rejection sampling (SpecInfer; Yang; Jeon 2024)    k >= 1, both
optimal   LP-optimal verification (min-cut value; LP-plan sampler)     k >= 1, both
gumbel    shared-Gumbel drafter-invariant coupling (Daliri et al.)     k = 1
minhash   weighted-MinHash dart coupling (Daliri et al. 2024)          k = 1
========  ===========================================================  =================
"""

from __future__ import annotations

from . import gumbel, kseq, optimal, rrs, token
from ._base import Rule

RULES: dict[str, Rule] = {
    "token": token.RULE,
    "kseq": kseq.RULE,
    "rrs": rrs.RULE,
    "optimal": optimal.RULE,
    "gumbel": gumbel.RULE,
    "minhash": gumbel.MINHASH_RULE,
}

__all__ = ["RULES", "Rule", "token", "kseq", "rrs", "optimal", "gumbel"]
