"""coupling: speculative decoding as distribution coupling and optimal transport."""

from .dist import as_distribution, check_pair, tuple_law, tv
from .optimal import optimal_acceptance
from .solve import Coupling, SolverError, solve_coupling, solve_transport

__version__ = "0.1.0"

__all__ = [
    "as_distribution",
    "check_pair",
    "tv",
    "tuple_law",
    "Coupling",
    "SolverError",
    "solve_coupling",
    "solve_transport",
    "optimal_acceptance",
]
