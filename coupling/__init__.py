"""coupling: speculative decoding as distribution coupling and optimal transport.

The names a user needs are importable from here (the submodules hold the rest):

* distributions: :func:`as_distribution`, :func:`check_pair`, :func:`tv`, :func:`tuple_law`;
* the LP oracle: :func:`solve_coupling`, :func:`solve_draft_law`, :func:`solve_transport`,
  :class:`Coupling`, :class:`SolverError`, :func:`optimal_acceptance`,
  :func:`optimal_lossy_acceptance` (the oracle of a lossy rule, at its distortion);
* the rules: :data:`RULES` (name -> rule), :data:`NEGATIVE_CONTROLS`, :func:`check_rule`,
  :func:`check_sampler`;
* sequences: :class:`TabularLM`, :class:`TraceLM`, :func:`block_efficiency`,
  :func:`expected_accepted`, :func:`accepted_length_law`, :func:`target_law`,
  :func:`stream_law`, :func:`sample_stream`, :func:`optimal_block_efficiency`,
  :func:`optimal_expected_accepted`, :func:`full_information_accepted`,
  :func:`verifier_lp`, :func:`motivating_example`;
* draft trees: :class:`Tree` (a static topology of any shape: per-depth branching, Medusa and
  EAGLE's path lists, ``k`` chains; ``tree=`` in the exact analysis),
  :func:`tree_verifier_lp`, :func:`full_information_tree_accepted` (the LP over every lossless
  verifier of the tree, the optimum ``traversal`` and ``gbv`` are measured against),
  :func:`path_selection_lp`;
* planning: :func:`plan` (the rule and draft tree to run, from recorded traces and call
  costs; :mod:`coupling.planner`);
* the batched torch twins: :func:`verify` (a rule's twin, and torch, load on first use).
"""

from .check import check_rule, check_sampler
from .dist import as_distribution, check_pair, tuple_law, tv
from .lp.solve import (
    Coupling,
    optimal_lossy_acceptance,
    solve_coupling,
    solve_draft_law,
    solve_transport,
)
from .lp.solvers import SolverError
from .planner import plan
from .rules import NEGATIVE_CONTROLS, RULES, Rule, verify
from .rules.optimal import optimal_acceptance
from .sequence import (
    LanguageModel,
    TabularLM,
    TraceLM,
    accepted_length_law,
    block_efficiency,
    expected_accepted,
    full_information_accepted,
    full_information_tree_accepted,
    motivating_example,
    optimal_block_efficiency,
    optimal_expected_accepted,
    path_selection_lp,
    sample_stream,
    stream_law,
    target_law,
    tree_verifier_lp,
    verifier_lp,
)
from .tree import Tree

__version__ = "0.1.0"

__all__ = [
    "as_distribution",
    "check_pair",
    "tv",
    "tuple_law",
    "Coupling",
    "SolverError",
    "solve_coupling",
    "solve_draft_law",
    "solve_transport",
    "optimal_acceptance",
    "optimal_lossy_acceptance",
    "RULES",
    "NEGATIVE_CONTROLS",
    "Rule",
    "check_rule",
    "check_sampler",
    "LanguageModel",
    "TabularLM",
    "TraceLM",
    "block_efficiency",
    "expected_accepted",
    "accepted_length_law",
    "target_law",
    "stream_law",
    "sample_stream",
    "optimal_block_efficiency",
    "optimal_expected_accepted",
    "full_information_accepted",
    "verifier_lp",
    "tree_verifier_lp",
    "full_information_tree_accepted",
    "path_selection_lp",
    "Tree",
    "motivating_example",
    "verify",
    "plan",
]

