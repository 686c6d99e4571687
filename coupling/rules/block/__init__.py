r"""``block``: block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh,
"Block Verification Accelerates Speculative Decoding", arXiv:2403.10444, ICLR 2025,
Algorithm 2).

One call
--------
With context :math:`c`, the draft proposes :math:`X^\gamma = (X_1, \dots, X_\gamma)`,
:math:`X_i \sim q_i := M_s(\cdot \mid c, X^{i-1})`; one target call gives
:math:`p_i := M_b(\cdot \mid c, X^{i-1})` for :math:`i = 1, \dots, \gamma + 1`. A verifier
returns an accepted length :math:`\tau \in \{0, \dots, \gamma\}` and one more token
:math:`Y`; the call emits :math:`(X_1, \dots, X_\tau, Y)`.

Algorithm (what :func:`verify_path` does)
------------------------------------
Running weights :math:`w_0 = 1`, :math:`w_i = \min(w_{i-1}\, p_i(X_i)/q_i(X_i),\, 1)`;
residual masses :math:`r_i = \sum_x \max(w_i\, p_{i+1}(x) - q_{i+1}(x), 0)`; per-position
acceptance probabilities

.. math:: h_i = \frac{r_i}{r_i + 1 - w_i} \quad (1 \le i < \gamma), \qquad h_\gamma = w_\gamma;

draw :math:`\eta_1, \dots, \eta_\gamma \sim U[0, 1)` and set
:math:`\tau = \max\{i \ge 1 : \eta_i < h_i\}` (:math:`\tau = 0` if there is none): it scans
*every* position, it does not stop at the first failure. Then :math:`Y \sim p_{\gamma+1}` if
:math:`\tau = \gamma`, else :math:`Y \sim \mathrm{norm}(\max(w_\tau\, p_{\tau+1} - q_{\tau+1},
0))`. (When :math:`r_i + 1 - w_i = 0`, i.e. :math:`w_i = 1` and :math:`p_{i+1} = q_{i+1}`,
:math:`h_i = 1`; then :math:`w_{i+1} = 1` too, so stopping at :math:`i` has probability 0 and
the undefined residual is never used.)

Key identity (checked exactly in the tests): :math:`P(\tau \ge i \mid X^i) = w_i(X^i)`, and
:math:`w_i = \min_{0 \le j \le i} \prod_{k=j+1}^{i} p_k(X_k)/q_k(X_k)`. It conditions on the
prefix :math:`X^i` only (the stop also reads the later drafts), so :math:`1 + \sum_i w_i`
(:meth:`Block.predict`) is an unbiased per-call estimate of the tokens a call emits, not their
expectation given the whole block (:func:`path_law` has that); and
:math:`w_i \ge \prod_{j \le i} \min(1, p_j/q_j)` term by term, token verification's
:math:`P(\tau \ge i \mid X^i)`: block never accepts less than token verification in
expectation.

Numerical note: in float64, :math:`h_i = r_i / (r_i + 1 - w_i)` is ill-conditioned when both
:math:`r_i` and :math:`1 - w_i` are at rounding level (target and draft laws equal up to
rounding but not exactly); exactly equal laws are handled (:math:`h_i = 1`).

What "optimal" means
--------------------
* **Theorem (Sun et al. 2025, Theorem 2).** Among verifiers that see only the drafted block
  and the conditionals along it, :math:`(X^\gamma, q_1..q_\gamma, p_1..p_{\gamma+1})`, and are
  lossless for every model pair, block verification maximises :math:`E[\tau]` for every pair,
  context and :math:`\gamma`. In particular block :math:`\ge` token (equal for
  :math:`\gamma = 1`).
* **Full information does not help.** :func:`coupling.verifier_lp` is the LP over *all*
  lossless one-call verifiers of one given pair, with full knowledge of both models; its
  optimum equals block verification's value on every instance solved, and
  ``proofs/block_optimality.py`` certifies this with exact rational dual bounds (Thomas & Pal,
  arXiv:2602.16961, prove it in general).
* **The block transport bound is not achievable.** :func:`coupling.optimal_expected_accepted`
  couples the draft block with a target block and maximises their expected common prefix; a
  verifier emits only the agreed prefix plus one token, after which the target continues
  afresh, so the bound is a relaxation. On the paper's motivating example (binary vocabulary,
  target (1/3, 2/3), draft (2/3, 1/3), :math:`\gamma = 2`) token verification accepts 10/9
  tokens per call, block verification 11/9 (the optimum over every lossless verifier, even one
  that knows both models), and the transport bound is 12/9, which no verifier attains.

:data:`PLAIN_RESIDUAL` is a deliberately broken variant (block's accepted length, but the
token residual :math:`\mathrm{norm}(\max(p - q, 0))` at the stop): a negative control.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np

from ...lm import check_path, path_laws
from ..base import Rule
from ..common import categorical, normalise

__all__ = ["weights", "path_law", "decide", "verify_path", "Block", "RULE", "PLAIN_RESIDUAL"]


def _one(P: np.ndarray):
    return Fraction(1) if P.dtype == object else 1.0


def weights(x: np.ndarray, P: np.ndarray, Q: np.ndarray) -> tuple[list, list]:
    r"""``(w, h)``: the running weights :math:`w_0..w_\gamma` and the acceptance probabilities
    :math:`h_1..h_\gamma` (``h[0]`` is 0, unused) of a validated path (float64, or Fractions
    for exact laws)."""
    gamma = x.size
    one = _one(P)
    w, h = [one], [0 * one]
    for i in range(1, gamma + 1):
        t = x[i - 1]
        w_i = min(w[-1] * P[i - 1, t] / Q[i - 1, t], one)
        w.append(w_i)
        if i < gamma:
            r = np.maximum(w_i * P[i] - Q[i], 0 * one).sum()
            den = r + (one - w_i)
            h.append(r / den if den > 0 else one)
        else:
            h.append(w_i)
    return w, h


def path_law(x: np.ndarray, P: np.ndarray, Q: np.ndarray, *,
             plain_residual: bool = False) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact law of one call given the validated drafted path: ``(tau [gamma + 1],
    next [gamma + 1, V])``, :math:`P(\tau = i) = h_i \prod_{j > i} (1 - h_j)` and the law of
    :math:`Y` given :math:`\tau = i`."""
    gamma = x.size
    one = _one(P)
    w, h = weights(x, P, Q)
    tau = [0 * one] * (gamma + 1)
    tail = one
    for i in range(gamma, 0, -1):     # tau is the LAST position whose coin succeeds
        tau[i] = h[i] * tail
        tail = tail * (one - h[i])
    tau[0] = tail
    nxt = [normalise(np.maximum((one if plain_residual else w[i]) * P[i] - Q[i], 0 * one), P[i])
           for i in range(gamma)]
    nxt.append(P[gamma])
    dt = object if P.dtype == object else np.float64
    return np.array(tau, dtype=dt), np.stack(nxt).astype(dt)


