r"""Verification along a drafted block: token vs block verification, exact analysis, block LPs.

Sequence-level models
---------------------
A *language model* here is any callable ``lm(context) -> np.ndarray`` mapping a context
(a tuple of token ids) to the next-token law over ``V`` tokens. :class:`TabularLM` draws
such models at random (a Dirichlet table indexed by the last ``order`` tokens); any other
callable (e.g. a replay of distributions recorded from a real LLM, :class:`TraceLM`) plugs
in unchanged. A model returning ``object`` arrays of :class:`fractions.Fraction` runs every
*exact* function of this module (:func:`path_law`, :func:`accepted_length_law`,
:func:`stream_law`, ...) in exact rational arithmetic; that is what ``proofs/`` uses.

One iteration of speculative decoding
-------------------------------------
With context :math:`c`, the draft model :math:`M_s` proposes
:math:`X^\gamma = (X_1, \dots, X_\gamma)`, :math:`X_i \sim q_i := M_s(\cdot \mid c, X^{i-1})`;
one call of the target :math:`M_b` gives :math:`p_i := M_b(\cdot \mid c, X^{i-1})` for
:math:`i = 1, \dots, \gamma + 1`. A verifier returns an accepted length
:math:`\tau \in \{0, \dots, \gamma\}` and one more token :math:`Y`; the iteration emits
:math:`(X_1, \dots, X_\tau, Y)`, i.e. :math:`\tau + 1` tokens per target call.

``"token"`` (Leviathan et al. 2023; Chen et al. 2023)
    accept :math:`X_i` with probability :math:`a_i = \min(1, p_i(X_i)/q_i(X_i))`, stop at the
    first rejection :math:`i = \tau + 1` and draw :math:`Y \sim \mathrm{norm}(\max(p_i - q_i, 0))`;
    if all :math:`\gamma` are accepted draw the bonus :math:`Y \sim p_{\gamma+1}`.

``"block"`` (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, *Block Verification
Accelerates Speculative Decoding*, arXiv:2403.10444, ICLR 2025, Algorithm 2)
    running weights :math:`w_0 = 1`, :math:`w_i = \min(w_{i-1}\, p_i(X_i)/q_i(X_i),\, 1)`;
    residual masses :math:`r_i = \sum_x \max(w_i\, p_{i+1}(x) - q_{i+1}(x), 0)`;
    per-position acceptance probabilities

    .. math:: h_i = \frac{r_i}{r_i + 1 - w_i} \quad (1 \le i < \gamma), \qquad h_\gamma = w_\gamma;

    draw :math:`\eta_1, \dots, \eta_\gamma \sim U[0, 1)` and set
    :math:`\tau = \max\{i \ge 1 : \eta_i < h_i\}` (:math:`\tau = 0` if there is none): it scans
    *every* position, it does not stop at the first failure. Then :math:`Y \sim p_{\gamma+1}` if
    :math:`\tau = \gamma`, else
    :math:`Y \sim \mathrm{norm}(\max(w_\tau\, p_{\tau+1} - q_{\tau+1}, 0))`.
    (When :math:`r_i + 1 - w_i = 0`, i.e. :math:`w_i = 1` and :math:`p_{i+1} = q_{i+1}`, we set
    :math:`h_i = 1`; then :math:`w_{i+1} = 1` too, so stopping at :math:`i` has probability 0
    and the undefined residual is never used.)

    Key identity (checked exactly in the tests): :math:`P(\tau \ge i \mid X^i) = w_i(X^i)`, and
    :math:`w_i = \min_{0 \le j \le i} \prod_{k=j+1}^{i} p_k(X_k)/q_k(X_k)`.

``"gumbel"`` (drafter-invariant, communication-free; optional extension)
    drafter and verifier share Gumbel noise :math:`G_i` per absolute position (e.g.
    :func:`position_gumbels`); the drafter emits :math:`X_i = \arg\max \log q_i + G_i`, the
    verifier computes :math:`Y_i = \arg\max \log p_i + G_i` along the drafted path, accepts
    while :math:`X_i = Y_i` and emits :math:`Y` at the first disagreement (or the bonus
    :math:`Y_{\gamma+1}`). It never needs :math:`q`; each match has probability
    :math:`c(b) = 1/\sum_j \max(p_j/p_b, q_j/q_b) \le \min(p_b, q_b)`, so it accepts at most
    as much as ``"token"`` (equal for :math:`V = 2`). See :func:`verify_block_gumbel`.

All three are lossless: the generated stream has exactly the law of the target model
(:func:`stream_law` checks it exactly; ``proofs/block_lossless.py`` in exact rationals).

Numerical note: in float64, :math:`h_i = r_i / (r_i + 1 - w_i)` is ill-conditioned when both
:math:`r_i` and :math:`1 - w_i` are at rounding level (target and draft laws equal up to
rounding but not exactly); exactly equal laws are handled (:math:`h_i = 1`).

What "optimal" means
--------------------
* **Token verification** decides position by position.
* **Theorem (Sun et al. 2025, Theorem 2; optimality).** Call a verifier *valid* if, for every
  pair of models :math:`(M_b, M_s)` and every context, iterating it generates exactly the
  law of :math:`M_b`, and let it see only the drafted block and the conditionals along it,
  :math:`(X^\gamma, q_1..q_\gamma, p_1..p_{\gamma+1})` (plus private randomness). Then for
  every pair, context and :math:`\gamma`, :math:`E[\tau] \le E[\tau_{\text{block}}]`. In
  particular block :math:`\ge` token (they coincide for :math:`\gamma = 1`).
* **Full information does not help.** :func:`verifier_lp` is the LP over *all* lossless
  one-iteration verifiers of one given pair, with full knowledge of both models (every
  off-path conditional). Its optimum :func:`full_information_accepted` equals block
  verification's value on every instance we solved, and ``proofs/block_optimality.py``
  certifies this with exact rational dual bounds; since the information-restricted class is
  a subset, this implies Theorem 2 on those instances. (Thomas & Pal, arXiv:2602.16961,
  prove this stronger statement in general.)
* **The block transport bound is not achievable.** :func:`optimal_expected_accepted` solves
  :math:`\max_{\pi \in \Pi(Q^\gamma, P^\gamma)} E_\pi[\mathrm{LCP}(X, Y)]` over couplings of
  the draft block and a target block. It upper-bounds every verifier, but it is a
  relaxation: a verifier can emit only the agreed prefix plus one token, after which the
  target continues afresh, whereas the coupling may correlate the draft with the target's
  *later* tokens.
* **The paper's motivating example** (binary vocabulary, context-independent target
  (1/3, 2/3) and draft (2/3, 1/3), :math:`\gamma = 2`): token verification accepts 10/9
  draft tokens per iteration, block verification 11/9, and the transport bound ("a verifier
  with full knowledge of the joint block probabilities" in the paper) is 12/9. Our exact dual
  certificate shows that no lossless verifier of the prefix-plus-one-token form, even with
  full knowledge, exceeds 11/9 on this example: 12/9 is the relaxation's value only.

Conventions: ``expected_accepted`` counts accepted draft tokens per iteration (the paper's
convention, 10/9 / 11/9 / 12/9 above); ``block_efficiency = expected_accepted + 1`` counts
tokens produced per target call.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

from .dist import as_distribution, validate_count

__all__ = [
    "RULES",
    "NEGATIVE_CONTROLS",
    "LanguageModel",
    "TabularLM",
    "TraceLM",
    "block_weights",
    "path_law",
    "accepted_length",
    "verify_block",
    "verify_block_gumbel",
    "gumbel_match",
    "position_gumbels",
    "GUMBEL_RULES",
    "sample_block",
    "path_laws",
    "accepted_length_law",
    "expected_accepted",
    "block_efficiency",
    "optimal_expected_accepted",
    "optimal_block_efficiency",
    "full_information_accepted",
    "verifier_lp",
    "VerifierLP",
    "stream_law",
    "target_law",
    "sample_stream",
    "motivating_example",
    "constant_acceptance_efficiency",
]

LanguageModel = Callable[[tuple[int, ...]], np.ndarray]

#: Lossless rules implemented along a block.
RULES: tuple[str, ...] = ("token", "block")
#: Deliberately broken rules, used only as negative controls by the tests:
#: ``"block-plain-residual"`` keeps block verification's accepted length but corrects with the
#: plain residual ``norm(max(p - q, 0))`` instead of ``norm(max(w p - q, 0))``;
#: ``"token-target-resample"`` resamples from ``p`` (not the residual) after a rejection.
NEGATIVE_CONTROLS: tuple[str, ...] = (
    "block-plain-residual",
    "token-target-resample",
    "gumbel-emit-draft",
)
#: Drafter-invariant rules: drafts and verification share Gumbel noise, so the draft block is
#: not an independent input (use :func:`verify_block_gumbel`, not :func:`verify_block`).
#: ``"gumbel-emit-draft"`` (a negative control) emits the draft instead of the target's token
#: at the first disagreement.
GUMBEL_RULES: tuple[str, ...] = ("gumbel",)

#: Largest number of draft paths an exact enumeration may visit (``V**gamma``).
MAX_PATHS = 2_000_000


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


def _check_vocab(vocab_size: int) -> int:
    return validate_count(vocab_size, "vocab_size")


class TabularLM:
    r"""A seeded random language model whose next-token law depends on the last ``order`` tokens.

    The table has one Dirichlet(:math:`\alpha \mathbf 1_V`) row per context key, where the key
    is the last ``order`` tokens of the context left-padded with a beginning-of-sequence
    symbol (index ``V``), so short contexts have their own laws. ``order=0`` gives a
    context-independent model. Small ``concentration`` gives peaked, sparse-ish laws
    (models that disagree a lot); large ``concentration`` gives near-uniform ones.

    Parameters
    ----------
    vocab_size : int
    order : int, default 1
    seed : int, default 0
        Seeds ``np.random.default_rng``: same arguments, same model.
    concentration : float, default 1.0
        Dirichlet parameter :math:`\alpha > 0`.
    """

    def __init__(self, vocab_size: int, order: int = 1, seed: int = 0, concentration: float = 1.0):
        V = _check_vocab(vocab_size)
        if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 0:
            raise ValueError(f"order must be a non-negative integer, got {order!r}")
        if not (
            isinstance(concentration, (int, float))
            and math.isfinite(concentration)
            and concentration > 0
        ):
            raise ValueError(
                f"concentration must be a finite positive number, got {concentration!r}"
            )
        n_rows = (V + 1) ** int(order)
        if n_rows * V > 20_000_000:
            raise ValueError(
                f"a TabularLM with vocab_size={V}, order={order} needs {n_rows * V} table entries; "
                "lower order or vocab_size"
            )
        rng = np.random.default_rng(seed)
        rows = rng.dirichlet(np.full(V, float(concentration)), size=n_rows)
        # Dirichlet rows with tiny alpha can underflow to exact zeros and even sum to
        # 1 - 1e-16; renormalise so every row is an exact-enough distribution.
        rows /= rows.sum(axis=1, keepdims=True)
        self._init_table(rows.reshape((V + 1,) * int(order) + (V,)))
        self.seed = seed
        self.concentration = float(concentration)

    def _init_table(self, table: np.ndarray) -> None:
        table = np.array(table, dtype=np.float64)
        table.setflags(write=False)
        self.table = table
        self.order = table.ndim - 1
        self.vocab_size = table.shape[-1]

    @classmethod
    def from_table(cls, table: ArrayLike) -> TabularLM:
        """Wrap an explicit table of shape ``(V + 1,) * order + (V,)`` (index ``V`` = BOS)."""
        arr = np.asarray(table, dtype=np.float64)
        if arr.ndim < 1:
            raise ValueError("table must have shape (V + 1,) * order + (V,)")
        V = arr.shape[-1]
        if any(s != V + 1 for s in arr.shape[:-1]):
            raise ValueError(
                f"table must have shape (V + 1,) * order + (V,) with V={V}, got {arr.shape}"
            )
        flat = arr.reshape(-1, V)
        for i, row in enumerate(flat):
            as_distribution(row, name=f"table row {i}")
        obj = cls.__new__(cls)
        obj._init_table((flat / flat.sum(axis=1, keepdims=True)).reshape(arr.shape))
        obj.seed = None
        obj.concentration = None
        return obj

    @classmethod
    def constant(cls, p: ArrayLike) -> TabularLM:
        """A context-independent model that always returns ``p``."""
        return cls.from_table(as_distribution(p, name="p"))

    def key(self, context: Sequence[int]) -> tuple[int, ...]:
        ctx = _check_context(context, self.vocab_size)
        tail = ctx[-self.order :] if self.order else ()
        return (self.vocab_size,) * (self.order - len(tail)) + tuple(tail)

    def __call__(self, context: Sequence[int] = ()) -> np.ndarray:
        return self.table[self.key(context)]

    def __repr__(self) -> str:
        return (
            f"TabularLM(vocab_size={self.vocab_size}, order={self.order}, seed={self.seed}, "
            f"concentration={self.concentration})"
        )


class TraceLM:
    """Replay next-token laws recorded along one path (e.g. from a real LLM).

    ``TraceLM(prompt, tokens, dists)`` answers ``context = prompt + tokens[:i]`` with
    ``dists[i]`` (``dists`` has ``len(tokens) + 1`` rows or ``len(tokens)`` rows). Any other
    context raises ``KeyError``: a replay knows nothing off its recorded path, so analyses
    that enumerate all drafts cannot run on it, but :func:`path_law`/:func:`verify_block` can.
    """

    def __init__(self, prompt: Sequence[int], tokens: Sequence[int], dists: ArrayLike):
        d = np.asarray(dists, dtype=np.float64)
        if d.ndim != 2 or d.shape[0] not in (len(tokens), len(tokens) + 1):
            raise ValueError(
                f"dists must have shape [len(tokens) or len(tokens)+1, V], got {d.shape} "
                f"for {len(tokens)} tokens"
            )
        self.vocab_size = d.shape[1]
        self.prompt = _check_context(prompt, None)
        self.tokens = _check_context(tokens, self.vocab_size)
        self.dists = np.stack([as_distribution(r, name=f"dists[{i}]") for i, r in enumerate(d)])

    def __call__(self, context: Sequence[int]) -> np.ndarray:
        ctx = _check_context(context)
        n = len(self.prompt)
        i = len(ctx) - n
        if ctx[:n] != self.prompt or i < 0 or i >= len(self.dists) or ctx[n:] != self.tokens[:i]:
            raise KeyError(f"context {ctx} is not on the recorded trace")
        return self.dists[i]


def _token_id(t: object) -> int | None:
    """``t`` as a token id, or None if it is not an integer (integral floats count, bools not).

    ``int(t)`` would silently truncate 0.9 to token 0; bools are rejected as in
    :func:`coupling.dist.validate_drafts`.
    """
    if isinstance(t, (bool, np.bool_)):
        return None
    if isinstance(t, (float, np.floating)):
        return int(t) if math.isfinite(t) and float(t).is_integer() else None
    try:
        return operator.index(t)
    except TypeError:
        return None


def _check_context(context: Sequence[int], V: int | None = None) -> tuple[int, ...]:
    try:
        ids = [_token_id(t) for t in context]
    except TypeError:  # not iterable
        ids = [None]
    if any(t is None for t in ids):
        raise ValueError(
            f"context must be a sequence of integer token ids, got {context!r}; "
            "pass ints (bools and non-integral numbers are not token ids)"
        )
    ctx = tuple(ids)
    if V is not None and any(t < 0 or t >= V for t in ctx):
        raise ValueError(f"context {ctx} has token ids outside [0, {V})")
    return ctx


# --------------------------------------------------------------------------------------
# Validation shared by the float and exact (Fraction) paths
# --------------------------------------------------------------------------------------


def _is_exact(arr: np.ndarray) -> bool:
    return arr.dtype == object


def _law(x: ArrayLike, name: str) -> np.ndarray:
    """One next-token law: float64 via ``as_distribution``, or an exact Fraction array."""
    arr = np.asarray(x)
    if arr.dtype == object:
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name} must be a non-empty 1-D array, got shape {arr.shape}")
        if not all(isinstance(v, (int, Fraction)) for v in arr):
            raise ValueError(f"{name}: exact laws must hold int or fractions.Fraction entries")
        if any(v < 0 for v in arr) or sum(arr) != 1:
            raise ValueError(f"{name} is not an exact probability vector (entries >= 0, sum == 1)")
        return arr
    return as_distribution(arr, name=name)


def _path_arrays(drafts: ArrayLike, p_path: ArrayLike, q_path: ArrayLike):
    P = np.asarray(p_path)
    Q = np.asarray(q_path)
    if P.ndim != 2 or Q.ndim != 2:
        raise ValueError(
            f"p_path must be [gamma+1, V] and q_path [gamma, V]; got shapes {P.shape} and {Q.shape}"
        )
    x = np.asarray(drafts)
    if x.ndim != 1:
        raise ValueError(f"drafts must be a 1-D array of gamma token ids, got shape {x.shape}")
    gamma = x.size
    if gamma < 1:
        raise ValueError("drafts is empty: a block needs gamma >= 1 drafted tokens")
    if Q.shape[0] != gamma or P.shape[0] != gamma + 1 or P.shape[1] != Q.shape[1]:
        raise ValueError(
            f"shape mismatch: {gamma} drafts need p_path of shape [{gamma + 1}, V] and q_path of "
            f"shape [{gamma}, V]; got {P.shape} and {Q.shape}"
        )
    if x.dtype.kind not in "iu":
        raise ValueError(f"drafts must hold integer token ids, got dtype {x.dtype}")
    V = P.shape[1]
    if (x < 0).any() or (x >= V).any():
        raise ValueError(f"drafts has token ids outside [0, {V}): {x.tolist()}")
    exact = _is_exact(P) or _is_exact(Q)
    if exact:
        P = P.astype(object)
        Q = Q.astype(object)
    Pv = np.stack([_law(P[i], f"p_path[{i}]") for i in range(gamma + 1)])
    Qv = np.stack([_law(Q[i], f"q_path[{i}]") for i in range(gamma)])
    for i, t in enumerate(x.tolist()):
        if Qv[i, t] == 0:
            raise ValueError(
                f"drafts[{i}] = {t} has draft probability q_path[{i}][{t}] = 0: "
                "it cannot have been "
                "drafted; pass the laws the drafts were sampled from"
            )
    return x.astype(np.int64), Pv, Qv


def _check_rule(rule: str, gumbel: bool = False) -> str:
    ok = RULES + GUMBEL_RULES + NEGATIVE_CONTROLS
    if rule not in ok:
        raise ValueError(
            f"rule must be one of {RULES + GUMBEL_RULES} (negative controls: "
            f"{NEGATIVE_CONTROLS}), got {rule!r}"
        )
    if not gumbel and _is_gumbel(rule):
        raise ValueError(
            f"rule {rule!r} couples drafting and verification through shared Gumbel noise; "
            "use verify_block_gumbel (drafts alone do not determine its law)"
        )
    return rule


def _is_gumbel(rule: str) -> bool:
    return rule.startswith("gumbel")


def _check_gamma(gamma: int, name: str = "gamma") -> int:
    """A positive integer count; ``name`` is the caller's argument (``gamma`` or ``length``)."""
    return validate_count(gamma, name, "block length" if name == "gamma" else "number of tokens")


