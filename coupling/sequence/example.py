"""Sun et al.'s motivating example (arXiv:2403.10444): the numbers every reader checks first.

Binary vocabulary, context-independent target (1/3, 2/3) and draft (2/3, 1/3), gamma = 2:
token verification accepts 10/9 draft tokens per call, block verification 11/9, which is also
the optimum over every lossless verifier (:func:`coupling.full_information_accepted`), and the
block transport bound (:func:`coupling.optimal_expected_accepted`) is 12/9, which no verifier
attains.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

__all__ = ["motivating_example"]


def motivating_example(exact: bool = True):
    """``(target, draft, gamma)`` of the example; with ``exact=True`` the models return Fraction
    arrays, so :func:`coupling.expected_accepted` gives 10/9 (token) and 11/9 (block) exactly.

    >>> import coupling
    >>> target, draft, gamma = coupling.motivating_example()
    >>> coupling.expected_accepted("token", target, draft, gamma)
    Fraction(10, 9)
    >>> coupling.expected_accepted("block", target, draft, gamma)
    Fraction(11, 9)
    """
    if exact:
        p = np.array([Fraction(1, 3), Fraction(2, 3)], dtype=object)
        q = np.array([Fraction(2, 3), Fraction(1, 3)], dtype=object)
    else:
        p, q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])

    def target(ctx=()):
        return p

    def draft(ctx=()):
        return q

    return target, draft, 2
