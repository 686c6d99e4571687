"""The failure of a verifier that raises on valid input, with what it was given."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["VerifierRaised", "DeadToken", "guarded"]


class DeadToken(ValueError):
    """The verifier emitted an id that no model of the pair gives mass: a loss of the whole
    mass of that emission (:mod:`coupling.conformance.ids`)."""


class VerifierRaised(RuntimeError):
    """The verifier under test raised on valid input, itself a conformance failure: the
    original exception is the ``__cause__``; ``pair``, ``drafts``, ``p``, ``q`` are what it was
    given (a batch of them for a batched verifier), enough to reproduce it."""

    def __init__(self, exc: BaseException, pair: str, drafts, p, q):
        self.pair, self.drafts, self.p, self.q = pair, drafts, p, q
        laws = "" if np.ndim(drafts) > 2 else (
            f", p {np.round(np.asarray(p, dtype=float), 4).tolist()}, "
            f"q {np.round(np.asarray(q, dtype=float), 4).tolist()}")
        what = ("the verifier emitted a token no model gives mass" if isinstance(exc, DeadToken)
                else f"the verifier raised {type(exc).__name__}")
        super().__init__(f"{what}: {exc} (on pair "
                         f"{pair!r}: drafts {np.asarray(drafts).tolist()}{laws})")


def guarded(fn: Callable, pair: str) -> Callable:
    """``fn(drafts, p, q, ...)`` with any exception it raises turned into :class:`VerifierRaised`
    with its inputs."""
    def call(drafts, p, q, *rest, **kw):
        try:
            return fn(drafts, p, q, *rest, **kw)
        except VerifierRaised:
            raise                               # raised and described further in
        except Exception as exc:
            raise VerifierRaised(exc, pair, drafts, p, q) from exc

    return call
