r"""A museum of verification bugs that shipped, and of published "bugs" that are not bugs.

Each exhibit is written in this package's words from the public description of the bug (no
code copied), as a one-branch verifier of the checker's protocol with its exact law, so
``check_verifier(exhibit.verifier, exact=True, gamma=2, id_space=None)`` measures its output
distortion exactly: :func:`known_bugs` lists them with their sources and the verdict the
checker must reach. The exhibits model a vocabulary of exactly the check's ``V`` tokens (the
zeros of a law are the tokens a filter removed), hence ``id_space=None``.
The first three are the reproductions of :mod:`.bugs` (with their fixes).

``reseeded_generator``
    Research code that reseeds its generator before every drafted position, so one uniform
    decides every acceptance: the walk accepts while :math:`u < a_i`, and
    :math:`P(\tau \ge n) = \min_{i \le n} a_i` instead of :math:`\prod_{i \le n} a_i`.
``argmax_verifier``
    A verifier that accepts a draft iff it is the target's likeliest token and emits that
    token at the first mismatch: greedy decoding's rule run under sampling.
``min_p_missing`` (vLLM #42802)
    The target's law on the verified rows skips min-p, which plain sampling applies: the
    verifier judges with the law before the filter (the filtered tokens get back the mass
    ``1 - kept_mass``), so the output leaves the filtered law wherever the filter removed
    tokens.
``bf16_draft_fp32_judge`` (DeepSpec #31)
    Drafts sampled from bfloat16 probabilities, judged with the float32 ones: the verifier's
    ``q`` differs from the law the drafts came from by bfloat16 rounding (about 1e-3 TV).
``ascend_residual_one_early`` (vllm-ascend, the torch fallback after #7808)
    Block verification whose stopping probability at position ``i`` reads the residual mass
    one position too early (position ``i - 1``, where the kernel of the same change reads
    ``i``).
``hsd_single_path`` (arXiv:2601.05724, its public code)
    Hierarchical speculative decoding's single-path verification (``proofs/hsd_lossy.py``
    has the law and the exact counterexample).
``inclusive_zero_coin`` (SGLang #35771)
    Token verification comparing ``u <= p(x) / q(x)`` where ``u < p(x) / q(x)`` is meant: a
    draft the target gives probability 0 is accepted when the coin is exactly 0 (or so small
    that ``u q(x)`` underflows). Its law is speculative sampling's, so no test of the law
    sees it; the boundary probes do (:mod:`.probes`).
``medusa_typical`` (Cai et al. 2024)
    Typical acceptance, published as lossy: the checker measures its distortion.
``exact_match`` (dflash #74, mlx-swift-lm #459: reported as bugs, not bugs)
    Accepting a draft iff it equals the target's own sample at that position is lossless:
    the emitted token is always the target's sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bugs import (
    REPRODUCTIONS,
    AscendBlockVerify,
    HfRawQ,
    Reproduction,
    block_weights,
    draw,
    residual_law,
    token_tau,
)
from .verifiers import from_rule

__all__ = ["Exhibit", "known_bugs", "ReseededGenerator", "ArgmaxVerifier", "MinPMissing",
           "Bf16Judge", "AscendResidualOneEarly", "HsdSinglePath", "InclusiveZeroCoin",
           "hsd_path_law"]


@dataclass(frozen=True)
class Exhibit:
    """A museum piece: ``verifier`` is lossy iff ``lossy`` (the verdict the checker must
    reach), ``source`` where it was reported, ``caught_by`` the check that sees it ("exact":
    its law; "probe": only the boundary probes of :mod:`.probes`)."""

    key: str
    source: str
    summary: str
    verifier: object
    lossy: bool
    caught_by: str = "exact"


def _ratios(x, P, Q) -> np.ndarray:
    g = x.size
    return np.minimum(1.0, P[np.arange(g), x] / Q[np.arange(g), x])


def _sample_path(self, drafts, p, q, rng) -> np.ndarray:
    """Sample a one-branch verifier's emission from its own exact path law."""
    x, P, Q = self._branch(drafts, p, q)
    tau, nxt = self.path_law(x, P, Q)
    n = draw(tau, rng)
    return np.append(x[:n], draw(nxt[n], rng))


