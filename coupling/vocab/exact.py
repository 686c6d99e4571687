r"""Exact laws of speculative decoding with a draft in another vocabulary.

A call after the target context ``c`` draws a candidate ``x`` from :math:`\psi_c`
(:mod:`coupling.vocab.drafting`) and verifies it with a single-path rule of
:data:`coupling.RULES`, whose drafts' law is :math:`Q_i = \psi_c(\cdot \mid x_{<i})` and whose
target laws are :math:`P_i = p(\cdot \mid c\, x_{<i})`. Speculative decoding with these laws
is ordinary speculative decoding in the target's vocabulary, so every lossless rule stays
lossless; the three methods of Timor et al. (arXiv:2502.05202) are:

* SLEM: :class:`Retokenized` verified by ``strict`` (exact match: the target's own samples,
  kept while they equal the candidate);
* SLRS: :class:`Retokenized` verified by ``token`` (rejection sampling against the exact
  string-level law :math:`\psi_c` of the candidate);
* TLI: :class:`Intersection` verified by ``token`` (rejection sampling on the shared pieces).

``block`` on either proposal is the best lossless verifier of the candidate it sees (Sun et
al.'s optimality of block verification on one path), and its value is the verifier LP's
(:func:`optimum`, which solves it). The drafted string's characters past the candidate are
the draft's own randomness, independent of the target, so no verifier that reads them does
better.

Everything here is an exact enumeration: :func:`call_law` (one call's emissions),
:func:`stream_law` (the law of the first ``length`` generated target tokens, to compare with
:func:`coupling.target_law`), :func:`tokens_per_call`; :func:`generate` samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..lm import LanguageModel
from ..rules import Rule, get_rule
from ..sequence.lp import full_information_accepted
from ..sequence.paths import propagate
from .drafting import Intersection, Retokenized

__all__ = ["METHODS", "conditionals", "call_law", "stream_law", "tokens_per_call", "optimum",
           "generate"]

#: ``divide_by(c, x, psi) -> [gamma, V]``: the laws a verifier divides by (:func:`call_law`)
Divisor = Callable[[tuple[int, ...], tuple[int, ...], dict], np.ndarray]

#: the paper's methods, and block verification of each proposal: name -> (proposal, rule)
METHODS = {"SLEM": (Retokenized, "strict"), "SLRS": (Retokenized, "token"),
           "TLI": (Intersection, "token"), "block, re-encoded": (Retokenized, "block"),
           "block, shared pieces": (Intersection, "block")}


def conditionals(psi: dict[tuple[int, ...], float], x: tuple[int, ...], V: int) -> np.ndarray:
    r"""``[gamma, V]``: :math:`\psi(\cdot \mid x_{<i})` for each offset of the candidate ``x``.

    >>> conditionals({(0, 1): 0.25, (0, 0): 0.25, (1, 1): 0.5}, (0, 1), 2).tolist()
    [[0.5, 0.5], [0.5, 0.5]]
    """
    rows = np.zeros((len(x), V))
    for cand, pr in psi.items():
        for i in range(len(x)):
            if cand[:i] != x[:i]:
                break
            rows[i, cand[i]] += pr
    return rows / rows.sum(axis=1, keepdims=True)


def _path_emission(r: Rule, x: tuple[int, ...], P: np.ndarray,
                   Q: np.ndarray) -> dict[tuple[int, ...], float]:
    """``{emitted: probability}`` of rule ``r`` on the path ``x`` with laws ``P``, ``Q``."""
    g = len(x)
    if hasattr(r, "path_law"):
        tau, nxt = r.path_law(np.array(x, dtype=np.int64), P, Q)
        return {x[:n] + (int(y),): float(tau[n] * nxt[n, y])
                for n in range(g + 1) for y in np.flatnonzero(tau[n] * nxt[n] > 0)}
    out, mass = {}, 1.0                 # a single-step rule, one draft per offset
    for i in range(g):
        row = np.asarray(r.joint(P[i], Q[i], 1), dtype=np.float64)[x[i]]
        row = row / row.sum()
        for y in np.flatnonzero(row > 0):
            if y != x[i]:
                out[x[:i] + (int(y),)] = mass * float(row[y])
        mass *= float(row[x[i]])
        if mass == 0:
            return out
    for y in np.flatnonzero(P[g] > 0):
        out[x + (int(y),)] = mass * float(P[g, y])
    return out


def call_law(rule: str | Rule, target: LanguageModel, drafting, c: Sequence[int] = (), *,
             divide_by: Divisor | None = None) -> dict[tuple[int, ...], float]:
    """``{emitted target tokens: probability}`` of one call after ``c`` (module doc).

    ``divide_by(c, x, psi)`` returns the ``[gamma, V]`` laws the verifier divides by for the
    candidate ``x``; the default, :func:`conditionals` of the candidate's exact law ``psi``, is
    the lossless choice, and another one models an engine's mistake (a negative control).
    """
    r, c = get_rule(rule, controls=True), tuple(int(t) for t in c)
    if r.unit == "token" and not r.supports(1, True):
        raise ValueError(f"rule {r.name!r} does not verify one drafted path")
    psi = drafting.candidates(c)
    V = np.asarray(target(c)).size
    out: dict[tuple[int, ...], float] = {}
    for x, w in psi.items():
        P = np.stack([np.asarray(target(c + x[:i]), dtype=np.float64)
                      for i in range(len(x) + 1)])
        Q = conditionals(psi, x, V) if divide_by is None else divide_by(c, x, psi)
        for e, pr in _path_emission(r, x, P, Q).items():
            out[e] = out.get(e, 0.0) + w * pr
    return out


def stream_law(rule: str | Rule, target: LanguageModel, drafting, length: int, *,
               divide_by: Divisor | None = None) -> np.ndarray:
    """Exact law (``V**length``, lexicographic) of the first ``length`` target tokens
    (``divide_by`` as in :func:`call_law`)."""
    V = np.asarray(target(())).size
    return propagate(lambda pre: call_law(rule, target, drafting, pre,
                                          divide_by=divide_by).items(), V, length)


def tokens_per_call(rule: str | Rule, target: LanguageModel, drafting,
                    c: Sequence[int] = ()) -> float:
    """Expected target tokens one call emits after ``c`` (accepted drafts plus one)."""
    return float(sum(len(e) * w for e, w in call_law(rule, target, drafting, c).items()))


def optimum(target: LanguageModel, drafting, c: Sequence[int] = ()) -> float:
    """Tokens per call of the best lossless verifier of the call's candidate after ``c``: the
    verifier LP (:func:`coupling.full_information_accepted`) on the candidate's law, plus
    one."""
    c = tuple(int(t) for t in c)
    psi = drafting.candidates(c)
    V = np.asarray(target(c)).size

    def proposal(ctx: Sequence[int]) -> np.ndarray:   # psi_c as a model, for this call only
        head = tuple(ctx)[len(c):]
        row = np.zeros(V)
        for x, w in psi.items():
            if x[:len(head)] == head and len(x) > len(head):
                row[x[len(head)]] += w
        return row / row.sum() if row.sum() > 0 else np.full(V, 1.0 / V)

    gamma = len(next(iter(psi)))
    return 1.0 + full_information_accepted(target, proposal, gamma, context=c)


def _verify(r: Rule, x: tuple[int, ...], P: np.ndarray, Q: np.ndarray,
            rng: np.random.Generator) -> tuple[int, ...]:
    """One verification of the path ``x`` by the rule's own sampler."""
    g = len(x)
    if r.unit != "token":
        n, _, y = r.verify_block(np.array([x]), P[None], Q[None], rng.random((g, 1)),
                                 rng.random(g + 1))
        return x[:n] + (int(y),)
    for i in range(g):
        y = int(r.sample(P[i], Q[i], np.array([x[i]]), rng))
        if y != x[i]:
            return x[:i] + (y,)
    return x + (int(rng.choice(P.shape[1], p=P[g])),)


def generate(rule: str | Rule, target: LanguageModel, drafting, length: int,
             rng: np.random.Generator, *, divide_by: Divisor | None = None
             ) -> tuple[int, ...]:
    """Sample the first ``length`` target tokens: each call drafts a candidate as an engine
    would (``drafting.sample``) and verifies it with the rule's own sampler, dividing by the
    candidate's exact conditionals (or ``divide_by``, as in :func:`call_law`)."""
    r, out = get_rule(rule, controls=True), ()
    V = np.asarray(target(())).size
    while len(out) < length:
        x = drafting.sample(out, rng)
        P = np.stack([np.asarray(target(out + x[:i]), dtype=np.float64)
                      for i in range(len(x) + 1)])
        psi = drafting.candidates(out)
        Q = conditionals(psi, x, V) if divide_by is None else divide_by(out, x, psi)
        out += _verify(r, x, P, Q, rng)
    return out[:length]