def decide(x: np.ndarray, P: np.ndarray, Q: np.ndarray, eta: np.ndarray) -> int:
    r""":math:`\tau = \max\{i : \eta_i < h_i\}` (0 if none), scanning every position; strict
    comparisons, so ``eta ~ U[0, 1)`` passes with probability exactly :math:`h_i`."""
    _, h = weights(x, P, Q)
    tau = 0
    for i in range(1, x.size + 1):
        if eta[i - 1] < float(h[i]):
            tau = i
    return tau


def verify_path(x: np.ndarray, P: np.ndarray, Q: np.ndarray, eta: np.ndarray, u: np.ndarray, *,
           plain_residual: bool = False) -> tuple[int, int]:
    """Deterministic core on a validated float path: ``(tau, y)`` with the coins ``eta [g]``
    and the emitted token drawn by inverse CDF with ``u[tau]`` (``u [g + 1]``)."""
    tau = decide(x, P, Q, eta)
    if tau == x.size:
        return tau, categorical(P[tau], float(u[tau]))
    w, _ = weights(x, P, Q)
    wt = 1.0 if plain_residual else float(w[tau])
    law = normalise(np.maximum(wt * P[tau] - Q[tau], 0.0), P[tau])
    return tau, categorical(law, float(u[tau]))


