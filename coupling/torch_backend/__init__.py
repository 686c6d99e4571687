"""Batched torch twins of the verification rules in :mod:`coupling.rules`.

Every verifier has the signature ::

    rule(drafts, p, q, *, seeds, positions, validate=True, ...) -> Verdict

with ``drafts`` int64 ``[B, k, gamma]``, ``q`` ``[B, k, gamma, V]`` (draft laws along each
branch), ``p`` ``[B, k, gamma+1, V]`` (target laws along each branch, plus the bonus law),
``seeds``/``positions`` int64 ``[B]``. It returns a :class:`Verdict`
``(accepted [B], branch [B], next_token [B], tokens [B, gamma+1])``. All randomness is
counter-based (:mod:`coupling.torch_backend.rng`): acceptance coins and residual draws are
keyed by ``(seed, start position of the call, offset)``, Gumbel noise by ``(seed, absolute
position of the token)``; so a request's decisions do not depend on the batch it is
verified in, nor on the device.

Modules: :mod:`.chain` (``token``, ``block``: one branch), :mod:`.multi` (``kseq``, ``rrs``,
``optimal``, ``gumbel``: draft trees of ``k`` branches), :mod:`.rng` (keyed uniforms and
Gumbel noise), :mod:`._common` (``Verdict``, validation, inverse-CDF sampling).
"""

from ._common import Verdict, check_inputs, sample_rows
from .chain import block, token
from .multi import gumbel, gumbel_draft, kseq, kseq_rho, optimal, rrs
from .rng import gumbel_noise, keyed_uniforms, uniforms

#: rule name -> batched verifier; names match :data:`coupling.rules.RULES` and
#: :data:`coupling.block.RULES`
VERIFIERS = {
    "token": token,
    "block": block,
    "kseq": kseq,
    "rrs": rrs,
    "optimal": optimal,
    "gumbel": gumbel,
}


def verify(rule: str, drafts, p, q, **kwargs) -> Verdict:
    """Dispatch to ``VERIFIERS[rule]`` (ValueError naming the known rules otherwise)."""
    try:
        fn = VERIFIERS[rule]
    except KeyError:
        raise ValueError(f"unknown rule {rule!r}; known rules: {sorted(VERIFIERS)}") from None
    return fn(drafts, p, q, **kwargs)


__all__ = [
    "Verdict",
    "VERIFIERS",
    "verify",
    "token",
    "block",
    "kseq",
    "rrs",
    "optimal",
    "gumbel",
    "gumbel_draft",
    "kseq_rho",
    "uniforms",
    "keyed_uniforms",
    "gumbel_noise",
    "check_inputs",
    "sample_rows",
]
