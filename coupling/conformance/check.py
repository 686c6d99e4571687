"""``check_verifier``: the conformance check, statistical or exact, and its report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import target_law
from ..dist import validate_count
from .errors import VerifierRaised, guarded
from .ids import relabel
from .loop import Laws, exact_law, sample_counts
from .pairs import PAIR_NAMES, Pair, as_pairs, model_pairs
from .stats import (
    MIN_EXPECTED,
    POWER,
    detectable_tv,
    likelihood_ratio,
    noise_tv,
    tv_interval,
)

__all__ = ["PairResult", "ConformanceReport", "VerifierRaised", "check_verifier", "DRAWS",
           "MAX_STRINGS", "GAMMAS", "ID_SPACE", "looks", "sequential_test", "build_report",
           "as_gammas", "worst_strings"]


#: Generation loops per model pair when ``draws`` is not given.
DRAWS = 20_000
#: Largest ``vocab_size ** length`` (strings whose law is compared).
MAX_STRINGS = 100_000
#: Largest exact TV an exact check accepts as lossless (float rounding of the enumeration).
EXACT_TOL = 1e-12
#: Each step's gamma is drawn from these when ``gamma`` is not given.
GAMMAS = (1, 2, 3, 4)
#: Size of the vocabulary the checker's tokens are placed in (:mod:`.ids`).
ID_SPACE = 16
#: Greedy loops per batch of sampled ones, for a batched verifier that takes greedy rows.
GREEDY_LOOPS = 16


@dataclass(frozen=True)
class PairResult:
    """The check on one target/draft pair."""

    name: str
    description: str
    draws: int  # generation loops (0 in exact mode)
    statistic: float | None  # likelihood-ratio G (None in exact mode)
    dof: int
    p_value: float | None
    tv: float  # plug-in estimate, or exact
    tv_low: float
    tv_high: float
    detectable_tv: float
    tokens_per_call: float | None  # emitted tokens per verify call
    worst: tuple  # up to three (string, observed or verifier probability, target probability)
    noise_tv: float = 0.0  # the plug-in TV a lossless verifier shows here by sampling noise
    greedy_loops: int = 0  # greedy loops run beside the sampled ones (a batched verifier)
    greedy_wrong: int = 0  # of which strayed from the target's greedy decoding


@dataclass(frozen=True)
class ConformanceReport:
    """Outcome of :func:`check_verifier`; ``str(report)`` is a table, ``to_dict`` JSON-ready.

    ``ok``: no evidence of loss at level ``alpha`` (statistical) or exact TV at most
    ``1e-12`` on every pair (exact). ``p_value``: Bonferroni over pairs,
    ``min(1, m * min_j p_j)``. ``tv`` and ``tv_interval``: the worst pair's TV between the
    law of the first ``length`` tokens and the target's, with its 95% interval.
    ``detectable_tv``: every verifier at least this far from the target on some pair is
    caught with probability :data:`coupling.conformance.stats.POWER` (worst pair).
    """

    ok: bool
    verifier: str
    mode: str  # "statistical", "exact" or "loop" (check_generation)
    p_value: float | None
    tv: float
    tv_interval: tuple[float, float]
    draws: int  # per pair
    detectable_tv: float
    alpha: float
    vocab_size: int
    gamma: int | tuple[int, ...]  # each step's gamma drawn uniformly from a tuple
    k: int
    replacement: bool
    length: int
    seed: int
    seconds: float
    test: str
    pairs: tuple[PairResult, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pairs"] = [asdict(r) for r in self.pairs]
        return d

    def __str__(self) -> str:
        return self.table()

    def table(self) -> str:
        law = "i.i.d." if self.replacement else "without replacement"
        drafting = ("its own drafting" if self.mode == "loop" else
                    f"gamma={self.gamma}, k={self.k} ({law})")
        lines = [
            f"conformance of {self.verifier}: {self.mode}, V={self.vocab_size}, {drafting}, "
            f"first {self.length} tokens, seed={self.seed}",
            f"test: {self.test}",
            "",
            f"{'pair':<10}{'draws':>8}{'G':>10}{'dof':>6}{'p-value':>10}   "
            f"{'TV [95% interval]':<26}{'detect':>8}{'tok/call':>9}",
        ]
        for r in self.pairs:
            stat = "-" if r.statistic is None else f"{r.statistic:.1f}"
            pv = "-" if r.p_value is None else f"{r.p_value:.2g}"
            tpc = "-" if r.tokens_per_call is None else f"{r.tokens_per_call:.3f}"
            lines.append(
                f"{r.name:<10}{r.draws:>8}{stat:>10}{r.dof:>6}{pv:>10}   "
                f"{_tv_text(r.tv, r.tv_low, r.tv_high):<26}{r.detectable_tv:>8.3g}{tpc:>9}"
            )
        lines += [f"{r.name}: {r.greedy_wrong} of {r.greedy_loops} greedy loops strayed from "
                  "the target's greedy decoding" for r in self.pairs if r.greedy_wrong]
        verdict = "PASS" if self.ok else "FAIL"
        pv = "" if self.p_value is None else f"p = {self.p_value:.3g} (alpha = {self.alpha:g}), "
        bound = "tolerance" if self.mode == "exact" else "detectable TV"
        worst = max(self.pairs, key=lambda r: r.tv)
        noise = "" if self.mode == "exact" else (
            f" (a lossless verifier's sampling noise here: about {worst.noise_tv:.3g})")
        lines += ["", f"{verdict}: {pv}worst TV {_tv_text(self.tv, *self.tv_interval)}{noise}, "
                      f"{bound} {self.detectable_tv:.3g}, {self.seconds:.1f} s"]
        if self.mode != "exact":
            lines.append("TV is a plug-in estimate over every string of the first tokens, "
                         "biased up by sampling noise; the verdict is the test's p-value, and "
                         "the detectable TV is the smallest loss it catches at power "
                         f"{POWER:g}")
        return "\n".join(lines)


def _tv_text(tv: float, lo: float, hi: float) -> str:
    if lo == hi:
        return f"{tv:.3g} (exact)"
    return f"{tv:.4f} [{lo:.3f}, {hi:.3f}]"


def worst_strings(probs: np.ndarray, ref: np.ndarray, V: int, L: int) -> tuple:
    """The three strings of ``L`` tokens whose probability under ``probs`` is furthest from
    ``ref`` (laws over the ``V**L`` strings, lexicographic): ``(string, probs, ref)``."""
    top = np.argsort(-np.abs(probs - ref), kind="stable")[:3]
    return tuple((tuple(int(t) for t in np.unravel_index(i, (V,) * L)), float(probs[i]),
                  float(ref[i])) for i in top)


def _stepper(verify, pair: str) -> Callable:
    """One step of a batch of loops: a batched verifier's own (guarded as a batch), or the
    verifier called per request (guarded per request, so a failure names its one input)."""
    if getattr(verify, "batched", False) and hasattr(verify, "step"):
        return guarded(verify.step, pair)
    one = guarded(verify, pair)

    def step(drafts, p, q, rng):
        return [one(d, pp, qq, rng) for d, pp, qq in zip(drafts, p, q, strict=True)]

    return step


def looks(draws: int, batch: int = 256) -> list[int]:
    """The loop counts at which a pair's test is read: ``draws / 16, / 8, / 4, / 2`` (in whole
    batches, at least one) and ``draws``.

    >>> looks(20_000)
    [1024, 2304, 4864, 9984, 20000]
    """
    early = sorted({max(batch, draws // 2**j // batch * batch) for j in (4, 3, 2, 1)})
    return [n for n in early if n < draws] + [draws]


def sequential_test(sample: Callable[[int, int], np.ndarray], pair: Pair, P: np.ndarray, *,
                    draws: int, length: int, level: float,
                    failed: Callable[[], bool] = lambda: False) -> PairResult:
    """A pair's test, read at :func:`looks`: half of ``level`` goes to the last look, the other
    half is split evenly over the earlier ones, where a FAIL stops the loops. The reported
    p-value is the smallest ``p / share`` over the looks (a union bound: its false-positive
    rate stays ``level``). ``sample(n, done)`` runs ``n`` more loops (``done`` so far) and
    returns the counts of their first ``length`` tokens in two halves ``[2, V**length]``;
    the result's ``tokens_per_call`` is left ``None``. ``failed()``: a verdict reached by
    other means (greedy loops that strayed), which also stops the loops."""
    at = looks(draws)
    shares = [0.5 / (len(at) - 1)] * (len(at) - 1) + [0.5] if len(at) > 1 else [1.0]
    halves = np.zeros((2, P.size), dtype=np.int64)
    done, adjusted = 0, 1.0
    for n, share in zip(at, shares, strict=True):
        halves, done = halves + sample(n - done, done), n
        test = likelihood_ratio(halves.sum(axis=0), P)
        adjusted = min(adjusted, test.p_value / share)
        if adjusted < level or failed():      # overwhelming evidence of loss: stop here
            break
    tv, lo, hi = tv_interval(halves, P)
    V = round(P.size ** (1 / length))
    return PairResult(pair.name, pair.description, done, test.statistic, test.dof,
                      min(1.0, adjusted), tv, lo, hi,
                      detectable_tv(draws, test.dof, level * shares[-1]), None,
                      worst_strings(halves.sum(axis=0) / done, P, V, length), noise_tv(P, done))


def _statistical(verify, pair: Pair, P: np.ndarray, *, draws: int, length: int,
                 gammas: tuple[int, ...], k: int, replacement: bool, level: float,
                 rng: np.random.Generator, progress) -> PairResult:
    """A pair's :func:`sequential_test` on loops around ``verify``, with its tokens per
    verification call; greedy loops ride beside the sampled ones where the verifier takes
    them, and one that strays fails the pair (p-value 0)."""
    target, draft = Laws(pair.target, "target"), Laws(pair.draft, "draft")
    step = _stepper(verify, pair.name)
    batched = getattr(verify, "batched", False)
    layout = getattr(verify, "layout", "call") if batched else "rows"
    greedy = GREEDY_LOOPS if batched and getattr(verify, "greedy", False) else 0
    seen = [0, 0, 0, 0]                       # calls, emitted tokens, greedy loops, strayed

    def sample(n: int, done: int) -> np.ndarray:
        c = sample_counts(step, target, draft, n=n, length=length, gammas=gammas, k=k,
                          replacement=replacement, rng=rng, layout=layout, greedy=greedy,
                          progress=progress)
        for i, v in enumerate((c.calls, c.emitted, c.greedy_loops, c.greedy_wrong)):
            seen[i] += v
        return c.counts

    result = sequential_test(sample, pair, P, draws=draws, length=length, level=level,
                             failed=lambda: seen[3] > 0)
    result = replace(result, tokens_per_call=seen[1] / seen[0], greedy_loops=seen[2],
                     greedy_wrong=seen[3])
    return replace(result, p_value=0.0) if seen[3] else result


def _exact(law, pair: Pair, P: np.ndarray, *, length: int, gammas: tuple[int, ...], k: int,
           replacement: bool) -> PairResult:
    target, draft = Laws(pair.target, "target"), Laws(pair.draft, "draft")
    V = target(()).size
    out = exact_law(guarded(law, pair.name), target, draft, length=length, gammas=gammas,
                    k=k, replacement=replacement)
    tv = 0.5 * float(np.abs(out - P).sum())
    return PairResult(pair.name, pair.description, 0, None, 0, None, tv, tv, tv, EXACT_TOL,
                      None, worst_strings(out, P, V, length))


def as_gammas(gamma) -> tuple[int, ...]:
    """``gamma`` (a count, or a sequence of counts each step draws from) as a sorted tuple.

    >>> as_gammas(3), as_gammas([4, 1, 2, 2])
    ((3,), (1, 2, 4))
    """
    if isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool):
        return (validate_count(gamma, "gamma"),)
    try:
        out = tuple(sorted({validate_count(g, "gamma") for g in gamma}))
    except TypeError:
        raise TypeError(f"gamma must be a positive int or a sequence of them, got "
                        f"{type(gamma).__name__}") from None
    if not out:
        raise ValueError("gamma is empty: pass a positive int or a non-empty sequence of them")
    return out


def check_verifier(
    verify,
    *,
    vocab_size: int = 3,
    gamma: int | Sequence[int] = GAMMAS,
    k: int = 1,
    replacement: bool = True,
    length: int | None = None,
    draws: int | None = None,
    seed: int = 0,
    alpha: float = 1e-6,
    exact: bool = False,
    pairs: Sequence[Pair | tuple] | None = None,
    id_space: int | None = ID_SPACE,
    progress: Callable[[int, int], None] | None = None,
) -> ConformanceReport:
    """Check that iterating ``verify`` generates exactly the target's law (see the package doc).

    Parameters
    ----------
    verify : callable
        ``verify(drafts [k, gamma], p [k, gamma + 1, V], q [k, gamma, V], rng)`` returning the
        emitted tokens; or a batched verifier from :func:`from_torch`. With ``exact=True`` it
        must also have ``verify.law(drafts, p, q)`` returning ``{emitted tuple: probability}``.
    vocab_size, k, replacement
        The vocabulary, branches, and whether the ``k`` first drafts are i.i.d. (``True``)
        or distinct.
    gamma : int or sequence of int
        Drafts per branch; a sequence draws each verification step's gamma uniformly from
        it, as engines with adaptive draft lengths do (per request for a ragged batched
        verifier, per call for another batched one). Default ``(1, 2, 3, 4)``.
    length : int, optional
        Strings of the first ``length`` emitted tokens are compared; default
        ``max(gamma) + 2``, so every string spans at least two verification steps.
    draws : int, optional
        Generation loops per pair (statistical mode), default :data:`DRAWS`.
    seed : int
        Seeds the model pairs and every random draw: same arguments, same report.
    alpha : float
        False-positive rate of the whole check (Bonferroni over the pairs).
    exact : bool
        Compute each pair's output law exactly from ``verify.law`` instead of sampling.
    pairs : sequence, optional
        Your own ``(target, draft)`` language models instead of :func:`model_pairs`.
    id_space : int or None
        The verifier sees each pair's tokens at ids of a vocabulary of ``id_space`` ids, one
        of 0, 1 and the last among them (:mod:`coupling.conformance.ids`), with laws over
        the whole id space; ``None``: ids ``0 .. V - 1``. Default 16.
    progress : callable, optional
        Called as ``progress(loops_done, loops_total)`` while sampling.
    """
    V, k = validate_count(vocab_size, "vocab_size"), validate_count(k, "k")
    gammas = as_gammas(gamma)
    length = max(gammas) + 2 if length is None else validate_count(length, "length")
    id_space = None if id_space is None else validate_count(id_space, "id_space")
    draws = DRAWS if draws is None else validate_count(draws, "draws")
    _check_settings(verify, replacement, alpha, exact)
    pairs = model_pairs(V, k=k, replacement=bool(replacement), seed=seed) if pairs is None \
        else as_pairs(pairs)
    V = np.asarray(pairs[0].target(())).size
    if V**length > MAX_STRINGS:
        raise ValueError(f"vocab_size**length = {V}**{length} strings exceed {MAX_STRINGS}; "
                         "lower length or vocab_size")
    m = len(pairs)
    t0 = time.perf_counter()
    rngs = np.random.default_rng([int(seed), 1]).spawn(m)
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        progress(done[0], draws * m)

    results = []
    for j, (pair, rng) in enumerate(zip(pairs, rngs, strict=True)):
        P = np.asarray(target_law(pair.target, length), dtype=np.float64)
        kw = dict(length=length, gammas=gammas, k=k, replacement=bool(replacement))
        seen = relabel(verify, V, id_space, seed=seed, name=pair.name,
                       pair=PAIR_NAMES.index(pair.name) if pair.name in PAIR_NAMES else j)
        results.append(_exact(seen.law, pair, P, **kw) if exact else _statistical(
            seen, pair, P, draws=draws, level=alpha / m, rng=rng,
            progress=tick if progress else None, **kw))
        if not exact and results[-1].p_value * m < alpha:
            break                             # the verdict is FAIL whatever the other pairs
    return build_report(verify, tuple(results), exact=exact, alpha=float(alpha), draws=draws,
                   settings=dict(vocab_size=V, gamma=gammas[0] if len(gammas) == 1 else gammas,
                                 k=k, replacement=bool(replacement),
                                 length=length, seed=int(seed)),
                   seconds=time.perf_counter() - t0, pairs=m)


def _check_settings(verify, replacement, alpha, exact: bool) -> None:
    if not isinstance(replacement, (bool, np.bool_)):
        raise ValueError(f"replacement must be True or False, got {replacement!r}")
    if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
        raise ValueError(f"alpha must lie in (0, 1) (the false-positive rate), got {alpha!r}")
    if exact and not callable(getattr(verify, "law", None)):
        raise TypeError("exact=True needs verify.law(drafts, p, q) -> {emitted: probability}; "
                        "use the statistical mode (exact=False) for a sampler alone")
    if not callable(verify):
        raise TypeError(f"verify must be callable, got {type(verify).__name__}")


def build_report(verify, results: tuple[PairResult, ...], *, exact: bool, alpha: float,
                 draws: int, settings: dict, seconds: float, pairs: int,
                 mode: str | None = None) -> ConformanceReport:
    """The report of a check (:func:`check_verifier`, loop mode) from its pairs' results:
    the verdict (Bonferroni over all ``pairs``), the worst pair and the test's description."""
    m = pairs                                 # Bonferroni over every pair, run or not
    worst = max(results, key=lambda r: r.tv)
    if exact:
        p_value, ok = None, worst.tv <= EXACT_TOL
        test = ("exact: each pair's law of the first tokens enumerated from verify.law over "
                f"every draft tree; lossless iff TV <= {EXACT_TOL:g}")
    else:
        p_value = min(1.0, m * min(r.p_value for r in results))
        ok = p_value >= alpha
        test = (f"likelihood ratio (Williams-corrected G, chi-square reference) of the law of "
                f"the first {settings['length']} tokens against the target's exact law, "
                f"strings expected < {MIN_EXPECTED:g} times pooled; Bonferroni over {m} "
                f"pairs; read after 1/16, 1/8, 1/4, 1/2 and all of the loops, a FAIL stopping "
                f"early (half of each pair's level at the last reading); detectable TV at "
                f"power {POWER:g}")
        if len(results) < m:
            test += f"; stopped after {len(results)} of {m} pairs: the verdict was FAIL"
    return ConformanceReport(
        ok=bool(ok), verifier=_name(verify),
        mode=mode or ("exact" if exact else "statistical"),
        p_value=p_value, tv=worst.tv, tv_interval=(worst.tv_low, worst.tv_high),
        draws=0 if exact else draws, detectable_tv=max(r.detectable_tv for r in results),
        alpha=alpha, **settings, seconds=seconds, test=test, pairs=results)


def _name(verify) -> str:
    name = getattr(verify, "name", None)
    if isinstance(name, str):
        return name
    return getattr(verify, "__qualname__", None) or type(verify).__name__
