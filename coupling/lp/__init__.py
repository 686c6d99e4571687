"""The LP oracle: the best coupling of drafts and target, exactly, in one layer below the rules.

Everything here answers "what could any lossless verifier achieve" and nothing here knows a
rule; the rules, the sequence analysis and the checkers import it.

* :mod:`.solvers`: the one solver layer (POT, HiGHS, cvxpy): status checks, rebalancing and
  tolerances in one place, :class:`SolverError` for anything uncertified;
* :mod:`.solve`: the membership-cost transport LP (:func:`solve_coupling`,
  :func:`solve_draft_law`, :func:`solve_transport`, :func:`optimal_lossy_acceptance`);
* :mod:`.draftsets`: the law of the *set* of drafted tokens, the form the LPs work on;
* :mod:`.cut`: the optimum in closed form by a min-cut scan at any vocabulary size
  (:func:`optimal_acceptance`, :func:`optimal_cut`);
* :mod:`.plan`: an optimal plan read off the cut (:func:`cut_plan`), what the ``optimal``
  rule samples from.

>>> import coupling.lp as lp
>>> round(lp.optimal_acceptance([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], k=2), 12)
0.84
"""

from .cut import optimal_acceptance, optimal_cut
from .plan import CutPlan, cut_plan
from .solve import (
    COUPLING_SOLVERS,
    Coupling,
    optimal_lossy_acceptance,
    solve_coupling,
    solve_draft_law,
    solve_transport,
)
from .solvers import SOLVERS, TOLERANCES, SolverError

__all__ = [
    "Coupling",
    "SolverError",
    "SOLVERS",
    "COUPLING_SOLVERS",
    "TOLERANCES",
    "solve_coupling",
    "solve_draft_law",
    "solve_transport",
    "optimal_lossy_acceptance",
    "optimal_acceptance",
    "optimal_cut",
    "CutPlan",
    "cut_plan",
]