class Block(Rule):
    """Block verification: judge the drafted block as a whole (module doc)."""

    name = "block"
    twin = "coupling.rules.block.torch"
    greedy_ok = True
    title = "block verification"
    reference = "Sun et al., arXiv:2403.10444, ICLR 2025 (Algorithm 2)"
    max_drafts = 1
    unit = "block"
    bound_text = ">= token verification on every path; optimal among lossless verifiers"
    #: the negative control's bug (:data:`PLAIN_RESIDUAL`)
    plain_residual = False

    def path_law(self, drafts, p_path, q_path) -> tuple[np.ndarray, np.ndarray]:
        """:func:`path_law` on validated inputs (float64, or exact Fractions)."""

        return path_law(*check_path(drafts, p_path, q_path), plain_residual=self.plain_residual)

    def weights(self, drafts, p_path, q_path) -> tuple[np.ndarray, np.ndarray]:
        """``(w [gamma + 1], h [gamma + 1])`` of :func:`weights` as arrays (float64, or
        Fractions for exact laws)."""

        x, P, Q = check_path(drafts, p_path, q_path)
        w, h = weights(x, P, Q)
        dt = object if P.dtype == object else np.float64
        return np.array(w, dtype=dt), np.array(h, dtype=dt)

    def _verify_block(self, drafts, p, q, coins, u, replacement):
        P = np.asarray(p[0], dtype=np.float64)
        Q = np.asarray(q[0], dtype=np.float64)
        tau, y = verify_path(drafts[0], P, Q, coins[:, 0], u,
                             plain_residual=self.plain_residual)
        return tau, 0, y

    def outcomes(self, target: Callable, draft: Callable, gamma: int, context: tuple, *,
                 k: int = 1, replacement: bool = True):

        if k != 1:
            raise ValueError(f"block verification takes one draft branch (k = 1), got k={k}")
        V = target(context).size
        for x, qx, P, Q in path_laws(target, draft, gamma, context=context):
            tau, nxt = path_law(x, P, Q, plain_residual=self.plain_residual)
            for t in range(gamma + 1):
                if tau[t] == 0:
                    continue
                for y in range(V):
                    if nxt[t, y] != 0:
                        yield tuple(int(v) for v in x[:t]) + (y,), t, qx * tau[t] * nxt[t, y]

    def predict(self, drafts, p, q, branch, *, replacement=True) -> list[float]:
        """The weights :math:`w_1..w_\\gamma` of the chosen branch: with
        :meth:`expected_tokens`, an unbiased estimate of the tokens the call emits
        (:math:`P(\\tau \\ge i \\mid X^i) = w_i`)."""
        x = np.asarray(drafts[branch], dtype=np.int64)
        g = x.size
        P = np.asarray(p[branch], dtype=np.float64)
        Q = np.asarray(q[branch], dtype=np.float64)
        ratio = P[np.arange(g), x] / Q[np.arange(g), x]
        w, out = 1.0, []
        for r in ratio.tolist():
            w = min(w * r, 1.0)
            out.append(w)
        return out

    def expected_tokens(self, beta: list[float]) -> float:
        """:math:`1 + \\sum_i w_i` (Sun et al.'s identity :math:`P(\\tau \\ge i) = w_i`)."""
        return 1.0 + float(sum(beta))


class PlainResidual(Block):
    """Negative control: block's accepted length with the token residual at the stop."""

    name = "block_plain_residual"
    title = "broken on purpose: block's accepted length, the token residual"
    lossless = False
    plain_residual = True
    bound_text = "(broken on purpose: output law != p)"

    twin = None  # a negative control has no torch twin


RULE = Block()
#: Deliberately NOT lossless: the harnesses must flag it.
PLAIN_RESIDUAL = PlainResidual()
