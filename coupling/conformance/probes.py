r"""Deterministic probes at the boundaries of a verifier's randomness.

The statistical and exact checks test a verifier's law. A comparison that is wrong only when a
coin is exactly 0 changes the law on an event of probability 0 for float64 uniforms, so no
test of the law sees it; SGLang #35771 was such a bug: accept iff ``u <= p(x) / q(x)``, which
takes a draft the target gives probability 0 whenever ``u == 0`` (and float32 coins are 0 with
probability ``2**-24`` per draft, often enough in serving).

:func:`probe_boundaries` hands the verifier a generator whose every uniform sits at one
boundary (:data:`VALUES`: 0, the smallest positive double, 1/2, ``1 - 2**-24``, the largest
double below 1), on draft trees that hold the boundary cases: a first draft the target gives
probability 0 (where the draft does not), and the draft's likeliest continuation. Whatever its
uniforms, a lossless verifier never emits a token the target gives probability 0 after the
emitted prefix; each probe checks exactly that, deterministically. A verifier that draws its
randomness other than as numpy uniforms (``integers``, a torch generator seeded from the
check's) cannot be probed this way and is reported so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .loop import Laws, check_emission, tree_laws
from .pairs import model_pairs

__all__ = ["BoundaryGenerator", "ProbeFailure", "ProbeReport", "probe_boundaries", "VALUES",
           "VALUE_NAMES"]

#: the uniforms a probe feeds: 0, the smallest positive double, 1/2, 1 - 2**-24, the largest
#: double below 1
VALUES = (0.0, float(np.nextafter(0.0, 1.0)), 0.5, 1.0 - 2.0**-24, float(np.nextafter(1.0, 0.0)))
#: how the report names them
VALUE_NAMES = ("0", "2^-1074", "1/2", "1 - 2^-24", "1 - 2^-53")


class BoundaryGenerator(np.random.Generator):
    """A numpy ``Generator`` whose every uniform is ``value``: ``random``, ``uniform``,
    ``exponential`` (by inversion) and ``choice`` (inverse CDF over the tokens of positive
    mass). Any other draw is a ``TypeError`` naming what probes take."""

    _TAKES = frozenset({"random", "uniform", "exponential", "choice", "spawn", "value"})

    def __init__(self, value: float):
        super().__init__(np.random.PCG64(0))
        self.value = float(value)

    def __getattribute__(self, name: str):
        if not name.startswith("_") and name not in BoundaryGenerator._TAKES:
            raise TypeError(f"the probe generator gives uniforms only (random, uniform, "
                            f"exponential, choice); the verifier called rng.{name}")
        return super().__getattribute__(name)

    def random(self, size=None, dtype=np.float64, out=None):
        return self.value if size is None else np.full(size, self.value, dtype=dtype)

    def uniform(self, low=0.0, high=1.0, size=None):
        return low + (high - low) * self.random(size)

    def exponential(self, scale=1.0, size=None):
        return -scale * np.log1p(-self.random(size))

    def choice(self, a, size=None, replace=True, p=None):
        n = a if isinstance(a, (int, np.integer)) else len(a)
        w = np.full(n, 1.0 / n) if p is None else np.asarray(p, dtype=np.float64)
        cdf = np.cumsum(w)
        idx = int(min(np.searchsorted(cdf, self.value * cdf[-1], side="right"), n - 1))
        while w[idx] <= 0:                  # never a token of zero mass
            idx -= 1
        pick = idx if isinstance(a, (int, np.integer)) else a[idx]
        return pick if size is None else np.full(size, pick)

    def spawn(self, n: int) -> list[BoundaryGenerator]:
        return [BoundaryGenerator(self.value) for _ in range(n)]


@dataclass(frozen=True)
class ProbeFailure:
    """A probe whose emission holds a token of target probability 0."""

    pair: str
    context: tuple[int, ...]
    value: float
    drafts: list
    emitted: list
    token: int          # the first emitted token the target gives probability 0


@dataclass(frozen=True)
class ProbeReport:
    """``ok``: every probe emitted tokens of positive target probability (``None``: the
    verifier cannot be probed, ``reason`` says why)."""

    ok: bool | None
    probes: int
    failures: tuple[ProbeFailure, ...] = field(default=())
    reason: str = ""

    def __str__(self) -> str:
        if self.ok is None:
            return f"probes: not run ({self.reason})"
        head = (f"probes: {self.probes} boundary probes (every uniform "
                f"{', '.join(VALUE_NAMES)}): "
                + ("PASS" if self.ok else f"FAIL on {len(self.failures)}"))
        lines = [head]
        for f in self.failures[:3]:
            name = VALUE_NAMES[VALUES.index(f.value)]
            lines.append(f"  pair {f.pair!r}, context {f.context}, every uniform {name}: "
                         f"drafts {f.drafts} -> emitted {f.emitted}; token {f.token} has "
                         "target probability 0")
        return "\n".join(lines)


def _trees(draft: Laws, target: Laws, ctx: tuple, k: int, gamma: int) -> list[np.ndarray]:
    """Draft trees after ``ctx`` that hold the boundary cases (module doc)."""
    q, p = draft(ctx), target(ctx)
    firsts = [int(t) for t in np.flatnonzero((q > 0) & (p == 0))]
    firsts += [int(np.argmax(q))]
    out = []
    for x0 in firsts:
        row, branch = [x0], ctx + (x0,)
        for _ in range(gamma - 1):
            t = int(np.argmax(draft(branch)))
            row.append(t)
            branch = branch + (t,)
        others = [t for t in np.flatnonzero(q > 0) if t != x0][:k - 1]
        rows = [row] + [[int(t)] + row[1:] for t in others]
        if len(rows) == k:
            out.append(np.array(rows, dtype=np.int64))
    return out


def probe_boundaries(verify, *, vocab_size: int = 3, gamma: int = 2, k: int = 1,
                     replacement: bool = True, seed: int = 0) -> ProbeReport:
    """Run every boundary probe (module doc) on the check's model pairs, after the empty
    context and after each one-token context."""
    failures, probes = [], 0
    for pair in model_pairs(vocab_size, k=k, replacement=replacement, seed=seed):
        target, draft = Laws(pair.target, "target"), Laws(pair.draft, "draft")
        for ctx in [()] + [(t,) for t in range(vocab_size)]:
            for drafts in _trees(draft, target, ctx, k, gamma):
                p, q = tree_laws(ctx, drafts, target, draft)
                for value in VALUES:
                    probes += 1
                    try:
                        out = verify(drafts, p, q, BoundaryGenerator(value))
                    except TypeError as exc:
                        if "probe generator" in str(exc):
                            return ProbeReport(None, probes, (), str(exc))
                        raise
                    em = check_emission(out, drafts, vocab_size)
                    bad = next((i for i, y in enumerate(em)
                                if target(ctx + tuple(em[:i]))[y] == 0), None)
                    if bad is not None:
                        failures.append(ProbeFailure(pair.name, ctx, value, drafts.tolist(),
                                                     list(em), int(em[bad])))
    return ProbeReport(not failures, probes, tuple(failures))
