r"""Three published verification bugs, reproduced as negative controls, with their fixes.

Each reproduction is written from the public description of the bug, in this package's
protocol: ``verify(drafts, p, q, rng)`` on one branch (``k = 1``) samples the mechanism as
described, and ``law(drafts, p, q)`` gives its exact conditional law, so
``check_verifier(..., exact=True, id_space=None)`` measures the exact output distortion (the
reproductions model a vocabulary of exactly ``V`` tokens, as :mod:`.museum` says). ``fixed=True`` is
the published fix. The checker flags every bug and passes every fix.

``vllm_shared_noise`` (vLLM #47386, fixed by #54282)
    The draft token at each position is a Gumbel-max (exponential race) sample of ``q`` and
    verification is speculative sampling (accept iff ``u < p(x)/q(x)``), but the residual
    draw after a rejection reused the *same* noise vector that had drafted the rejected
    token. Given that ``x`` won the draft's race, the other tokens' noise is truncated, most
    for the tokens the draft ranked high, so the residual draw under-weights them. In law:
    with :math:`E_v \sim \mathrm{Exp}(1)` and ``x`` the winner of
    :math:`\arg\min_v E_v / q_v`, write :math:`W = E_x / q_x \sim \mathrm{Exp}(1)` and
    :math:`E_v = q_v W + F_v` with fresh :math:`F_v \sim \mathrm{Exp}(1)` (memorylessness);
    the buggy residual token is :math:`\arg\min_{v: r_v > 0} E_v / r_v` with
    :math:`r = (p - q)_+ / \sum (p - q)_+`. The verifier reconstructs exactly that noise from
    the draft (the checker drafted ``x ~ q``, which has the same joint law). Its law is
    closed form (:func:`shared_noise_residual`). Fix: a fresh noise vector for the residual.
    Shared noise is lossless only under accept-iff-equal verification (the ``gumbel`` rule).

``ascend_block_verify`` (vllm-ascend #7807, fixed by #7808)
    A first block verification compared the product of per-token ratios
    :math:`\pi_i = \prod_{j \le i} \min(1, p_j(x_j)/q_j(x_j))` with a product of uniforms
    :math:`U_i = \prod_{j \le i} u_j`, accepted the longest prefix with :math:`U_i < \pi_i`,
    and drew the next token from the token-level residual :math:`(p - q)_+`. Its accepted
    length has an exact law (:func:`product_test_law`: with :math:`S_i = -\ln U_i` the arrival
    times of a unit Poisson process, :math:`U_i < \pi_i` iff fewer than ``i`` arrivals fall
    before :math:`-\ln \pi_i`). Fix: block verification (Sun et al. 2024, Algorithm 2:
    running weights :math:`w_i = \min(w_{i-1} p_i/q_i, 1)`, stopping probabilities
    :math:`h_i`, residual :math:`(w_i p - q)_+`).

``hf_raw_q`` (transformers #47932)
    Candidate generators sampled their tokens from processed (top-k) draft logits but
    returned the raw logits as ``q``, so speculative sampling divided by a ``q`` the drafts
    did not come from. Here ``q`` is the law the drafts came from; the buggy verifier uses
    the raw law that the processing truncated: where ``q`` has zeros (the tokens top-k
    removed), :math:`q_{\mathrm{raw}} = Z q + (1 - Z)\,\mathrm{uniform}(\{q = 0\})` with ``Z``
    the raw mass top-k kept (``kept_mass``); where ``q`` has none, :math:`q_{\mathrm{raw}} =
    q`. Ratios are inflated by :math:`1/Z` and the residual is built from mass the drafter
    never proposes. Fix: return the law the drafts were sampled from.
"""

from __future__ import annotations

import math

import numpy as np

from .verifiers import chain_law

__all__ = [
    "Reproduction",
    "residual_law",
    "draw",
    "token_tau",
    "block_weights",
    "VllmSharedNoise",
    "AscendBlockVerify",
    "HfRawQ",
    "shared_noise_residual",
    "product_test_law",
    "VLLM_EXAMPLE",
    "vllm_example_law",
    "VLLM_SHARED_NOISE",
    "VLLM_SHARED_NOISE_FIXED",
    "ASCEND_BLOCK_VERIFY",
    "ASCEND_BLOCK_VERIFY_FIXED",
    "HF_RAW_Q",
    "HF_RAW_Q_FIXED",
    "REPRODUCTIONS",
]


