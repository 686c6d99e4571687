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
emitted prefix; each probe checks exactly that, deterministically.

``off_support=True`` adds drafts outside the protocol, which says drafts come from ``q``, but
inside what engines meet when the drafts came from another law than the one the verifier is
told (processed logits): a first draft the draft gives probability 0 where the target does
not, and one neither model gives mass (an extra token of probability 0 in both laws, where
``p / q`` is ``0 / 0``: ``NaN`` compares false, so a test written "reject iff ``u >= p / q``"
accepts it).

A batched torch verifier (:func:`~coupling.conformance.from_torch`) is probed the same way:
inside its call ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``,
``Tensor.exponential_`` (by inversion) and ``torch.multinomial`` (inverse CDF) return the
boundary value, rounded below 1 in the laws' dtype. A verifier that draws its randomness
otherwise (numpy ``integers``, ``torch.randint`` seeds for keyed hashing, normal draws)
cannot be probed this way and is reported so.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .loop import Laws, check_emission, tree_laws
from .pairs import model_pairs

__all__ = ["BoundaryGenerator", "ProbeFailure", "ProbeReport", "probe_boundaries", "VALUES",
           "VALUE_NAMES", "torch_boundary"]

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


class _NotProbeable(TypeError):
    pass


@contextmanager
def torch_boundary(value: float) -> Iterator[None]:
    """Inside, torch's uniform draws all return ``value`` (module doc); other draws raise a
    ``TypeError`` naming them."""
    import torch

    def coin(dtype) -> float:
        dtype = dtype or torch.get_default_dtype()
        v = torch.tensor(value, dtype=torch.float64).to(dtype)
        return float(v if v < 1 else torch.nextafter(torch.tensor(1.0, dtype=dtype),
                                                       torch.tensor(0.0, dtype=dtype)))

    def rand(*size, generator=None, dtype=None, device=None, **_):
        size = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return torch.full(tuple(size), coin(dtype), dtype=dtype, device=device)

    def multinomial(w, n, replacement=False, *, generator=None, out=None):
        cdf = w.double().cumsum(-1)
        u = torch.full(cdf.shape[:-1] + (1,), coin(w.dtype), dtype=torch.float64) * cdf[..., -1:]
        i = torch.searchsorted(cdf, u, right=True).clamp(max=w.shape[-1] - 1)
        positive = w > 0                   # never a token of zero mass
        last = positive.long().cumsum(-1).argmax(-1, keepdim=True)
        i = torch.where(positive.gather(-1, i), i, last)
        return i.expand(*i.shape[:-1], n) if n > 1 else i

    def refuse(name):
        def draw(*_, **__):
            raise _NotProbeable(f"the probe generator gives uniforms only (torch.rand, "
                                f"uniform_, exponential_, multinomial); the verifier called "
                                f"{name}")
        return draw

    patches = {
        (torch, "rand"): rand,
        (torch, "rand_like"): lambda t, **kw: rand(t.shape, dtype=kw.get("dtype", t.dtype)),
        (torch, "multinomial"): multinomial,
        (torch.Tensor, "uniform_"): lambda t, a=0.0, b=1.0, **_: t.fill_(
            a + (b - a) * coin(t.dtype)),
        (torch.Tensor, "exponential_"): lambda t, lambd=1.0, **_: t.fill_(
            -float(np.log1p(-coin(t.dtype))) / lambd),
        **{(torch, n): refuse(f"torch.{n}") for n in ("randint", "randn", "randperm",
                                                      "randn_like", "randint_like", "normal",
                                                      "bernoulli")},
        **{(torch.Tensor, n): refuse(f"Tensor.{n}") for n in ("random_", "normal_",
                                                              "bernoulli_", "geometric_")},
    }
    saved = {key: getattr(*key) for key in patches}
    try:
        for (owner, name), fn in patches.items():
            setattr(owner, name, fn)
        yield
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


