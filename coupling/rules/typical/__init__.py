r"""``typical`` -- **LOSSY**: Medusa's typical acceptance (Cai et al. 2024, "Medusa: Simple LLM
Inference Acceleration Framework with Multiple Decoding Heads", section 2.3.1).

Its output law is not the target's: :meth:`Typical.output_law` gives the exact law and
:meth:`~coupling.rules.base.Rule.distortion` its total-variation distance to ``p``, which
:func:`coupling.check_rule` and ``coupling analyze`` report next to the acceptance it buys.

Rule (one position, ``k`` drafts; an accept-set rule, :mod:`coupling.rules.acceptset`)
------------------------------------------------------------------------------------
Threshold :math:`\tau(p) = \min(\varepsilon,\ \delta\, e^{-H(p)})` with
:math:`H(p) = -\sum_y p(y) \log(p(y) + c)`. A draft ``x`` is acceptable iff
:math:`p(x) > \tau`; the acceptable draft of highest ``p`` is output (Medusa keeps the
candidate of highest likelihood; ties here: lowest id). If none is acceptable the target's own
token is emitted:

* ``fallback="typical"`` (Medusa's code with ``sampling='typical'``,
  ``get_typical_one_token``): a draw from ``p`` restricted to :math:`\{p \ge \tau\}`
  (never empty: at least the most likely token is kept);
* ``fallback="greedy"`` (the paper, and Medusa's original code: the argmax).

Defaults from Medusa's code: ``eps = 0.09`` (``posterior_threshold``), ``delta = 0.3``
(``posterior_alpha``, "recommended to be sqrt(posterior_threshold)"); its entropy adds
``c = 1e-5`` inside the logarithm, which ``entropy_offset=1e-5`` reproduces (default ``0``:
the paper's ``H``). With ``delta < 1`` and ``c = 0`` the most likely token is always
acceptable, since :math:`e^{-H} \le \max p`.

Scope: the single-step reduction. Medusa's candidates come from its heads' top-k and it
keeps the longest accepted prefix over a tree of candidates; here the ``k`` drafts are
drawn from ``q`` (i.i.d. or distinct) and lifted to blocks and trees by the package's walk.
The rule never reads ``q``.

Claims: the exact output law, distortion and acceptance are derived here
(:mod:`coupling.rules.acceptset`) and verified exactly against the enumerated joint; on
high-entropy targets the threshold is of order :math:`\delta / V` and almost every draft is
accepted, which is where the distortion comes from (``benchmarks/bench_lossy_invariant.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..acceptset import AcceptSetRule, choice, non_negative

__all__ = ["threshold", "Typical", "RULE", "EPS", "DELTA"]

EPS = 0.09
DELTA = 0.3
FALLBACKS = ("typical", "greedy")


def threshold(p: np.ndarray, eps: float = EPS, delta: float = DELTA,
              entropy_offset: float = 0.0) -> float:
    r""":math:`\min(\varepsilon, \delta e^{-H})`, :math:`H = -\sum p \log(p + c)`, on a validated
    ``p``."""
    pos = p[p > 0]
    return min(eps, delta * math.exp(float(np.dot(pos, np.log(pos + entropy_offset)))))


class Typical(AcceptSetRule):
    """Medusa's typical acceptance (lossy): accept drafts above an entropy-dependent threshold.

    Parameters
    ----------
    eps, delta : float
        The threshold :math:`\\min(\\varepsilon, \\delta e^{-H})` (Medusa's
        ``posterior_threshold`` and ``posterior_alpha``).
    entropy_offset : float
        ``c`` in :math:`H = -\\sum p \\log(p + c)` (Medusa's code: ``1e-5``).
    fallback : {"typical", "greedy"}
        What is emitted when no draft is acceptable (module doc).
    """

    name = "typical"
    twin = "coupling.rules.typical.torch"
    title = "Medusa typical acceptance (LOSSY)"
    reference = "Cai et al. 2024 (Medusa), section 2.3.1; FasterDecoding/Medusa"
    bound_text = "= its exact acceptance (LOSSY: may exceed the lossless optimum)"

    def __init__(self, eps: float = EPS, delta: float = DELTA, entropy_offset: float = 0.0,
                 fallback: str = "typical"):
        self.eps = non_negative(eps, "eps")
        self.delta = non_negative(delta, "delta")
        self.entropy_offset = non_negative(entropy_offset, "entropy_offset")
        self.fallback = choice(fallback, "fallback", FALLBACKS)

    def threshold(self, p: np.ndarray) -> float:
        return threshold(p, self.eps, self.delta, self.entropy_offset)

    def accept_set(self, p):
        return p > self.threshold(p)

    def fallback_law(self, p):
        f = np.zeros_like(p)
        if self.fallback == "greedy":
            f[int(np.argmax(p))] = 1.0
            return f
        keep = p >= min(self.threshold(p), float(p.max()))
        f[keep] = p[keep]
        return f / f.sum()

    def __repr__(self) -> str:
        return (f"<rule 'typical' (LOSSY): eps={self.eps}, delta={self.delta}, "
                f"entropy_offset={self.entropy_offset}, fallback={self.fallback!r}>")


RULE = Typical()