def _token_nxt(P, Q, g) -> np.ndarray:
    return np.vstack([residual_law(P[i], Q[i]) for i in range(g)] + [P[g]])


class ReseededGenerator(Reproduction):
    """One uniform decides every position's acceptance (module doc)."""

    key = "reseeded_generator"
    issue = "research code that reseeds its generator before every position"

    def path_law(self, x, P, Q):
        a = _ratios(x, P, Q)
        m = np.minimum.accumulate(np.concatenate([[1.0], a]))       # P(tau >= n)
        tau = m - np.append(m[1:], 0.0)
        return tau, _token_nxt(P, Q, x.size)

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        a, u = _ratios(x, P, Q), rng.random()
        n = int(np.argmin(np.append(u < a, False)))                  # first position failed
        return np.append(x[:n], draw(P[n] if n == x.size else residual_law(P[n], Q[n]), rng))


class ArgmaxVerifier(Reproduction):
    """Greedy verification under sampling (module doc)."""

    key = "argmax_verifier"
    issue = "greedy verification run under sampling"

    def path_law(self, x, P, Q):
        g = x.size
        best = P.argmax(-1)
        n = int(np.argmin(np.append(x == best[:g], False)))
        tau = np.zeros(g + 1)
        tau[n] = 1.0
        return tau, np.eye(P.shape[1])[best]

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        best = P.argmax(-1)
        n = int(np.argmin(np.append(x == best[:x.size], False)))
        return np.append(x[:n], best[n])


class MinPMissing(HfRawQ):
    """The target's law judged before its min-p filter (vLLM #42802; module doc)."""

    key = "min_p_missing"
    issue = "vLLM #42802"

    def path_law(self, x, P, Q):
        g = x.size
        R = np.vstack([self.told(P[i]) for i in range(g + 1)])
        a = np.minimum(1.0, R[np.arange(g), x] / Q[np.arange(g), x])
        return token_tau(a), np.vstack([residual_law(R[i], Q[i]) for i in range(g)] + [R[g]])

    __call__ = _sample_path


def bf16(law: np.ndarray) -> np.ndarray:
    """``law`` rounded to bfloat16 (8 bits of mantissa, round to nearest even) and
    renormalised."""
    bits = np.asarray(law, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32).astype(np.float64)
    return out / out.sum()


class Bf16Judge(Reproduction):
    """Drafts from bfloat16 probabilities judged with float32 ones (DeepSpec #31)."""

    key = "bf16_draft_fp32_judge"
    issue = "DeepSpec #31"

    def path_law(self, x, P, Q):
        g = x.size
        R = np.vstack([bf16(Q[i]) for i in range(g)])
        a = np.minimum(1.0, P[np.arange(g), x] / R[np.arange(g), x])
        return token_tau(a), np.vstack([residual_law(P[i], R[i]) for i in range(g)] + [P[g]])

    __call__ = _sample_path


class AscendResidualOneEarly(AscendBlockVerify):
    """Block verification reading the residual mass one position early (module doc)."""

    key = "ascend_residual_one_early"
    issue = "vllm-ascend, the torch fallback after #7808"

    def __init__(self):
        super().__init__(fixed=True)
        self.name = self.key

    def path_law(self, x, P, Q):
        g = x.size
        w, h = block_weights(x, P, Q)
        for i in range(1, g):   # the mass of position i - 1 where i is meant
            s = np.maximum(w[i] * P[i - 1] - Q[i - 1], 0.0).sum()
            h[i] = s / (s + 1.0 - w[i]) if s + 1.0 - w[i] > 0 else 1.0
        tau, tail = np.empty(g + 1), 1.0
        for i in range(g, 0, -1):
            tau[i] = h[i] * tail
            tail *= 1.0 - h[i]
        tau[0] = tail
        return tau, np.vstack([residual_law(w[i] * P[i], Q[i]) if w[i] > 0 else P[i]
                               for i in range(g)] + [P[g]])

    __call__ = _sample_path


