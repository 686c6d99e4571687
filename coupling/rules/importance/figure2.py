r"""Figure 2 of Khisti et al. (arXiv 2410.18234), computed exactly.

Setting (the figure's caption): alphabet {1, 2, 3}, ``K = 2`` identical (i.i.d.) drafts, the
uniform law :math:`(1/3, 1/3, 1/3)` and a varied law :math:`(q_1, q_2, s - q_2)` with
:math:`q_1 = 1/3, s = 2/3` (left panel) or :math:`q_1 = 1/6, s = 5/6` (right panel), ``q2`` on
the x-axis from 0 to ``s``. Curves: the optimal acceptance (their Theorem 3; here the min cut
:func:`coupling.optimal_acceptance`), importance-sampling selection, SpecTr (``kseq``) and
SpecInfer (``rrs``), all exact.

Which law is the target: this package reads the uniform law as the target ``p`` and the varied
law as the draft ``q`` (``target="uniform"``, the default). The paper's own notation may be the
reverse (its ``q`` the target: reviews of the paper call ``q2`` the target's parameter; its
body was not available here), which ``target="varied"`` computes. The readings differ visibly
(derived here from the min cut: two i.i.d. drafts accept with probability 1 iff every token
set ``H`` has :math:`p(H) \le 1 - (1 - q(H))^2`):

* uniform target: the optimum is 1 iff :math:`1 - \sqrt{2/3} \le q_i \le 1/\sqrt 3` for every
  token, i.e. for ``q2`` in :math:`[1 - \sqrt{2/3}, \sqrt{2/3} - 1/3] = [0.1835, 0.4832]` on the
  left panel and never on the right one (:math:`q_1 = 1/6 < 1 - \sqrt{2/3}`);
* uniform draft: the optimum is 1 iff every target entry lies in :math:`[1/9, 5/9]`, i.e. for
  ``q2`` in [1/9, 5/9] (left) and [5/18, 5/9] (right).
"""

from __future__ import annotations

import numpy as np

from ..kseq import RULE as KSEQ
from ..optimal import optimal_acceptance
from ..rrs import RULE as RRS
from . import RULE as IS_WEIGHTED
from . import ImportanceSampling

__all__ = ["PANELS", "TARGETS", "CURVES", "panel_laws", "figure2_point", "figure2_curves"]

#: panel -> (q1, s): the varied law is (q1, q2, s - q2), q2 in [0, s]
PANELS = {"left": (1 / 3, 2 / 3), "right": (1 / 6, 5 / 6)}
#: which law is the target: the uniform one (this package's reading) or the varied one
TARGETS = ("uniform", "varied")
#: the curves, in plotting order
CURVES = ("optimal", "is optimal selection", "is weighted, selected", "is weighted", "kseq",
          "rrs")

_IS_OPTIMAL = ImportanceSampling("optimal")


def panel_laws(panel: str, q2: float, *, target: str = "uniform") -> tuple[np.ndarray,
                                                                           np.ndarray]:
    """``(p, q)`` of one point of a panel: target and draft."""
    if panel not in PANELS:
        raise ValueError(f"panel must be one of {tuple(PANELS)}, got {panel!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    q1, s = PANELS[panel]
    if not 0.0 <= q2 <= s:
        raise ValueError(f"q2 must lie in [0, {s:.6g}] on the {panel} panel, got {q2!r}")
    varied = np.array([q1, q2, max(s - q2, 0.0)])
    varied /= varied.sum()
    uniform = np.full(3, 1 / 3)
    return (uniform, varied) if target == "uniform" else (varied, uniform)


def figure2_point(panel: str, q2: float, *, target: str = "uniform") -> dict[str, float]:
    """Every curve at one ``q2``: exact acceptances of two i.i.d. drafts. ``"is weighted,
    selected"`` is P(the selected draft is accepted), the paper's quantity; ``"is weighted"``
    P(the output is one of the drafts), the package's."""
    p, q = panel_laws(panel, q2, target=target)
    return {
        "optimal": optimal_acceptance(p, q, 2),
        "is optimal selection": _IS_OPTIMAL.selected_acceptance(p, q, 2),
        "is weighted, selected": IS_WEIGHTED.selected_acceptance(p, q, 2),
        "is weighted": IS_WEIGHTED.acceptance(p, q, 2),
        "kseq": KSEQ.acceptance(p, q, 2),
        "rrs": RRS.acceptance(p, q, 2),
    }


def figure2_curves(panel: str, q2s, *, target: str = "uniform") -> dict[str, np.ndarray]:
    """:func:`figure2_point` on a grid of ``q2``: curve name -> ``[len(q2s)]``."""
    points = [figure2_point(panel, float(x), target=target) for x in q2s]
    return {c: np.array([pt[c] for pt in points]) for c in CURVES}
