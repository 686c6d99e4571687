"""The batched torch twins of the rules, behind one dispatcher.

Glossary and shapes (every twin)::

    rule(drafts, p, q, *, seeds, positions, replacement=True, validate=True, ...) -> Verdict

* ``drafts``: int64 ``[B, k, gamma]``, ``k`` draft branches of ``gamma`` tokens per request;
* ``q``: ``[B, k, gamma, V]``, the draft laws along each branch (the laws drafts were sampled
  from);
* ``p``: ``[B, k, gamma + 1, V]``, the target laws along each branch, plus the bonus law;
* ``seeds``, ``positions``: int64 ``[B]``: the request's seed and the absolute position of its
  first drafted token, which key all randomness (:mod:`.rng`), so a request's decisions do
  not depend on the batch it is verified in, nor on the device;
* ``Verdict``: ``(accepted [B], branch [B], next_token [B], tokens [B, gamma + 1])``.

Each twin lives in its rule's folder (``coupling.rules.<name>.torch``) and is found through
:data:`coupling.rules.RULES`; this package holds what they share: :mod:`.common` (``Verdict``,
validation, inverse-CDF sampling), :mod:`.rng` (keyed uniforms and Gumbel noise), :mod:`.tree`
(the batched walk that lifts a single-step rule to draft trees), :mod:`.laws` (float64 rows of
the normalised laws, a chunk at a time: what makes every twin exact for float32 and
half-precision laws).
"""

from __future__ import annotations

from .common import Verdict, check_inputs, check_probs, sample_rows
from .rng import call_uniforms, gumbel_noise, keyed_uniforms, uniforms
from .tree import walk_tree

__all__ = [
    "Verdict",
    "verify",
    "verifiers",
    "check_inputs",
    "check_probs",
    "sample_rows",
    "uniforms",
    "keyed_uniforms",
    "call_uniforms",
    "gumbel_noise",
    "walk_tree",
]


def verifiers() -> tuple[str, ...]:
    """The names of the rules with a batched twin (every rule of the registry)."""
    from ..rules import RULES

    return tuple(RULES)


def verify(rule: str, drafts, p, q, **kwargs) -> Verdict:
    """Verify ``B`` requests' draft trees with ``rule``'s batched twin.

    ``rule`` is a name of :data:`coupling.rules.RULES` (``ValueError`` naming the known rules
    otherwise); ``kwargs`` are the twin's (``seeds``, ``positions``, ``replacement``,
    ``validate``, ...).

    >>> import torch, coupling
    >>> p = torch.tensor([[[[0.5, 0.5], [0.5, 0.5]]]])       # [B=1, k=1, gamma+1=2, V=2]
    >>> q = torch.tensor([[[[0.5, 0.5]]]])                   # [1, 1, gamma=1, V=2]
    >>> v = coupling.verify("block", torch.tensor([[[1]]]), p, q, seeds=0, positions=0)
    >>> int(v.accepted[0])                                   # p == q: always accepted
    1
    """
    from ..rules import get_rule

    return get_rule(rule).torch.verify(drafts, p, q, **kwargs)
