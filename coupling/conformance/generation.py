r"""Loop mode: check code that drafts by itself, a whole speculative generation loop.

:func:`check_verifier` draws the drafts and hands a verifier one step at a time, so bugs in
how an engine's own drafting randomness meets its verification (a generator reseeded before
every position, one uniform shared by drafting and verification, a bonus token sampled
outside the verifier from the wrong law) stay out of reach. :func:`check_generation` hands
the code under test the two models and a generator instead, and tests the law of the text it
generates:

``generate(target, draft, context, max_new_tokens, rng) -> tokens``: ``target`` and
``draft`` map a context (a tuple of token ids) to **logits** (float64 ``[V]``, log
probabilities, ``-inf`` where a token has probability 0), as a model's forward pass gives
them; ``rng`` is a ``numpy.random.Generator``; the result holds at least ``max_new_tokens``
token ids. The code may draft any number of tokens, in any layout, and call the models as
often as it likes.

``processing``: the engine's own logit processing (temperature, top-k, top-p, min-p: a
function from logits ``[V]`` to logits ``[V]``), which the code under test applies itself;
the reference is then the target's law *after* that processing (a lossless engine samples
the processed target exactly), not the raw one.

The test is the statistical one of :func:`check_verifier` (likelihood ratio of the law of
the first ``length`` tokens against the exact law, read at the same looks with early stop,
Bonferroni over the model pairs).

>>> from coupling.conformance.generation import speculative_generate
>>> report = check_generation(speculative_generate, draws=2000)
>>> report.ok, report.mode
(True, 'loop')
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from .. import target_law
from ..dist import validate_count
from .check import MAX_STRINGS, ConformanceReport, PairResult, build_report, sequential_test
from .pairs import Pair, as_pairs, model_pairs

__all__ = ["check_generation", "GenerationRaised", "speculative_generate", "logits_of",
           "law_of", "processed"]


class GenerationRaised(RuntimeError):
    """The code under test raised on valid input, a conformance failure: ``pair`` and the
    ``loop`` index (the report's seed reproduces it); the original exception is the
    ``__cause__``."""

    def __init__(self, exc: BaseException, pair: str, loop: int):
        self.pair, self.loop = pair, loop
        super().__init__(f"the generation loop raised {type(exc).__name__}: {exc} (pair "
                         f"{pair!r}, loop {loop})")


def logits_of(lm: Callable) -> Callable:
    """A model's law as logits: ``log p``, ``-inf`` where ``p = 0``."""
    def logits(ctx: tuple[int, ...]) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(lm(tuple(ctx)), dtype=np.float64))

    return logits