@dataclass(frozen=True)
class ProbeFailure:
    """A probe whose emission holds a token of target probability 0."""

    pair: str
    context: tuple[int, ...]
    value: float
    drafts: list
    emitted: list
    token: int          # the first emitted token the target gives probability 0
    case: str = ""      # the first draft's case: "p = 0 < q", "p > 0 = q", "p = q = 0", ...


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
            lines.append(f"  pair {f.pair!r}, context {f.context}, first draft {f.case}, "
                         f"every uniform {name}: drafts {f.drafts} -> emitted {f.emitted}; "
                         f"token {f.token} has target probability 0")
        return "\n".join(lines)


def _without(lm, V: int):
    """``lm`` over ``V + 1`` tokens, the last one of probability 0 in every law and left out
    of every context."""
    return lambda ctx: np.append(lm(tuple(t for t in ctx if t < V)), 0.0)


def _trees(draft: Laws, target: Laws, ctx: tuple, k: int, gamma: int, off_support: bool
           ) -> list[tuple[str, np.ndarray]]:
    """Draft trees after ``ctx`` that hold the boundary cases (module doc), each with its
    first draft's case."""
    q, p = draft(ctx), target(ctx)
    firsts = [("p = 0 < q", int(t)) for t in np.flatnonzero((q > 0) & (p == 0))]
    if off_support:
        firsts += [("p > 0 = q", int(t)) for t in np.flatnonzero((q == 0) & (p > 0))]
        firsts += [("p = q = 0", q.size - 1)]
    firsts += [("the likeliest draft", int(np.argmax(q)))]
    out = []
    for case, x0 in firsts:
        row, branch = [x0], ctx + (x0,)
        for _ in range(gamma - 1):
            t = int(np.argmax(draft(branch)))
            row.append(t)
            branch = branch + (t,)
        others = [t for t in np.flatnonzero(q > 0) if t != x0][:k - 1]
        rows = [row] + [[int(t)] + row[1:] for t in others]
        if len(rows) == k:
            out.append((case, np.array(rows, dtype=np.int64)))
    return out


def _prober(verify):
    """``run(drafts, p, q, value)``: one call of ``verify`` with every uniform at ``value``."""
    if getattr(verify, "batched", False) and callable(getattr(verify, "step", None)):
        def run(drafts, p, q, value):
            with torch_boundary(value):
                return verify(drafts, p, q, np.random.default_rng(0))
        return run
    return lambda drafts, p, q, value: verify(drafts, p, q, BoundaryGenerator(value))


def probe_boundaries(verify, *, vocab_size: int = 3, gamma: int = 2, k: int = 1,
                     replacement: bool = True, seed: int = 0,
                     off_support: bool = False) -> ProbeReport:
    """Run every boundary probe (module doc) on the check's model pairs, after the empty
    context and after each one-token context; ``off_support`` adds drafts of probability 0
    under the draft. The laws hold ``vocab_size + 1`` tokens, the last of probability 0 under
    both models."""
    failures, probes, run, V = [], 0, _prober(verify), vocab_size
    for pair in model_pairs(vocab_size, k=k, replacement=replacement, seed=seed):
        target = Laws(_without(pair.target, V), "target")
        draft = Laws(_without(pair.draft, V), "draft")
        for ctx in [()] + [(t,) for t in range(vocab_size)]:
            for case, drafts in _trees(draft, target, ctx, k, gamma, off_support):
                p, q = tree_laws(ctx, drafts, target, draft)
                for value in VALUES:
                    probes += 1
                    try:
                        out = run(drafts, p, q, value)
                    except TypeError as exc:
                        if "probe generator" in str(exc):
                            return ProbeReport(None, probes, (), str(exc))
                        raise
                    em = check_emission(out, drafts, V + 1)
                    bad = next((i for i, y in enumerate(em)
                                if target(ctx + tuple(em[:i]))[y] == 0), None)
                    if bad is not None:
                        failures.append(ProbeFailure(pair.name, ctx, value, drafts.tolist(),
                                                     list(em), int(em[bad]), case))
    return ProbeReport(not failures, probes, tuple(failures))