# --------------------------------------------------------------------------------------
# Per-path laws (dtype-generic: float64 or exact Fractions)
# --------------------------------------------------------------------------------------


def _normalise(v: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = v.sum()
    if s > 0:
        return v / s
    # Zero residual mass: the stop that would use it has probability 0 (see module doc);
    # return the target's law so callers never see NaN.
    return fallback


def _weights_and_h(x: np.ndarray, P: np.ndarray, Q: np.ndarray):
    gamma = x.size
    one = Fraction(1) if _is_exact(P) else 1.0
    w = [one]
    h = [None]
    for i in range(1, gamma + 1):
        t = x[i - 1]
        w_i = min(w[-1] * P[i - 1, t] / Q[i - 1, t], one)
        w.append(w_i)
        if i < gamma:
            r = np.maximum(w_i * P[i] - Q[i], 0).sum()
            den = r + (one - w_i)
            h.append(r / den if den > 0 else one)
        else:
            h.append(w_i)
    return w, h


def block_weights(
    drafts: ArrayLike, p_path: ArrayLike, q_path: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    r"""Block verification's running weights :math:`w_0..w_\gamma` and acceptance probabilities.

    Returns ``(w, h)`` with ``w[0] = 1``, :math:`w_i = \min(w_{i-1} p_i(x_i)/q_i(x_i), 1)`,
    ``h[0] = 0`` (unused), :math:`h_i = r_i / (r_i + 1 - w_i)` for :math:`1 \le i < \gamma`,
    :math:`h_\gamma = w_\gamma`, where :math:`r_i = \sum_x \max(w_i p_{i+1}(x) - q_{i+1}(x), 0)`.
    Arrays are float64, or object (Fractions) for exact inputs.
    """
    x, P, Q = _path_arrays(drafts, p_path, q_path)
    w, h = _weights_and_h(x, P, Q)
    h[0] = 0 * w[0]
    dt = object if _is_exact(P) else np.float64
    return np.array(w, dtype=dt), np.array(h, dtype=dt)


def _path_law(rule: str, x: np.ndarray, P: np.ndarray, Q: np.ndarray):
    gamma = x.size
    exact = _is_exact(P)
    one = Fraction(1) if exact else 1.0
    tau = [0 * one] * (gamma + 1)
    nxt = []
    if rule in ("token", "token-target-resample"):
        a = [min(one, P[i, x[i]] / Q[i, x[i]]) for i in range(gamma)]
        run = one
        for i in range(gamma):
            tau[i] = run * (one - a[i])
            run = run * a[i]
        tau[gamma] = run
        for i in range(gamma):
            if rule == "token":
                nxt.append(_normalise(np.maximum(P[i] - Q[i], 0), P[i]))
            else:
                nxt.append(P[i])
    else:
        w, h = _weights_and_h(x, P, Q)
        # P(tau = i) = h_i prod_{j>i} (1 - h_j): tau is the LAST position whose coin succeeds
        tail = one
        for i in range(gamma, 0, -1):
            tau[i] = h[i] * tail
            tail = tail * (one - h[i])
        tau[0] = tail
        for i in range(gamma):
            wi = one if rule == "block-plain-residual" else w[i]
            nxt.append(_normalise(np.maximum(wi * P[i] - Q[i], 0), P[i]))
    nxt.append(P[gamma])
    dt = object if exact else np.float64
    return np.array(tau, dtype=dt), np.stack(nxt).astype(dt)


def path_law(
    rule: str, drafts: ArrayLike, p_path: ArrayLike, q_path: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact law of one verification given the drafted path.

    Returns
    -------
    tau_probs : [gamma + 1]
        :math:`P(\tau = i \mid X^\gamma = x)`. Token: :math:`\prod_{j \le i} a_j (1 - a_{i+1})`.
        Block: :math:`h_i \prod_{j > i} (1 - h_j)` (:math:`\tau = 0`: :math:`\prod_j (1 - h_j)`).
    next_laws : [gamma + 1, V]
        Law of the emitted token ``Y`` given :math:`\tau = i`: the rule's residual at position
        :math:`i + 1` for :math:`i < \gamma`, :math:`p_{\gamma+1}` for :math:`i = \gamma`.

    Float64 inputs give float64; ``object`` arrays of Fractions give exact Fractions.
    """
    _check_rule(rule)
    x, P, Q = _path_arrays(drafts, p_path, q_path)
    return _path_law(rule, x, P, Q)


# --------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------


def _check_uniforms(uniforms: ArrayLike, gamma: int) -> np.ndarray:
    u = np.asarray(uniforms, dtype=np.float64)
    if u.ndim != 1 or u.size not in (gamma, gamma + 1):
        raise ValueError(
            f"uniforms must have gamma={gamma} entries (decisions) or gamma+1 (decisions and the "
            f"final token's inverse-CDF draw), got shape {u.shape}"
        )
    if not np.all((u >= 0) & (u < 1)):
        raise ValueError("uniforms must lie in [0, 1)")
    return u


def _decide(rule: str, x, P, Q, u: np.ndarray) -> int:
    gamma = x.size
    if rule in ("token", "token-target-resample"):
        for i in range(gamma):
            a = min(1.0, float(P[i, x[i]] / Q[i, x[i]]))
            if not u[i] < a:
                return i
        return gamma
    _, h = _weights_and_h(x, P, Q)
    tau = 0
    for i in range(1, gamma + 1):
        if u[i - 1] < float(h[i]):
            tau = i
    return tau


def accepted_length(
    rule: str, drafts: ArrayLike, p_path: ArrayLike, q_path: ArrayLike, uniforms: ArrayLike
) -> int:
    r"""The accepted length :math:`\tau` for given decision uniforms (deterministic).

    ``uniforms[i-1]`` is position ``i``'s coin. Token: accept while ``u_i < a_i`` and stop at
    the first failure. Block: :math:`\tau = \max\{i : u_i < h_i\}` over *all* positions.
    Comparisons are strict so that ``u ~ U[0, 1)`` accepts with probability exactly ``a_i``
    (``h_i``); the torch twin must use the same convention.
    """
    _check_rule(rule)
    x, P, Q = _path_arrays(drafts, p_path, q_path)
    u = _check_uniforms(uniforms, x.size)
    return _decide(rule, x, P, Q, u)


def _inverse_cdf(law: np.ndarray, u: float) -> int:
    c = np.cumsum(np.asarray(law, dtype=np.float64))
    y = int(np.searchsorted(c, u * c[-1], side="right"))
    # rounding can push past the last positive-mass token; clamp onto it
    last = int(np.flatnonzero(np.asarray(law, dtype=np.float64) > 0)[-1])
    return min(y, last)


def verify_block(
    rule: str,
    drafts: ArrayLike,
    p_path: ArrayLike,
    q_path: ArrayLike,
    rng: np.random.Generator | None = None,
    *,
    uniforms: ArrayLike | None = None,
) -> np.ndarray:
    r"""Verify one drafted block; return the emitted tokens (accepted prefix + one token).

    Steps (``rule="block"``, Sun et al. Algorithm 2; ``"token"`` see module doc):

    1. :math:`w_0 = 1`; for :math:`i = 1..\gamma`: :math:`w_i = \min(w_{i-1} p_i(x_i)/q_i(x_i), 1)`.
    2. :math:`h_i = r_i / (r_i + 1 - w_i)` with
       :math:`r_i = \sum_x \max(w_i p_{i+1}(x) - q_{i+1}(x), 0)`
       for :math:`i < \gamma`; :math:`h_\gamma = w_\gamma`.
    3. :math:`\tau = \max\{i : u_i < h_i\}` (0 if none), scanning all :math:`\gamma` positions.
    4. :math:`Y \sim p_{\gamma+1}` if :math:`\tau = \gamma`, else
       :math:`Y \sim \mathrm{norm}(\max(w_\tau p_{\tau+1} - q_{\tau+1}, 0))`.
    5. Return :math:`(x_1, \dots, x_\tau, Y)`.

    Parameters
    ----------
    rule : {"token", "block"}
    drafts : int[gamma]
    p_path : float[gamma + 1, V]
        ``p_path[i]`` is the target law after ``drafts[:i]``.
    q_path : float[gamma, V]
        ``q_path[i]`` is the draft law ``drafts[i]`` was sampled from.
    rng : numpy Generator
        Source of the decision coins (when ``uniforms`` is None) and of ``Y`` (when
        ``uniforms`` has only ``gamma`` entries).
    uniforms : float[gamma] or float[gamma + 1], optional
        Explicit randomness, for comparing implementations coin for coin: the first
        ``gamma`` are the decision coins; an optional last one draws ``Y`` by inverse CDF
        (``Y = min{y : F(y) > u}``).
    """
    _check_rule(rule)
    x, P, Q = _path_arrays(drafts, p_path, q_path)
    gamma = x.size
    if uniforms is None:
        if not isinstance(rng, np.random.Generator):
            raise ValueError(
                "rng must be a numpy.random.Generator (or pass uniforms of length gamma+1)"
            )
        u = None
    else:
        u = _check_uniforms(uniforms, gamma)
        if u.size == gamma and not isinstance(rng, np.random.Generator):
            raise ValueError(
                "rng must be a numpy.random.Generator to draw the final token "
                "(or pass gamma+1 uniforms)"
            )
    return _verify(rule, x, P.astype(np.float64), Q.astype(np.float64), rng, u)


def _verify(
    rule: str,
    x: np.ndarray,
    P: np.ndarray,
    Q: np.ndarray,
    rng: np.random.Generator | None,
    u: np.ndarray | None,
) -> np.ndarray:
    gamma = x.size
    if u is None:
        u = rng.random(gamma + 1)
    tau = _decide(rule, x, P, Q, u)
    _, nxt = _path_law(rule, x, P, Q)
    y = _inverse_cdf(nxt[tau], float(u[gamma]) if u.size == gamma + 1 else float(rng.random()))
    return np.concatenate([x[:tau], [y]]).astype(np.int64)


def _model_law(lm: LanguageModel, ctx: tuple[int, ...], name: str) -> np.ndarray:
    return _law(lm(ctx), f"{name}({ctx})")


def sample_block(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    rng: np.random.Generator,
    context: Sequence[int] = (),
) -> np.ndarray:
    """Draft ``gamma`` tokens from ``draft`` after ``context``, verify them against ``target``.

    Returns the emitted tokens (accepted prefix + one corrected or bonus token). For
    ``"gumbel"`` the block is drafted by Gumbel-max with noise drawn from ``rng`` and verified
    by :func:`verify_block_gumbel` with the same noise.
    """
    _check_rule(rule, gumbel=True)
    gamma = _check_gamma(gamma)
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy.random.Generator")
    ctx = _check_context(context)
    if _is_gumbel(rule):
        return _sample_block_gumbel(rule, target, draft, gamma, rng, ctx)
    xs: list[int] = []
    q_rows, p_rows = [], []
    for _ in range(gamma):
        q = np.asarray(_model_law(draft, ctx + tuple(xs), "draft"), dtype=np.float64)
        xs.append(_inverse_cdf(q, float(rng.random())))
        q_rows.append(q)
    for i in range(gamma + 1):
        p_rows.append(
            np.asarray(_model_law(target, ctx + tuple(xs[:i]), "target"), dtype=np.float64)
        )
    P, Q = np.stack(p_rows), np.stack(q_rows)
    if P.shape[1] != Q.shape[1]:
        raise ValueError(
            f"vocabulary mismatch: target has {P.shape[1]} tokens, draft has {Q.shape[1]}"
        )
    # model outputs were validated by _model_law; skip re-validating them per block
    return _verify(rule, np.array(xs, dtype=np.int64), P, Q, rng, None)


# --------------------------------------------------------------------------------------
# Drafter-invariant block verification (shared Gumbel noise)
# --------------------------------------------------------------------------------------
#
# Position i of the block (absolute position n + i) has Gumbel noise G_i in R^V, shared by
# the drafter and the verifier (e.g. generated from a common seed and the absolute position,
# so nothing but the drafted tokens is communicated). The drafter emits
# x_i = argmax_v log q_i(v) + G_i(v); the verifier computes y_i = argmax_v log p_i(v) + G_i(v)
# along the drafted path, accepts while x_i == y_i and emits y at the first disagreement
# (y_{gamma+1} as the bonus). Each y_i is an exact sample of p_i given the accepted prefix,
# so the rule is lossless whatever the drafter does, and the verifier never needs q. Per
# position the match probability is c(b) = 1 / sum_j max(p_j / p_b, q_j / q_b) (exponential
# race), which lies between (1 - TV)/(1 + TV) and 1 - TV: drafter invariance costs
# acceptance relative to token verification.


def position_gumbels(seed: int, positions: Sequence[int], vocab_size: int) -> np.ndarray:
    """Standard Gumbel noise rows keyed by (seed, absolute position): ``[len(positions), V]``.

    Drafter and verifier regenerate the same rows from the shared seed, so a drafter-invariant
    block needs no communication beyond the drafted tokens.
    """
    V = _check_vocab(vocab_size)
    rows = [np.random.default_rng([int(seed), int(n)]).gumbel(size=V) for n in positions]
    return np.stack(rows) if rows else np.empty((0, V))


def gumbel_match(p: ArrayLike, q: ArrayLike) -> np.ndarray:
    r"""Per-token Gumbel-max match probabilities :math:`c(b) = P(X = Y = b)`.

    :math:`X = \arg\max \log q + G`, :math:`Y = \arg\max \log p + G` with the same Gumbel
    noise: :math:`c(b) = 1 / \sum_j \max(p_j / p_b, q_j / q_b)` if :math:`p_b q_b > 0`, else 0.
    Works on float64 or exact Fraction laws (both of one kind); ``p`` and ``q`` are validated
    as laws over the same vocabulary.
    """
    P, Q = np.asarray(p), np.asarray(q)
    if _is_exact(P) or _is_exact(Q):
        # an exact law paired with a float one would silently mix Fractions and floats
        P, Q = P.astype(object), Q.astype(object)
    P, Q = _law(P, "p"), _law(Q, "q")
    if P.size != Q.size:
        raise ValueError(
            f"p and q must be laws over the same vocabulary, got {P.size} and {Q.size} "
            "entries; pass one probability per token for both"
        )
    return _gumbel_match(P, Q)


def _gumbel_match(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    exact = _is_exact(p) or _is_exact(q)
    out = []
    for b in range(len(p)):
        if p[b] == 0 or q[b] == 0:
            out.append(Fraction(0) if exact else 0.0)
            continue
        out.append(1 / sum(max(p[j] / p[b], q[j] / q[b]) for j in range(len(p))))
    return np.array(out, dtype=object if exact else np.float64)


def _gumbel_outcomes(rule: str, T: _Cache, D: _Cache, gamma: int, ctx: tuple[int, ...]):
    # the matched prefixes can reach every one of the V**gamma draft paths
    _check_num_paths(T(ctx).size, gamma)
    one = Fraction(1) if _is_exact(T(ctx)) else 1.0

    def rec(pre: tuple[int, ...], mass):
        p = T(ctx + pre)
        k = len(pre)
        if k == gamma:  # bonus position: emit y ~ p
            for b in range(p.size):
                if p[b] != 0:
                    yield pre + (b,), k, mass * p[b]
            return
        q = D(ctx + pre)
        if q.size != p.size:
            raise ValueError(f"vocabulary mismatch: target has {p.size} tokens, draft has {q.size}")
        c = _gumbel_match(p, q)
        # first disagreement at this position: P(Y = b, X != b) = p_b - c_b, or for the
        # broken control P(X = b, Y != b) = q_b - c_b (it emits the draft)
        miss = (q if rule == "gumbel-emit-draft" else p) - c
        for b in range(p.size):
            if miss[b] > 0:
                yield pre + (b,), k, mass * miss[b]
        for b in range(p.size):
            if c[b] > 0:
                yield from rec(pre + (b,), mass * c[b])

    yield from rec((), one)


def verify_block_gumbel(drafts: ArrayLike, p_path: ArrayLike, gumbels: ArrayLike) -> np.ndarray:
    r"""Drafter-invariant block verification: needs only the target laws and the shared noise.

    :math:`y_i = \arg\max_v \log p_i(v) + G_i(v)` for :math:`i = 1..\gamma+1`;
    :math:`\tau = \min\{i : x_i \ne y_i\} - 1` (:math:`\gamma` if none); returns
    :math:`(x_1..x_\tau, y_{\tau+1})`. Lossless for any drafts as long as ``gumbels`` are
    fresh i.i.d. standard Gumbel noise; acceptance is high when the drafts were produced as
    :math:`x_i = \arg\max \log q_i + G_i` with the same noise.

    Parameters
    ----------
    drafts : int[gamma]
    p_path : float[gamma + 1, V]
    gumbels : float[gamma + 1, V]
        The noise rows for the gamma drafted positions and the bonus position.
    """
    P = np.asarray(p_path, dtype=np.float64)
    G = np.asarray(gumbels, dtype=np.float64)
    x = np.asarray(drafts)
    if x.ndim != 1 or x.size < 1 or x.dtype.kind not in "iu":
        raise ValueError(f"drafts must be a non-empty 1-D array of integer token ids, got {x!r}")
    gamma = x.size
    if P.ndim != 2 or P.shape[0] != gamma + 1 or G.shape != P.shape:
        raise ValueError(
            f"{gamma} drafts need p_path and gumbels of shape [{gamma + 1}, V]; "
            f"got {P.shape} and {G.shape}"
        )
    if not np.isfinite(G).all():
        raise ValueError("gumbels must be finite")
    for i in range(gamma + 1):
        as_distribution(P[i], name=f"p_path[{i}]")
    if (x < 0).any() or (x >= P.shape[1]).any():
        raise ValueError(f"drafts has token ids outside [0, {P.shape[1]})")
    return _verify_gumbel("gumbel", x.astype(np.int64), P, G)


def _argmax_gumbel(law: np.ndarray, g: np.ndarray) -> int:
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(law) + g))


def _verify_gumbel(rule: str, x: np.ndarray, P: np.ndarray, G: np.ndarray) -> np.ndarray:
    gamma = x.size
    for i in range(gamma + 1):
        y = _argmax_gumbel(P[i], G[i])
        if i == gamma or y != x[i]:
            if rule == "gumbel-emit-draft" and i < gamma:
                y = int(x[i])
            return np.concatenate([x[:i], [y]]).astype(np.int64)
    raise AssertionError("unreachable")


def _sample_block_gumbel(rule, target, draft, gamma, rng, ctx) -> np.ndarray:
    xs: list[int] = []
    p_rows = []
    G = rng.gumbel(size=(gamma + 1, np.asarray(_model_law(target, ctx, "target")).size))
    for i in range(gamma):
        q = np.asarray(_model_law(draft, ctx + tuple(xs), "draft"), dtype=np.float64)
        if q.size != G.shape[1]:
            raise ValueError(
                f"vocabulary mismatch: target has {G.shape[1]} tokens, draft has {q.size}"
            )
        xs.append(_argmax_gumbel(q, G[i]))
    for i in range(gamma + 1):
        p_rows.append(
            np.asarray(_model_law(target, ctx + tuple(xs[:i]), "target"), dtype=np.float64)
        )
    return _verify_gumbel(rule, np.array(xs, dtype=np.int64), np.stack(p_rows), G)


# --------------------------------------------------------------------------------------
# Exact enumeration over draft blocks
# --------------------------------------------------------------------------------------


class _Cache:
    """Memoised, validated model calls (models are pure functions of the context)."""

    def __init__(self, lm: LanguageModel, name: str):
        self.lm, self.name, self.memo = lm, name, {}

    def __call__(self, ctx: tuple[int, ...]) -> np.ndarray:
        v = self.memo.get(ctx)
        if v is None:
            v = _model_law(self.lm, ctx, self.name)
            self.memo[ctx] = v
        return v


def _check_num_paths(V: int, gamma: int) -> None:
    if V**gamma > MAX_PATHS:
        raise ValueError(
            f"exact enumeration needs {V}**{gamma} = {V**gamma} draft paths, above {MAX_PATHS}; "
            "lower gamma or the vocabulary size"
        )


def path_laws(
    target: LanguageModel, draft: LanguageModel, gamma: int, *, context: Sequence[int] = ()
):
    """Yield ``(path, prob, p_path, q_path)`` for every draft block of positive probability.

    ``prob`` is :math:`Q(x) = \\prod_i q_i(x_i)`; laws are exact if the models return Fractions.
    Paths come in lexicographic order; zero-probability prefixes are pruned.
    """
    gamma = _check_gamma(gamma)
    ctx = _check_context(context)
    T, D = (
        target if isinstance(target, _Cache) else _Cache(target, "target"),
        draft if isinstance(draft, _Cache) else _Cache(draft, "draft"),
    )
    V = T(ctx).size
    if D(ctx).size != V:
        raise ValueError(f"vocabulary mismatch: target has {V} tokens, draft has {D(ctx).size}")
    _check_num_paths(V, gamma)

    def rec(prefix: tuple[int, ...], prob, qs: list):
        if len(prefix) == gamma:
            P = np.stack([T(ctx + prefix[:i]) for i in range(gamma + 1)])
            yield np.array(prefix, dtype=np.int64), prob, P, np.stack(qs)
            return
        q = D(ctx + prefix)
        for t in range(V):
            if q[t] > 0:
                yield from rec(prefix + (t,), prob * q[t], qs + [q])

    one = Fraction(1) if _is_exact(T(ctx)) else 1.0
    yield from rec((), one, [])


def _outcomes(rule: str, T: _Cache, D: _Cache, gamma: int, ctx: tuple[int, ...]):
    """Yield ``(emitted, tau, prob)`` for every outcome of one iteration after ``ctx``."""
    if _is_gumbel(rule):
        yield from _gumbel_outcomes(rule, T, D, gamma, ctx)
        return
    V = T(ctx).size
    for x, qx, P, Q in path_laws(T, D, gamma, context=ctx):
        tau, nxt = _path_law(rule, x, P, Q)
        for t in range(gamma + 1):
            if tau[t] == 0:
                continue
            for y in range(V):
                if nxt[t, y] != 0:
                    yield tuple(int(v) for v in x[:t]) + (y,), t, qx * tau[t] * nxt[t, y]


def accepted_length_law(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
) -> np.ndarray:
    r"""Exact law of the accepted length, ``[gamma+1]``:
    :math:`P(\tau = i) = \sum_x Q(x) P(\tau = i \mid x)`.

    For ``"gumbel"``: :math:`P(\tau \ge i) = \sum_{a^i} \prod_{k \le i} c_k(a_k)` with the
    Gumbel-max match probability :math:`c(b) = 1 / \sum_j \max(p_j/p_b, q_j/q_b)`.
    """
    _check_rule(rule, gumbel=True)
    gamma = _check_gamma(gamma)
    ctx = _check_context(context)
    T, D = _Cache(target, "target"), _Cache(draft, "draft")
    exact = _is_exact(T(ctx))
    total = np.array(
        [Fraction(0) if exact else 0.0] * (gamma + 1), dtype=object if exact else np.float64
    )
    for _, tau, prob in _outcomes(rule, T, D, gamma, ctx):
        total[tau] += prob
    return total


def expected_accepted(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
):
    r"""Exact expected number of accepted draft tokens per iteration, :math:`E[\tau]`.

    This is the paper's convention (10/9, 11/9 on its motivating example).

    Returns a float, or a Fraction when the models return exact Fraction laws.
    """
    law = accepted_length_law(rule, target, draft, gamma, context=context)
    s = sum(i * law[i] for i in range(law.size))
    return s if isinstance(s, Fraction) else float(s)


def block_efficiency(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
):
    r"""Exact expected tokens produced per target call, :math:`E[\tau] + 1`.

    Computed by enumerating the ``V**gamma`` draft blocks (see :func:`accepted_length_law`).
    """
    return expected_accepted(rule, target, draft, gamma, context=context) + 1


def constant_acceptance_efficiency(alpha, gamma: int):
    r"""Token verification's tokens per call when every position accepts w.p. :math:`\alpha`:
    :math:`\sum_{i=0}^{\gamma} \alpha^i = (1 - \alpha^{\gamma+1})/(1 - \alpha)`
    (:math:`\gamma + 1` at :math:`\alpha = 1`).

    ``alpha`` is a probability in [0, 1]: a float, or a :class:`fractions.Fraction` for an
    exact result."""
    gamma = _check_gamma(gamma)
    if (
        isinstance(alpha, (bool, np.bool_))
        or not isinstance(alpha, numbers.Real)
        or not 0 <= alpha <= 1  # also rejects NaN
    ):
        raise ValueError(
            "alpha must be an acceptance probability in [0, 1] (a float or Fraction), "
            f"got {alpha!r}"
        )
    return sum(alpha**i for i in range(gamma + 1))


# --------------------------------------------------------------------------------------
# Block-level LPs
# --------------------------------------------------------------------------------------


def _block_law(
    lm: _Cache, ctx: tuple[int, ...], gamma: int, V: int
) -> tuple[np.ndarray, np.ndarray]:
    paths = np.array(list(itertools.product(range(V), repeat=gamma)), dtype=np.int64)
    probs = np.empty(len(paths))
    for k, path in enumerate(paths):
        pr = 1.0
        for i in range(gamma):
            pr *= float(lm(ctx + tuple(int(t) for t in path[:i]))[path[i]])
            if pr == 0:
                break
        probs[k] = pr
    return paths, probs


def optimal_expected_accepted(
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
    solver: str = "pot",
) -> float:
    r"""Block-level transport bound on accepted draft tokens.

    :math:`\max_{\pi \in \Pi(Q^\gamma, P^\gamma)} E_\pi[\mathrm{LCP}(X, Y)]`.

    :math:`X \sim Q^\gamma` is the draft block, :math:`Y \sim P^\gamma` the target's own
    :math:`\gamma`-token continuation, :math:`\mathrm{LCP}` their longest common prefix;
    solved with :func:`coupling.solve.solve_transport` on the cost :math:`-\mathrm{LCP}`
    (:math:`V^\gamma \times V^\gamma`, so tiny V and gamma only). This is the full-information
    upper bound on accepted draft tokens: it ignores that a verifier can only emit tokens up
    to the first disagreement (then the target continues afresh), so it can exceed
    :func:`full_information_accepted`, the achievable full-information optimum.
    """
    from .solve import solve_transport

    gamma = _check_gamma(gamma)
    ctx = _check_context(context)
    T, D = _Cache(target, "target"), _Cache(draft, "draft")
    V = T(ctx).size
    if V ** (2 * gamma) > 4_000_000:
        raise ValueError(
            f"the block LP has (V**gamma)**2 = {V ** (2 * gamma)} variables; lower V or gamma"
        )
    paths, qx = _block_law(D, ctx, gamma, V)
    _, py = _block_law(T, ctx, gamma, V)
    eq = paths[:, None, :] == paths[None, :, :]
    lcp = np.cumprod(eq, axis=2).sum(axis=2).astype(np.float64)
    _, value, _ = solve_transport(qx, py, -lcp, solver=solver)
    return float(-value)


def optimal_block_efficiency(
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    *,
    context: Sequence[int] = (),
    solver: str = "pot",
) -> float:
    """Tokens per call of the full-information block LP: :func:`optimal_expected_accepted` + 1."""
    return optimal_expected_accepted(target, draft, gamma, context=context, solver=solver) + 1.0


@dataclass(frozen=True)
class VerifierLP:
    r"""The lossless-verifier LP of one model pair, in standard form.

    maximise :math:`c^\top z` subject to :math:`A z = b`, :math:`z \ge 0`, where
    :math:`z_{x,(\tau,y)} = Q(x)\,\pi(\tau, y \mid x)` is the joint probability of drafting
    ``x`` and emitting :math:`(x_1..x_\tau, y)`. Rows of ``A``: one losslessness row per
    string :math:`s \in V^{\gamma+1}`, then one row per path (:math:`\sum_o z_{x,o} = Q(x)`).
    Entries are exact Fractions when the models are exact, so a dual vector can be checked
    exactly (:meth:`dual_bound`).
    """

    rows: np.ndarray
    cols: np.ndarray
    vals: list
    b: list
    c: list
    n_var: int
    paths: list
    outs: list

    def matrix(self):
        import scipy.sparse as sp

        return sp.csr_matrix(
            (np.array([float(v) for v in self.vals]), (self.rows, self.cols)),
            shape=(len(self.b), self.n_var),
        )

    def solve(self) -> tuple[float, np.ndarray, np.ndarray]:
        r"""Solve with HiGHS and check the answer; returns ``(value, z, y)``.

        Float laws whose probabilities span many orders of magnitude give coefficients
        (products of conditionals) down to 1e-30; HiGHS silently drops those below 1e-9 and
        then calls a feasible LP infeasible, or returns an infeasible or suboptimal "optimum".
        So the LP is solved as built first and, while the answer fails the checks below,
        again in exactly equivalent units (``_VERIFIER_ATTEMPTS``): each column multiplied by
        the target probability :math:`P(e)` of its emitted string (which makes every
        losslessness coefficient :math:`P(s)`), each row divided by its largest coefficient
        or a geometric mean, with dual simplex or interior point and presolve off. Every
        solve uses right-hand sides rebalanced so that :math:`\sum_x Q(x) = \sum_s P(s)` in
        float: sums that differ by rounding make the equalities inconsistent.

        Checked on the LP as built, with tolerance ``1e-9``:

        * primal feasibility: ``z >= -tol`` and :math:`\|A z - b\|_\infty \le` tol;
        * ``-tol <= value <= gamma + tol`` (an expected accepted length);
        * optimality: the weak-duality bound from ``y``,
          :math:`b^\top y + \sum_j \max(0, c_j - (A^\top y)_j)\, U_j` with the implied bounds
          :math:`z_j \le U_j = \min(Q(x), P(e))`, exceeds ``value`` by at most tol.

        ``y`` is a dual vector of the maximisation; :meth:`dual_bound` turns it into a rigorous
        bound. It is dual-feasible up to the solver's tolerance when the first solve passes;
        after a rescaled solve it can violate :math:`A^\top y \ge c` on columns of tiny
        :math:`P(e)`, and then :meth:`dual_bound` (which does not use :math:`U`) can be loose.

        Raises
        ------
        SolverError
            If no solve passes the checks (pass exact Fraction models, or round
            probabilities below ~1e-12 to zero).
        """
        import scipy.sparse as sp
        from scipy.optimize import linprog

        from .solve import SolverError

        A = self.matrix()
        b = np.array([float(v) for v in self.b])
        c = np.array([float(v) for v in self.c])
        n_str = len(b) - len(self.paths)
        gamma = max(tau for tau, _ in self.outs)
        mass = _emitted_mass(A, b, n_str)
        caps = np.minimum(mass, np.repeat(b[n_str:], len(self.outs)))
        b_eq = _rebalanced(b, n_str)
        failures = []
        for rows, method, options in _VERIFIER_ATTEMPTS:
            label = method if rows == "as built" else f"{method}, rows scaled by {rows}"
            if rows == "as built":
                row, col = np.ones(A.shape[0]), np.ones(self.n_var)
            else:
                row, col = _verifier_scaling(A, mass, rows)
            res = linprog(
                -(col * c),
                A_eq=sp.diags(row) @ A @ sp.diags(col),
                b_eq=row * b_eq,
                # no upper bounds, not even the implied z_j <= 0 when P(e) = 0: the dual
                # must satisfy A^T y >= c on every column for dual_bound to stay tight
                bounds=(0, None),
                method=method,
                options=options,
            )
            if res.status != 0:
                failures.append(f"{label}: {res.message}")
                continue
            z = col * res.x
            # linprog minimises -c; its equality marginals are d(min)/d(b), so y = -marginals
            # is a dual vector of the maximisation: A^T y >= c, value = b^T y.
            y = row * -np.asarray(res.eqlin.marginals)
            defects = _verifier_defects(A, b, c, z, y, caps, gamma)
            if not defects:
                return float(c @ z), z, y
            failures.append(f"{label}: " + "; ".join(defects))
        raise SolverError(
            "verifier LP: HiGHS gave no solution that passes the checks ("
            + " | ".join(failures)
            + "); the float laws are too ill-conditioned: pass exact Fraction models, or "
            "round probabilities below ~1e-12 to zero"
        )

    def dual_bound(self, y: ArrayLike, *, limit_denominator: int | None = None) -> Fraction:
        r"""A rigorous upper bound on the LP value from any (approximate) dual vector ``y``.

        ``y`` is converted to exact rationals (first rounded to nearby fractions of
        denominator at most ``limit_denominator`` if given, which recovers the exact dual when
        it has small denominators). Then each path row's multiplier is raised by the largest
        violation of :math:`A^\top y \ge c` among that path's columns (each column meets
        exactly one path row, with coefficient 1), which makes ``y`` exactly dual-feasible.
        Weak duality: the LP value is at most :math:`b^\top y`, computed exactly.
        """
        yq = [Fraction(float(v)) for v in np.asarray(y, dtype=np.float64)]
        if limit_denominator is not None:
            yq = [v.limit_denominator(limit_denominator) for v in yq]
        colsum = [Fraction(0)] * self.n_var
        for r, j, v in zip(self.rows.tolist(), self.cols.tolist(), self.vals, strict=True):
            colsum[j] += Fraction(v) * yq[r]
        n_out = len(self.outs)
        n_str = len(self.b) - len(self.paths)
        for k in range(len(self.paths)):
            cols = range(k * n_out, (k + 1) * n_out)
            short = max(Fraction(self.c[j]) - colsum[j] for j in cols)
            if short > 0:
                yq[n_str + k] += short
        return sum(Fraction(bi) * yi for bi, yi in zip(self.b, yq, strict=True))


#: HiGHS's default feasibility tolerances (1e-7) are far above the smallest path masses.
_VERIFIER_TOLS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
#: Solves tried in turn by :meth:`VerifierLP.solve` until one passes its checks: (row scaling,
#: method, options). On peaked float TabularLMs (V <= 3, gamma <= 3) no single one always
#: passes; of 800 such instances (concentration 0.03 to 0.5) all but 2 of the most peaked
#: passed one of these, and those 2 raise SolverError. The first keeps the exact duals
#: (small denominators) that ``proofs/`` recovers from well-conditioned LPs.
_VERIFIER_ATTEMPTS = (
    ("as built", "highs", _VERIFIER_TOLS),
    ("max", "highs-ds", {**_VERIFIER_TOLS, "presolve": False}),
    ("geometric", "highs-ds", {**_VERIFIER_TOLS, "presolve": False}),
    ("geometric", "highs-ipm", {**_VERIFIER_TOLS, "presolve": False}),
    ("max", "highs-ipm", {**_VERIFIER_TOLS, "presolve": False}),
)
#: Absolute tolerance of the checks on a verifier-LP solution (see :meth:`VerifierLP.solve`).
_VERIFIER_LP_TOL = 1e-9


def _emitted_mass(A, b: np.ndarray, n_str: int) -> np.ndarray:
    r"""Per column, the target probability :math:`P(e)` of its emitted string (an upper bound).

    Losslessness entry :math:`(s, j)` is :math:`P(s) / P(e_j)`, so :math:`b_s / A_{sj}` recovers
    :math:`P(e_j)`; the minimum over rows is also a valid bound :math:`z_j \le b_s / A_{sj}`,
    since every term of row ``s`` is non-negative. Columns meeting no such row get ``inf``.
    """
    A = A.tocoo()
    on = A.row < n_str
    mass = np.full(A.shape[1], np.inf)
    with np.errstate(divide="ignore"):
        np.minimum.at(mass, A.col[on], b[A.row[on]] / A.data[on])
    return mass


def _rebalanced(b: np.ndarray, n_str: int) -> np.ndarray:
    """``b`` with the rounding difference of its two total masses moved onto the largest path."""
    out = b.copy()
    k = n_str + int(np.argmax(out[n_str:]))
    out[k] += out[:n_str].sum() - out[n_str:].sum()
    return out


def _verifier_scaling(A, mass: np.ndarray, rows: str) -> tuple[np.ndarray, np.ndarray]:
    """Row and column factors that make the verifier LP's coefficients well scaled.

    Columns are multiplied by :math:`P(e)`, which turns every losslessness entry into
    :math:`P(s)`; then each row is divided by its largest entry (``rows="max"``) or by the
    geometric mean of its largest and smallest (``"geometric"``: path rows span many orders
    of magnitude, and this keeps both ends inside what HiGHS accepts).
    """
    import scipy.sparse as sp

    col = np.where(np.isfinite(mass) & (mass > 0), mass, 1.0)
    M = abs(A @ sp.diags(col)).tocsr()
    M.eliminate_zeros()
    filled = np.diff(M.indptr) > 0
    starts = M.indptr[:-1][filled]
    big = np.ones(M.shape[0])
    big[filled] = np.maximum.reduceat(M.data, starts)
    if rows == "geometric":
        small = np.ones(M.shape[0])
        small[filled] = np.minimum.reduceat(M.data, starts)
        big = np.sqrt(big * small)
    return 1.0 / big, col


def _verifier_defects(
    A,
    b: np.ndarray,
    c: np.ndarray,
    z: np.ndarray,
    y: np.ndarray,
    caps: np.ndarray,
    gamma: int,
    tol: float = _VERIFIER_LP_TOL,
) -> list[str]:
    """What is wrong with a verifier-LP solution ``(z, y)``; empty if it passes every check."""
    if not (np.isfinite(z).all() and np.isfinite(y).all()):
        return ["non-finite solution"]
    defects = []
    if z.min() < -tol:
        defects.append(f"z has entries down to {z.min():.3g} < 0")
    resid = float(np.abs(A @ z - b).max())
    if resid > tol:
        defects.append(f"max |A z - b| = {resid:.3g}")
    value = float(c @ z)
    if not -tol <= value <= gamma + tol:
        defects.append(f"value {value!r} outside [0, gamma = {gamma}]")
    bound = float(b @ y + np.maximum(c - A.T @ y, 0) @ caps)
    if bound - value > tol:
        defects.append(f"not optimal: the dual bound exceeds the value by {bound - value:.3g}")
    return defects


def _tree(lm: _Cache, ctx: tuple[int, ...], depth: int, V: int) -> dict:
    return {
        pre: lm(ctx + pre)
        for d in range(depth + 1)
        for pre in itertools.product(range(V), repeat=d)
    }


def verifier_lp(
    target: LanguageModel, draft: LanguageModel, gamma: int, *, context: Sequence[int] = ()
) -> VerifierLP:
    r"""Build the LP over all lossless one-iteration verifiers of one model pair (tiny V, gamma).

    A verifier maps the drafted block :math:`x` (with full knowledge of both models) to an
    emission :math:`(x_1..x_\tau, y)`, :math:`\tau \in 0..\gamma`, after which the target
    continues. Lossless iff for every :math:`s \in V^{\gamma+1}`:

    .. math:: \sum_x Q(x) \sum_{\tau:\, x^\tau = s^\tau} \pi(\tau, s_{\tau+1} \mid x)\,
              P(s_{\tau+2..\gamma+1} \mid s^{\tau+1}) = P(s)

    (emissions have length :math:`\le \gamma + 1`, so equal laws of :math:`(\gamma+1)`-strings
    make the whole stream lossless). Objective: :math:`E[\tau]`.
    """
    gamma = _check_gamma(gamma)
    ctx = _check_context(context)
    T, D = _Cache(target, "target"), _Cache(draft, "draft")
    V = T(ctx).size
    if V ** (2 * gamma + 1) * (gamma + 1) > 2_000_000:
        raise ValueError(
            f"the verifier LP for V={V}, gamma={gamma} is too large; "
            "it is meant for tiny V and gamma"
        )
    p, q = _tree(T, ctx, gamma, V), _tree(D, ctx, gamma - 1, V)
    exact = _is_exact(T(ctx))
    one = Fraction(1) if exact else 1.0

    def prob(tree: dict, s: tuple[int, ...], start: int = 0):
        pr = one
        for i in range(start, len(s)):
            pr = pr * tree[s[:i]][s[i]]
        return pr

    paths = [x for x in itertools.product(range(V), repeat=gamma) if prob(q, x) != 0]
    outs = [(tau, y) for tau in range(gamma + 1) for y in range(V)]
    strings = list(itertools.product(range(V), repeat=gamma + 1))
    s_index = {s: i for i, s in enumerate(strings)}
    rows, cols, vals, c = [], [], [], []
    b = [prob(p, s) for s in strings]
    for k, x in enumerate(paths):
        for o, (tau, y) in enumerate(outs):
            j = k * len(outs) + o
            c.append(tau * one)
            emitted = x[:tau] + (y,)
            for tail in itertools.product(range(V), repeat=gamma - tau):
                s = emitted + tail
                v = prob(p, s, len(emitted))
                if v != 0:
                    rows.append(s_index[s])
                    cols.append(j)
                    vals.append(v)
            rows.append(len(strings) + k)
            cols.append(j)
            vals.append(one)
        b.append(prob(q, x))
    return VerifierLP(
        np.array(rows, dtype=np.int64),
        np.array(cols, dtype=np.int64),
        vals,
        b,
        c,
        len(paths) * len(outs),
        paths,
        outs,
    )


def full_information_accepted(
    target: LanguageModel, draft: LanguageModel, gamma: int, *, context: Sequence[int] = ()
) -> float:
    r"""Best :math:`E[\tau]` of any lossless verifier that knows both models completely.

    The optimum of :func:`verifier_lp` (HiGHS, checked by :meth:`VerifierLP.solve`, which
    raises :class:`coupling.solve.SolverError` rather than return an unchecked value).
    Unlike the transport bound :func:`optimal_expected_accepted` it is achievable. On every
    instance we have tried it equals block verification's :func:`expected_accepted`
    (``proofs/block_optimality.py`` certifies this with exact dual bounds), in line with
    Thomas & Pal (arXiv:2602.16961), who prove block verification optimal even among
    verifiers that use off-path probabilities.
    """
    return verifier_lp(target, draft, gamma, context=context).solve()[0]


# --------------------------------------------------------------------------------------
# Whole-sequence losslessness
# --------------------------------------------------------------------------------------


def target_law(target: LanguageModel, length: int, *, context: Sequence[int] = ()) -> np.ndarray:
    """Exact law of the target's first ``length`` tokens.

    Returns ``V**length`` probabilities, strings in lexicographic order.
    """
    length = _check_gamma(length, "length")
    ctx = _check_context(context)
    T = _Cache(target, "target")
    V = T(ctx).size
    exact = _is_exact(T(ctx))
    out = np.zeros(V**length, dtype=object if exact else np.float64)
    for k, s in enumerate(itertools.product(range(V), repeat=length)):
        pr = Fraction(1) if exact else 1.0
        for i in range(length):
            pr = pr * T(ctx + s[:i])[s[i]]
            if pr == 0:
                break
        out[k] = pr
    return out


def stream_law(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    length: int,
    *,
    context: Sequence[int] = (),
) -> np.ndarray:
    r"""Exact law of the first ``length`` generated tokens when iterating ``rule``.

    Iterates speculative decoding with exact probabilities: from each generated prefix
    shorter than ``length`` it enumerates every draft block, accepted length and emitted
    token, merging outcomes by prefix (the models depend on the context only), until every
    branch has at least ``length`` tokens. Returns a ``V**length`` array in lexicographic
    order; lossless means it equals :func:`target_law`.
    """
    _check_rule(rule, gumbel=True)
    gamma = _check_gamma(gamma)
    length = _check_gamma(length, "length")
    ctx = _check_context(context)
    T, D = _Cache(target, "target"), _Cache(draft, "draft")
    V = T(ctx).size
    exact = _is_exact(T(ctx))
    one = Fraction(1) if exact else 1.0
    frontier = {(): one}
    done: dict = {}
    while frontier:
        pre = min(frontier, key=len)  # shortest first: every merge into it has already happened
        mass = frontier.pop(pre)
        for emitted, _, prob in _outcomes(rule, T, D, gamma, ctx + pre):
            new = (pre + emitted)[:length]
            bucket = done if len(new) == length else frontier
            bucket[new] = bucket.get(new, 0 * one) + mass * prob
    out = np.zeros(V**length, dtype=object if exact else np.float64)
    for s, w in done.items():
        out[int(np.ravel_multi_index(s, (V,) * length))] = w
    return out


def sample_stream(
    rule: str,
    target: LanguageModel,
    draft: LanguageModel,
    gamma: int,
    length: int,
    rng: np.random.Generator,
    *,
    context: Sequence[int] = (),
) -> np.ndarray:
    """Run speculative decoding until at least ``length`` tokens; return the first ``length``."""
    _check_rule(rule, gumbel=True)
    length = _check_gamma(length, "length")
    ctx = _check_context(context)
    out: list[int] = []
    while len(out) < length:
        out.extend(sample_block(rule, target, draft, gamma, rng, context=ctx + tuple(out)).tolist())
    return np.array(out[:length], dtype=np.int64)


# --------------------------------------------------------------------------------------
# The paper's motivating example
# --------------------------------------------------------------------------------------


def motivating_example(exact: bool = True):
    """Sun et al.'s motivating example, ``(target, draft, gamma)``.

    V = {a, b}, context-independent target (1/3, 2/3) and draft (2/3, 1/3), gamma = 2.

    Returns ``(target, draft, gamma)``; with ``exact=True`` the models return Fraction
    arrays, so :func:`expected_accepted` gives 10/9 (token) and 11/9 (block) exactly.
    """
    if exact:
        p = np.array([Fraction(1, 3), Fraction(2, 3)], dtype=object)
        q = np.array([Fraction(2, 3), Fraction(1, 3)], dtype=object)
    else:
        p, q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])

    def target(ctx=()):
        return p

    def draft(ctx=()):
        return q

    return target, draft, 2
