r"""How a draft model with another tokenizer proposes the target's tokens.

Glossary
--------
``c``
    the generated target tokens so far (the target's context); its text is
    ``target_tok.decode(c)``, and the draft reads the text as ``draft_tok.encode(text)``.
candidate
    the ``gamma`` target tokens a call proposes after ``c``.
:math:`\psi_c`
    the exact law of the candidate, over :math:`V_{target}^{\gamma}`: a call's *draft law* in
    the target's vocabulary. Its conditionals :math:`\psi_c(x_i \mid x_{<i})` are what a
    verifier must divide by.

Two ways to propose (Timor et al., arXiv:2502.05202):

:class:`Retokenized` (the strings of SLEM and SLRS)
    the draft samples its own tokens after the text; the drafted string is re-encoded by the
    target's tokenizer and its first ``gamma`` tokens, once final (no further character can
    change them, :meth:`~coupling.vocab.Tokenizer.final`), are the candidate. Drafting stops
    there. :math:`\psi_c` sums over every draft tokenization that yields a candidate, the
    sum whose size grows exponentially with the string (the paper's cost argument for SLRS);
    here it is enumerated, for small vocabularies.
:class:`Intersection` (TLI)
    the draft's law is restricted to the pieces both vocabularies hold and renormalised; its
    ``gamma`` tokens are target tokens as they are, and :math:`\psi_c` is the product of the
    restricted conditionals.

Either proposal is a law over target tokens, so any lossless single-path rule of
:data:`coupling.RULES` verifies it (:mod:`coupling.vocab.exact`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..lm import LanguageModel, check_length
from .tokenizer import Tokenizer, shared_pieces

__all__ = ["Retokenized", "Intersection", "MAX_DRAFT_PATHS"]

#: Largest number of draft paths an exact candidate law may enumerate.
MAX_DRAFT_PATHS = 200_000


def _draft_law(draft: LanguageModel, ctx: tuple[int, ...], V: int) -> np.ndarray:
    q = np.asarray(draft(ctx), dtype=np.float64)
    if q.shape != (V,) or not np.isfinite(q).all() or (q < 0).any() or q.sum() <= 0:
        raise ValueError(f"draft({ctx}) must be a law over the draft's {V} pieces, got {q}")
    return q / q.sum()


@dataclass(frozen=True)
class _Proposal:
    """The fields, checks and per-context candidate laws both proposals share."""

    draft: LanguageModel
    draft_tok: Tokenizer
    target_tok: Tokenizer
    gamma: int
    _laws: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.draft):
            raise TypeError("draft must be a language model, draft(context) -> law over the "
                            "draft's pieces")
        for name in ("draft_tok", "target_tok"):
            if not isinstance(getattr(self, name), Tokenizer):
                raise TypeError(f"{name} must be a coupling.vocab.Tokenizer, got "
                                f"{type(getattr(self, name)).__name__}")
        check_length(self.gamma)

    def _start(self, c: tuple[int, ...]) -> tuple[int, ...]:
        """The draft's context: the text of ``c`` in the draft's tokens."""
        return self.draft_tok.encode(self.target_tok.decode(c))

    def candidates(self, c: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        """:math:`\\psi_c`: ``{candidate: probability}``, exact (kept per context, as the
        models depend on the context only)."""
        c = tuple(c)
        if c not in self._laws:
            self._laws[c] = self._law(c)
        return self._laws[c]

    def _law(self, c: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        raise NotImplementedError


@dataclass(frozen=True)
class Retokenized(_Proposal):
    """Draft in the draft's tokens, re-encode the string, propose its first ``gamma`` final
    target tokens (module doc)."""

    def _law(self, c: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        """Every draft path that ends the drafting, merged by candidate."""
        start, seen, out = self._start(c), [0], {}

        def rec(drafted: tuple[int, ...], prob: float) -> None:
            cand = self.target_tok.final(self.draft_tok.decode(drafted), self.gamma)
            if cand is not None:
                out[cand] = out.get(cand, 0.0) + prob
                return
            seen[0] += 1
            if seen[0] > MAX_DRAFT_PATHS:
                raise ValueError(f"the candidate law enumerates more than {MAX_DRAFT_PATHS} "
                                 "draft paths; lower gamma or use smaller vocabularies")
            q = _draft_law(self.draft, start + drafted, self.draft_tok.size)
            for t in np.flatnonzero(q > 0):
                rec(drafted + (int(t),), prob * float(q[t]))

        rec((), 1.0)
        return out

    def sample(self, c: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
        """One candidate, drafted as an engine drafts it."""
        start, drafted = self._start(tuple(c)), ()
        while (cand := self.target_tok.final(self.draft_tok.decode(drafted),
                                             self.gamma)) is None:
            q = _draft_law(self.draft, start + drafted, self.draft_tok.size)
            drafted += (int(rng.choice(q.size, p=q)),)
        return cand


@dataclass(frozen=True)
class Intersection(_Proposal):
    """Draft only the pieces both vocabularies hold (TLI; module doc)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self._shared:
            raise ValueError("the two vocabularies share no piece: token-level intersection "
                             "has nothing to draft; use Retokenized")

    @cached_property
    def _shared(self) -> dict[int, int]:
        """``{draft id: target id}`` of the shared pieces."""
        return shared_pieces(self.target_tok, self.draft_tok)

    @cached_property
    def _to_draft(self) -> dict[int, int]:
        """``{target id: draft id}`` of the shared pieces."""
        return {i: j for j, i in self._shared.items()}

    def _restricted(self, start: tuple[int, ...], drafted: tuple[int, ...]) -> np.ndarray:
        """The draft's law after ``drafted`` restricted to the shared pieces, over target ids."""
        q = _draft_law(self.draft, start + drafted, self.draft_tok.size)
        out = np.zeros(self.target_tok.size)
        draft_ids, target_ids = zip(*self._shared.items(), strict=True)
        out[list(target_ids)] = q[list(draft_ids)]
        if out.sum() <= 0:
            raise ValueError(f"the draft gives the shared pieces no mass after "
                             f"{start + drafted}; token-level intersection cannot draft there")
        return out / out.sum()

    def _law(self, c: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        """The product of the restricted conditionals, over every candidate."""
        start, to_draft, out = self._start(c), self._to_draft, {}

        def rec(cand: tuple[int, ...], drafted: tuple[int, ...], prob: float) -> None:
            if len(cand) == self.gamma:
                out[cand] = out.get(cand, 0.0) + prob
                return
            q = self._restricted(start, drafted)
            for t in np.flatnonzero(q > 0):
                rec(cand + (int(t),), drafted + (to_draft[int(t)],), prob * float(q[t]))

        rec((), (), 1.0)
        return out

    def sample(self, c: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
        """One candidate, drafted as an engine drafts it."""
        start, to_draft, cand, drafted = self._start(tuple(c)), self._to_draft, (), ()
        while len(cand) < self.gamma:
            q = self._restricted(start, drafted)
            t = int(rng.choice(q.size, p=q))
            cand, drafted = cand + (t,), drafted + (to_draft[t],)
        return cand
