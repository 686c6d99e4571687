"""What the batched torch twins of the rules share; :func:`coupling.rules.verify` dispatches.

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

Each twin lives in its rule's folder (``coupling.rules.<name>.torch``, named by the rule's
``twin``) and is reached through :func:`coupling.rules.verify`; this package holds what they
share: :mod:`.common` (``Verdict``,
validation, inverse-CDF sampling), :mod:`.rng` (keyed uniforms and Gumbel noise), :mod:`.tree`
(the batched walk that lifts a single-step rule to draft trees), :mod:`.laws` (float64 rows of
the normalised laws, a chunk at a time: what makes every twin exact for float32 and
half-precision laws).
"""

from __future__ import annotations

from .common import Verdict, check_inputs, check_probs, sample_rows
from .rng import call_uniforms, gumbel_argmax, gumbel_noise, keyed_uniforms, uniforms
from .tree import walk_tree

__all__ = [
    "Verdict",
    "check_inputs",
    "check_probs",
    "sample_rows",
    "uniforms",
    "keyed_uniforms",
    "call_uniforms",
    "gumbel_noise",
    "gumbel_argmax",
    "walk_tree",
]