def law_of(logits: np.ndarray) -> np.ndarray:
    """The law a vector of logits gives (softmax; ``-inf`` entries get probability 0)."""
    z = np.asarray(logits, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def processed(lm: Callable, processing: Callable) -> Callable:
    """The law of ``lm`` after ``processing`` of its logits (softmax of the result)."""
    logits = logits_of(lm)

    def law(ctx: tuple[int, ...]) -> np.ndarray:
        raw = logits(ctx)
        z = np.asarray(processing(raw.copy()), dtype=np.float64)
        if z.shape != raw.shape or np.isnan(z).any() or not np.isfinite(z).any():
            raise ValueError(f"processing must map logits [V] to logits [V] with a finite "
                             f"entry, got {z!r}")
        return law_of(z)

    return law


def speculative_generate(target, draft, context, max_new_tokens, rng, gamma: int = 2):
    """A reference loop written as an engine would: draft ``gamma`` tokens, verify them by
    token verification with fresh uniforms, resample the first rejection from the residual
    or sample the bonus token from the target; repeat."""
    def law(model, ctx):
        return law_of(model(ctx))

    out = list(context)
    while len(out) - len(context) < max_new_tokens:
        drafts, qs = [], []
        for _ in range(gamma):
            q = law(draft, tuple(out + drafts))
            drafts.append(int(rng.choice(q.size, p=q)))
            qs.append(q)
        for i, x in enumerate(drafts):
            p = law(target, tuple(out))
            if rng.random() * qs[i][x] < p[x]:
                out.append(x)
                continue
            r = np.maximum(p - qs[i], 0.0)
            out.append(int(rng.choice(r.size, p=r / r.sum())))
            break
        else:
            p = law(target, tuple(out))
            out.append(int(rng.choice(p.size, p=p)))
    return out[len(context):]


def _strings(generate, pair: Pair, tlogits, dlogits, *, n: int, first: int, length: int,
             V: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (lexicographic among ``V**length``) of the first ``length`` tokens of ``n``
    loops, loops ``first .. first + n - 1``."""
    idx = np.empty(n, dtype=np.int64)
    for i in range(n):
        try:
            out = generate(tlogits, dlogits, (), length, rng)
        except Exception as exc:
            raise GenerationRaised(exc, pair.name, first + i) from exc
        toks = np.asarray(list(out)[:length])
        if toks.shape != (length,) or not np.issubdtype(toks.dtype, np.integer) \
                or toks.min() < 0 or toks.max() >= V:
            raise ValueError(f"generate must return at least max_new_tokens={length} token "
                             f"ids in [0, {V}), got {list(out)!r} (pair {pair.name!r})")
        idx[i] = np.ravel_multi_index(toks, (V,) * length)
    return idx


def check_generation(generate: Callable, *, vocab_size: int = 3, length: int = 4,
                     draws: int | None = None, seed: int = 0, alpha: float = 1e-6,
                     pairs: Sequence[Pair | tuple] | None = None,
                     processing: Callable | None = None) -> ConformanceReport:
    """Check that ``generate`` (module doc) emits exactly the (processed) target's law of the
    first ``length`` tokens, on :func:`model_pairs` or your ``pairs``, ``draws`` loops each
    (20 000 by default); the report is :func:`check_verifier`'s, in mode ``"loop"``."""
    from .check import DRAWS

    if not callable(generate):
        raise TypeError(f"generate must be callable, got {type(generate).__name__}")
    if processing is not None and not callable(processing):
        raise TypeError("processing must be a function from logits [V] to logits [V]")
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must lie in (0, 1) (the false-positive rate), got {alpha!r}")
    length = validate_count(length, "length")
    draws = DRAWS if draws is None else validate_count(draws, "draws")
    pairs = model_pairs(validate_count(vocab_size, "vocab_size"), seed=seed) if pairs is None \
        else as_pairs(pairs)
    V = np.asarray(pairs[0].target(())).size
    if V**length > MAX_STRINGS:
        raise ValueError(f"vocab_size**length = {V}**{length} strings exceed {MAX_STRINGS}; "
                         "lower length or vocab_size")
    m, t0 = len(pairs), time.perf_counter()
    results = []
    for pair, rng in zip(pairs, np.random.default_rng([int(seed), 2]).spawn(m), strict=True):
        reference = pair.target if processing is None else processed(pair.target, processing)
        P = np.asarray(target_law(reference, length), dtype=np.float64)
        results.append(_pair(generate, pair, P, draws=draws, length=length, V=V,
                             level=alpha / m, rng=rng))
        if results[-1].p_value * m < alpha:
            break                               # FAIL whatever the other pairs say
    return build_report(generate, tuple(results), exact=False, alpha=float(alpha), draws=draws,
                   settings=dict(vocab_size=V, gamma=0, k=0, replacement=True, length=length,
                                 seed=int(seed)),
                   seconds=time.perf_counter() - t0, pairs=m, mode="loop")


def _pair(generate, pair: Pair, P: np.ndarray, *, draws: int, length: int, V: int,
          level: float, rng: np.random.Generator) -> PairResult:
    """One pair's :func:`~coupling.conformance.check.sequential_test` on loops of
    ``generate``."""
    tlogits, dlogits = logits_of(pair.target), logits_of(pair.draft)

    def sample(n: int, done: int) -> np.ndarray:
        idx = _strings(generate, pair, tlogits, dlogits, n=n, first=done, length=length, V=V,
                       rng=rng)
        part = np.zeros((2, V**length), dtype=np.int64)
        np.add.at(part, ((done + np.arange(n)) // 256 % 2, idx), 1)   # halves by batch
        return part

    return sequential_test(sample, pair, P, draws=draws, length=length, level=level)