def residual_law(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm((p - q)_+)``; ``norm(p)`` when empty (a stop there has probability 0)."""
    d = np.maximum(p - q, 0.0)
    s = d.sum()
    return d / s if s > 0 else p / p.sum()


def draw(law: np.ndarray, rng: np.random.Generator) -> int:
    return int(rng.choice(law.size, p=law / law.sum()))


def token_tau(a: np.ndarray) -> np.ndarray:
    """Accepted-length law of accept-while-``u_i < a_i``: ``[gamma + 1]``."""
    run = np.concatenate([[1.0], np.cumprod(a)])
    return run * np.append(1.0 - a, 1.0)


class Reproduction:
    """Common frame: one branch, a name, the issue it reproduces, ``fixed`` for the fix."""

    issue = ""

    def __init__(self, fixed: bool = False):
        self.fixed = bool(fixed)
        self.name = f"{self.key}{' (fixed)' if fixed else ''}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fixed={self.fixed})"

    @staticmethod
    def _branch(drafts, p, q):
        if drafts.shape[0] != 1:
            raise ValueError("the bug reproductions verify one branch: run the check with k=1")
        return drafts[0], p[0], q[0]

    def law(self, drafts, p, q) -> dict[tuple[int, ...], float]:
        x, P, Q = self._branch(drafts, p, q)
        tau, nxt = self.path_law(x, P, Q)
        return chain_law(x, tau, nxt)


# ----------------------------------------------------------------------- vLLM shared noise
def shared_noise_residual(p: np.ndarray, q: np.ndarray, x: int) -> np.ndarray:
    r"""Law of :math:`\arg\min_{r_v > 0} E_v / r_v` given that ``x`` won
    :math:`\arg\min_v E_v / q_v` (same :math:`E`), ``r = norm((p - q)_+)``, ``q[x] > p[x]``.

    Given :math:`W = w`, :math:`T_v = E_v / r_v = \kappa_v w + \mathrm{Exp}(r_v)` with
    :math:`\kappa_v = q_v / r_v`. Sorting :math:`\kappa` and integrating the race first over
    :math:`t = \tau w`, then over :math:`w` (density :math:`e^{-w}` once ``x`` has won):

    .. math:: P(y \mid x) = r_y \sum_{j:\, y \in A_j} \frac{1}{R_j}\Big(
              \frac{1}{1 + R_j \kappa_{(j)} - K_j} - \frac{1}{1 + R_j \kappa_{(j+1)} - K_j}\Big)

    with :math:`A_j` the ``j`` smallest :math:`\kappa`, :math:`R_j = \sum_{A_j} r`,
    :math:`K_j = \sum_{A_j} q` and the last bracket's second term 0.
    """
    r = residual_law(p, q)
    support = np.flatnonzero(np.maximum(p - q, 0.0) > 0)
    if support.size == 0:
        return r
    kappa = q[support] / r[support]
    order = np.argsort(kappa, kind="stable")
    ks, rs, qs = kappa[order], r[support][order], q[support][order]
    R, K = np.cumsum(rs), np.cumsum(qs)
    upper = np.append(ks[1:], np.inf)
    with np.errstate(divide="ignore"):
        term = (1.0 / (1.0 + R * ks - K) - np.where(np.isinf(upper), 0.0,
                                                     1.0 / (1.0 + R * upper - K))) / R
    # y = order[m] belongs to A_j for every j >= m
    weight = np.cumsum(term[::-1])[::-1]
    out = np.zeros_like(p)
    out[support[order]] = rs * weight
    return out


class VllmSharedNoise(Reproduction):
    """vLLM's residual draw on the rejected draft's own noise; ``fixed``: fresh noise."""

    key = "vllm_shared_noise"
    issue = "vLLM #47386, fixed by #54282"

    def path_law(self, x, P, Q):
        g = x.size
        a = np.minimum(1.0, P[np.arange(g), x] / Q[np.arange(g), x])
        nxt = [residual_law(P[i], Q[i]) if self.fixed else shared_noise_residual(P[i], Q[i], x[i])
               for i in range(g)]
        return token_tau(a), np.vstack(nxt + [P[g]])

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        g, V = x.size, P.shape[-1]
        for i in range(g):
            t = int(x[i])
            # the exponential race that drafted t, conditioned on t winning it
            w = rng.exponential()
            E = Q[i] * w + rng.exponential(size=V)
            E[t] = Q[i, t] * w
            if rng.random() * Q[i, t] < P[i, t]:
                continue
            d = np.maximum(P[i] - Q[i], 0.0)
            if not d.sum() > 0:  # p == q: a rejection has probability 0
                return np.append(x[:i], t)
            noise = rng.exponential(size=V) if self.fixed else E
            with np.errstate(divide="ignore", invalid="ignore"):   # d = 0 entries are masked
                y = int(np.argmin(np.where(d > 0, noise / d, np.inf)))
            return np.append(x[:i], y)
        return np.append(x, draw(P[g], rng))


#: The three-token example: target (0.6, 0.3, 0.1), draft (1/4, 1/4, 1/2).
VLLM_EXAMPLE = (np.array([0.6, 0.3, 0.1]), np.array([0.25, 0.25, 0.5]))


def vllm_example_law(p: np.ndarray | None = None, q: np.ndarray | None = None) -> np.ndarray:
    """Output law of one shared-noise step: ``min(p, q) + sum_x (q - p)_+(x) P(y | x)``.

    On :data:`VLLM_EXAMPLE` it is (0.63, 0.27, 0.10) exactly, against the target's
    (0.6, 0.3, 0.1).
    """
    p, q = VLLM_EXAMPLE if p is None else (np.asarray(p, float), np.asarray(q, float))
    out = np.minimum(p, q)
    for x in np.flatnonzero(q > p):
        out = out + (q[x] - p[x]) * shared_noise_residual(p, q, int(x))
    return out


# ------------------------------------------------------------------ vllm-ascend product test
def _poisson_step(dist: np.ndarray, mu: float) -> np.ndarray:
    """Add a Poisson(``mu``) count to a count law capped at ``dist.size - 1``."""
    cap = dist.size - 1
    n = np.arange(cap + 1)
    pmf = np.exp(-mu + n * math.log(mu) - np.array([math.lgamma(i + 1) for i in n])) \
        if mu > 0 else (n == 0).astype(float)
    out = np.zeros_like(dist)
    for c, w in enumerate(dist):
        if w == 0:
            continue
        out[c:cap] += w * pmf[: cap - c]
        out[cap] += w * max(0.0, 1.0 - pmf[: cap - c].sum())
    return out


def product_test_law(a: np.ndarray) -> np.ndarray:
    r"""Law of :math:`\tau = \max\{i : \prod_{j \le i} u_j < \prod_{j \le i} a_j\}` (0 if none).

    :math:`S_i = -\ln \prod_{j \le i} u_j` are the arrival times of a unit Poisson process
    ``N`` and :math:`c_i = -\ln \prod_{j \le i} a_j` is non-decreasing, so
    :math:`\tau = i` iff :math:`N(c_i) \le i - 1` and :math:`N(c_j) \ge j` for all
    :math:`j > i`: a product of independent Poisson increments, summed by a small dynamic
    program. Positions past a zero ratio can never be accepted.
    """
    a = np.asarray(a, dtype=np.float64)
    g = a.size
    pi = np.cumprod(a)
    live = int(np.count_nonzero(pi > 0))
    c = np.concatenate([[0.0], -np.log(pi[:live])])
    tau = np.zeros(g + 1)
    for i in range(live + 1):
        dist = np.zeros(live + 1)
        dist[0] = 1.0
        for j in range(1, live + 1):
            dist = _poisson_step(dist, c[j] - c[j - 1])
            n = np.arange(live + 1)
            if j == i:
                dist = np.where(n <= i - 1, dist, 0.0)
            elif j > i:
                dist = np.where(n >= j, dist, 0.0)
        tau[i] = dist.sum()
    return tau


def block_weights(x, P, Q):
    """Sun et al.'s running weights ``w [gamma + 1]`` and stopping probabilities ``h``."""
    g = x.size
    w = np.ones(g + 1)
    for i in range(g):
        w[i + 1] = min(w[i] * P[i, x[i]] / Q[i, x[i]], 1.0)
    h = np.empty(g + 1)
    h[g] = w[g]
    for i in range(1, g):
        s = np.maximum(w[i] * P[i] - Q[i], 0.0).sum()
        h[i] = s / (s + 1.0 - w[i]) if s + 1.0 - w[i] > 0 else 1.0
    return w, h


class AscendBlockVerify(Reproduction):
    """vllm-ascend's first block verification; ``fixed``: Sun et al.'s block verification."""

    key = "ascend_block_verify"
    issue = "vllm-ascend #7807, fixed by #7808"

    def path_law(self, x, P, Q):
        g = x.size
        if not self.fixed:
            a = np.minimum(1.0, P[np.arange(g), x] / Q[np.arange(g), x])
            return product_test_law(a), np.vstack([residual_law(P[i], Q[i]) for i in range(g)]
                                                  + [P[g]])
        w, h = block_weights(x, P, Q)
        tau = np.empty(g + 1)
        tail = 1.0
        for i in range(g, 0, -1):  # tau is the last position whose coin succeeds
            tau[i] = h[i] * tail
            tail *= 1.0 - h[i]
        tau[0] = tail
        # w_i = 0 gives h_i = 0: a stop there has probability 0 and its law is never read
        return tau, np.vstack([residual_law(w[i] * P[i], Q[i]) if w[i] > 0 else P[i]
                               for i in range(g)] + [P[g]])

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        g = x.size
        u = rng.random(g)
        if self.fixed:
            w, h = block_weights(x, P, Q)
            hits = np.flatnonzero(u < h[1:])
            n = int(hits[-1]) + 1 if hits.size else 0
            law = P[g] if n == g else residual_law(w[n] * P[n], Q[n])
        else:
            a = np.minimum(1.0, P[np.arange(g), x] / Q[np.arange(g), x])
            hits = np.flatnonzero(np.cumprod(u) < np.cumprod(a))
            n = int(hits[-1]) + 1 if hits.size else 0
            law = P[g] if n == g else residual_law(P[n], Q[n])
        return np.append(x[:n], draw(law, rng))


# ------------------------------------------------------------------------ HF raw logits as q
class HfRawQ(Reproduction):
    """Speculative sampling told the raw draft law instead of the top-k law it sampled."""

    key = "hf_raw_q"
    issue = "transformers #47932"

    def __init__(self, fixed: bool = False, kept_mass: float = 0.8):
        if not 0.0 < kept_mass <= 1.0:
            raise ValueError(f"kept_mass must lie in (0, 1], got {kept_mass!r}")
        super().__init__(fixed)
        self.kept_mass = float(kept_mass)

    def told(self, q: np.ndarray) -> np.ndarray:
        """The law the verifier is given: ``q`` when fixed, else the raw law (module doc)."""
        removed = q == 0
        if self.fixed or not removed.any():
            return q
        return self.kept_mass * q + (1.0 - self.kept_mass) * removed / removed.sum()

    def path_law(self, x, P, Q):
        g = x.size
        R = np.vstack([self.told(Q[i]) for i in range(g)])
        a = np.minimum(1.0, P[np.arange(g), x] / R[np.arange(g), x])
        return token_tau(a), np.vstack([residual_law(P[i], R[i]) for i in range(g)] + [P[g]])

    def __call__(self, drafts, p, q, rng):
        x, P, Q = self._branch(drafts, p, q)
        g = x.size
        for i in range(g):
            R = self.told(Q[i])
            if not rng.random() * R[x[i]] < P[i, x[i]]:
                return np.append(x[:i], draw(residual_law(P[i], R), rng))
        return np.append(x, draw(P[g], rng))


VLLM_SHARED_NOISE = VllmSharedNoise()
VLLM_SHARED_NOISE_FIXED = VllmSharedNoise(fixed=True)
ASCEND_BLOCK_VERIFY = AscendBlockVerify()
ASCEND_BLOCK_VERIFY_FIXED = AscendBlockVerify(fixed=True)
HF_RAW_Q = HfRawQ()
HF_RAW_Q_FIXED = HfRawQ(fixed=True)

#: name -> (bug, fix)
REPRODUCTIONS = {
    "vllm_shared_noise": (VLLM_SHARED_NOISE, VLLM_SHARED_NOISE_FIXED),
    "ascend_block_verify": (ASCEND_BLOCK_VERIFY, ASCEND_BLOCK_VERIFY_FIXED),
    "hf_raw_q": (HF_RAW_Q, HF_RAW_Q_FIXED),
}