def hsd_path_law(x, P, Q) -> tuple[np.ndarray, list[np.ndarray]]:
    """HSD's single-path law (``proofs/hsd_lossy.py`` has it in exact rationals): ``(tau
    [gamma + 1], next-token laws [gamma + 1])``."""
    g = x.size
    qi, pi = Q[np.arange(g), x], P[np.arange(g), x]
    a, plus = np.zeros(g), []
    Pk, Qk, M = 1.0, 1.0, 1.0
    for k in range(g):
        M = max(M, Pk / Qk)
        row = Pk / M * P[k] - Qk * Q[k]
        pl, mi = np.maximum(row, 0.0), np.maximum(-row, 0.0)
        den = max(pl.sum(), mi.sum())
        a[k] = pl.sum() / den if den > 0 else 0.0
        plus.append(pl / pl.sum() if pl.sum() > 0 else P[k] / P[k].sum())
        Pk, Qk = Pk * pi[k], Qk * qi[k]
    full = min(1.0, float(np.prod(pi / qi)))
    tau = np.zeros(g + 1)
    tau[g] = full
    for s in range(g):
        stay = np.prod(1.0 - a[s + 1:]) * (a[s] if s > 0 else 1.0)
        tau[s] += (1.0 - full) * stay
    return tau, plus + [P[g]]


class HsdSinglePath(Reproduction):
    """HSD's single-path verification, as its public code runs it (module doc)."""

    key = "hsd_single_path"
    issue = "arXiv:2601.05724 (its public code)"

    def path_law(self, x, P, Q):
        tau, nxt = hsd_path_law(x, P, Q)
        return tau, np.vstack(nxt)

    __call__ = _sample_path


class InclusiveZeroCoin(Reproduction):
    """Token verification accepting when ``u <= p(x) / q(x)`` (SGLang #35771; module doc)."""

    key = "inclusive_zero_coin"
    issue = "SGLang #35771"

    def path_law(self, x, P, Q):        # the law is speculative sampling's
        return token_tau(_ratios(x, P, Q)), _token_nxt(P, Q, x.size)

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        for i in range(x.size):
            if not rng.random() * Q[i, x[i]] <= P[i, x[i]]:
                return np.append(x[:i], draw(residual_law(P[i], Q[i]), rng))
        return np.append(x, draw(P[x.size], rng))


def known_bugs() -> tuple[Exhibit, ...]:
    """Every exhibit (module doc), bugs first, each with the verdict the checker must reach."""
    out = [Exhibit(key, bug.issue, (type(bug).__doc__ or "").strip().splitlines()[0], bug,
                   True) for key, (bug, _) in REPRODUCTIONS.items()]
    out += [Exhibit(key + " (fixed)", fix.issue, "the published fix", fix, False)
            for key, (_, fix) in REPRODUCTIONS.items()]
    for exhibit in (ReseededGenerator(), ArgmaxVerifier(), MinPMissing(), Bf16Judge(),
                    AscendResidualOneEarly(), HsdSinglePath()):
        out.append(Exhibit(exhibit.key, exhibit.issue,
                           (type(exhibit).__doc__ or "").strip().splitlines()[0], exhibit, True))
    out.append(Exhibit(InclusiveZeroCoin.key, InclusiveZeroCoin.issue,
                       "accept iff u <= p(x) / q(x)", InclusiveZeroCoin(), True, "probe"))
    out.append(Exhibit("medusa_typical", "Cai et al. 2024 (Medusa), published as lossy",
                       "typical acceptance", from_rule("typical"), True))
    out.append(Exhibit("exact_match", "dflash #74, mlx-swift-lm #459 (not bugs)",
                       "accept iff the draft is the target's own sample", from_rule("strict"),
                       False))
    return tuple(out)
