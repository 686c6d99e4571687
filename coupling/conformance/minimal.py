"""The smallest failing case of a verifier: which vocabulary, draft length and model pair
show its loss first, the strings that are off, and a script that reproduces it.

:func:`minimal_counterexample` re-runs :func:`~coupling.conformance.check_verifier` on one
model pair at a time, over configurations in increasing size (``vocab_size`` from 2,
``gamma`` from 1, each of :func:`~coupling.conformance.model_pairs`' pairs in order; ``k`` and
the draft law stay those asked for, since a verifier is written for them), and returns the
first that fails. Each statistical check runs at ``alpha / cases`` (Bonferroni over the search),
so a lossless verifier yields a counterexample with probability at most ``alpha``; a lossy
one usually fails its first cases within a fraction of a second (each check stops at its
first overwhelming reading).

>>> from coupling.conformance import museum
>>> bug = next(e.verifier for e in museum.known_bugs() if e.key == "argmax_verifier")
>>> ce = minimal_counterexample(bug, vocab_size=3, gamma=2, exact=True)
>>> (ce.vocab_size, ce.gamma, ce.pair), ce.report.tv > 0.1
((2, 1, 'dirichlet'), True)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from ..dist import validate_count
from .check import ID_SPACE, ConformanceReport, as_gammas, check_verifier
from .pairs import model_pairs

__all__ = ["Counterexample", "minimal_counterexample"]


@dataclass(frozen=True)
class Counterexample:
    """A failing case: its settings, the one-pair report, the strings furthest from the
    target's law (``(string, observed, expected)``: counts over the report's loops, or
    probabilities in exact mode) and a script reproducing it (``str()`` shows all)."""

    vocab_size: int
    gamma: int
    k: int
    replacement: bool
    pair: str
    pair_index: int
    seed: int
    exact: bool
    report: ConformanceReport
    strings: tuple[tuple[tuple[int, ...], float, float], ...]
    script: str

    def __str__(self) -> str:
        unit = "probability" if self.exact else "count"
        lines = [f"smallest failing case: V={self.vocab_size}, gamma={self.gamma}, k={self.k}"
                 f" ({'i.i.d.' if self.replacement else 'distinct'}), pair {self.pair!r}, "
                 f"TV {self.report.tv:.4g}",
                 f"{'string':<16}{'observed ' + unit:>20}{'expected ' + unit:>20}"]
        lines += [f"{str(s):<16}{o:>20.6g}{e:>20.6g}" for s, o, e in self.strings]
        return "\n".join([*lines, "reproduce:", self.script])


def _global_name(verify) -> tuple[str, str] | None:
    """``(module, name)`` under which ``verify`` is importable, where it is bound at the top
    of its module (a function, or an instance like ``bugs.HF_RAW_Q``)."""
    module = sys.modules.get(getattr(verify, "__module__", None) or type(verify).__module__)
    for name, value in vars(module).items() if module is not None else ():
        if value is verify and not name.startswith("_"):
            return module.__name__, name
    return None


def _script(verify, *, V: int, gamma: int, k: int, replacement: bool, index: int, seed: int,
            exact: bool, id_space: int | None, source: str | None) -> str:
    name = _global_name(verify)
    if source is not None:
        load = f"from coupling.conformance.cli import load\nverify = load({source!r})"
    elif name is not None:
        load = f"from {name[0]} import {name[1]} as verify"
    else:
        load = f"verify = ...  # the verifier under test ({type(verify).__name__})"
    return "\n".join([
        "from coupling.conformance import check_verifier, model_pairs",
        load,
        f"pair = model_pairs({V}, k={k}, replacement={replacement}, seed={seed})[{index}]",
        f"print(check_verifier(verify, gamma={gamma}, k={k}, replacement={replacement}, "
        f"pairs=[pair], seed={seed}, id_space={id_space}"
        + (", exact=True))" if exact else "))")])


def minimal_counterexample(verify, *, vocab_size: int = 3, gamma: int | Sequence[int] = 2,
                           k: int = 1, replacement: bool = True, seed: int = 0,
                           alpha: float = 1e-6, exact: bool = False, draws: int | None = None,
                           id_space: int | None = ID_SPACE,
                           source: str | None = None) -> Counterexample | None:
    """The first failing case, smallest first (module doc), up to ``vocab_size`` and
    ``max(gamma)``; ``None`` where every case passes. ``source``: how the script loads the
    verifier (``"MODULE:NAME"``, as ``coupling conformance`` takes it); the other arguments
    are :func:`~coupling.conformance.check_verifier`'s."""
    V_max, k = validate_count(vocab_size, "vocab_size"), validate_count(k, "k")
    g_max = max(as_gammas(gamma))
    sizes = sorted(((V, g) for V in range(max(2, k if not replacement else 2), V_max + 1)
                    for g in range(1, g_max + 1)), key=lambda vg: (vg[0] ** (vg[1] + 2), vg))
    cases = [(V, g, i, pair) for V, g in sizes for i, pair in
             enumerate(model_pairs(V, k=k, replacement=replacement, seed=seed))]
    for V, g, i, pair in cases:
        report = check_verifier(verify, gamma=g, k=k, replacement=replacement, seed=seed,
                                alpha=alpha / len(cases), exact=exact, draws=draws,
                                pairs=[pair], id_space=id_space)
        if report.ok:
            continue
        res = report.pairs[0]
        scale = 1.0 if exact else float(res.draws)
        strings = tuple((s, o * scale, e * scale) for s, o, e in res.worst)
        return Counterexample(V, g, k, bool(replacement), pair.name, i, seed, exact, report,
                              strings, _script(verify, V=V, gamma=g, k=k,
                                               replacement=bool(replacement), index=i,
                                               seed=seed, exact=exact, id_space=id_space,
                                               source=source))
    return None
