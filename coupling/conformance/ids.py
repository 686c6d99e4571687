r"""Token ids from a larger id space: the checker's ``V`` tokens seen as an engine sees them.

Laws over ids ``0 .. V - 1`` hide what a real vocabulary holds: id 0 is often a pad or
unknown token, id 1 or 2 an end of sequence, and code that special-cases them (a sampler that
raises on token 0, a loop that stops on id 1) is never reached or always reached. The checker
therefore places each pair's ``V`` tokens at ids of a vocabulary of ``id_space`` ids
(:func:`live_ids`) and hands the verifier laws over the whole id space, zero outside the
live ids. Every pair holds one special id among its live ones, in turn 0, 1 and the last id
(``id_space - 1``), at a random rank of the law; the other live ids are random.

>>> live_ids(3, 16, pair=0, seed=0).tolist()
[4, 7, 0]
>>> sorted(int(i) for pair in range(3) for i in live_ids(3, 16, pair=pair, seed=0)
...        if i in (0, 1, 15))
[0, 1, 15]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from .errors import DeadToken, VerifierRaised

__all__ = ["live_ids", "Relabelled", "relabel"]


def live_ids(V: int, id_space: int, *, pair: int, seed: int) -> np.ndarray:
    """The ids of pair ``pair``'s ``V`` tokens in a vocabulary of ``id_space`` ids (module
    doc): token ``i`` of the checker's laws is id ``live_ids(...)[i]``."""
    if id_space < V:
        raise ValueError(f"id_space={id_space} cannot hold the {V} tokens of vocab_size; pass "
                         f"id_space >= vocab_size, or id_space=None for ids 0 .. {V - 1}")
    special = (0, 1, id_space - 1)[pair % 3]
    rng = np.random.default_rng([int(seed), 41, int(pair)])
    rest = rng.choice(np.setdiff1d(np.arange(id_space), [special]), size=V - 1, replace=False)
    return rng.permutation(np.r_[special, rest]).astype(np.int64)


class Relabelled:
    """``verify`` under the checker's protocol with token ``i`` shown as id ``ids[i]`` of a
    vocabulary of ``id_space`` ids: drafts and emissions relabelled, laws scattered to the
    whole id space (zero elsewhere), and ``law``, ``step`` and the batched layout kept."""

    def __init__(self, verify, ids: np.ndarray, id_space: int, pair: str = ""):
        self.verify, self.ids, self.id_space = verify, np.asarray(ids, dtype=np.int64), id_space
        self.pair = pair
        self.index = np.full(id_space, -1, dtype=np.int64)
        self.index[self.ids] = np.arange(self.ids.size)
        self.lookup = self.index.tolist()
        for attr in ("batched", "layout", "greedy", "name"):
            if hasattr(verify, attr):
                setattr(self, attr, getattr(verify, attr))
        if not callable(getattr(verify, "step", None)):
            self.batched = False
        if not callable(getattr(verify, "law", None)):
            self.law = None

    def _wide(self, law: np.ndarray) -> np.ndarray:
        out = np.zeros(law.shape[:-1] + (self.id_space,), dtype=law.dtype)
        out[..., self.ids] = law
        return out

    def back(self, emitted) -> np.ndarray:
        """An emission in the checker's token indices; an id outside the live ones is a
        :class:`DeadToken`."""
        arr = np.asarray(emitted)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            return arr                         # the emission check names the malformed shape
        ids = arr.tolist()
        if min(ids, default=0) < 0 or max(ids, default=0) >= self.id_space:
            raise ValueError(f"verify returned token ids outside [0, {self.id_space}) (the "
                             f"id space): {ids}")
        out = [self.lookup[t] for t in ids]
        if min(out, default=0) < 0:
            raise DeadToken(f"emitted {ids}: id {ids[out.index(-1)]} has probability 0 under "
                            f"both models (the live ids are {sorted(self.ids.tolist())})")
        return np.array(out, dtype=np.int64)

    @contextmanager
    def _reported(self, drafts, p, q) -> Iterator[None]:
        """A failure inside (an exception, an id outside the pair) reported with the inputs
        as the verifier saw them."""
        try:
            yield
        except VerifierRaised:
            raise
        except Exception as exc:
            raise VerifierRaised(exc, self.pair, drafts, p, q) from exc

    def __call__(self, drafts, p, q, rng):
        d, wp, wq = self.ids[drafts], self._wide(p), self._wide(q)
        with self._reported(d, wp, wq):
            return self.back(self.verify(d, wp, wq, rng))

    def step(self, drafts, p, q, rng, **extra) -> list:
        d, wp, wq = self.ids[drafts], self._wide(p), self._wide(q)
        with self._reported(d, wp, wq):
            return [self.back(e) for e in self.verify.step(d, wp, wq, rng, **extra)]

    def law(self, drafts, p, q) -> dict:
        d, wp, wq = self.ids[drafts], self._wide(p), self._wide(q)
        out: dict = {}
        with self._reported(d, wp, wq):
            for em, w in dict(self.verify.law(d, wp, wq)).items():
                key = tuple(int(t) for t in self.back(np.array(em, dtype=np.int64)))
                out[key] = out.get(key, 0.0) + w
        return out


def relabel(verify, V: int, id_space: int | None, *, pair: int, seed: int, name: str = ""):
    """``verify`` seen through :func:`live_ids` (itself where ``id_space`` is ``None``);
    ``name``: the pair's, for failure reports."""
    if id_space is None:
        return verify
    return Relabelled(verify, live_ids(V, id_space, pair=pair, seed=seed), id_space, name)
