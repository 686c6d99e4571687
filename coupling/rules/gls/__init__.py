r"""``gls``: Gumbel-max list sampling, drafter-invariant verification of ``k`` drafts (Rowan,
Phan, Khisti, "List-Level Distribution Coupling with Applications to Speculative Decoding and
Lossy Compression", arXiv 2506.05632).

Sources: the reference store holds the paper's abstract, a review and a summary, not its
body. The construction below is the one they describe (``K`` drafts from shared Gumbel /
exponential noise, accept iff a draft equals the target's sample); every formula here is
derived in :mod:`coupling.rules.gls.laws` and checked exactly. The paper's list matching lemma
could not be read, so its statement is not quoted; :func:`list_matching` is the bound derived
here (for ``K = 1`` it is Daliri et al.'s :math:`\sum_i p_i q_i / (p_i + q_i)`).

Algorithm
---------
Shared noise :math:`G_{c,i}`, ``c = 1..K`` columns, i.i.d. standard Gumbel:

* drafts :math:`X_c = \arg\max_i \log q_i + G_{c,i}`: one Gumbel-max sample per column, so
  the drafts are i.i.d. draws from ``q``;
* target :math:`Y = \arg\max_i \log p_i + \max_c G_{c,i}`. The maximum of ``K`` standard
  Gumbels is a standard Gumbel shifted by :math:`\log K`, so :math:`Y \sim p`: **lossless**
  (proved), and ``Y`` is a function of ``p`` and the noise only: **drafter invariance**;
* the step accepts iff ``Y`` is among the drafts; the output is always ``Y``.

Keyed noise (the engine mode; :func:`list_noise`, the torch twin). The columns are built
top-down from the target's own noise :math:`G^*(\text{seed}, t)` (the ``gumbel`` rule's
vector, :func:`coupling.keyed.gumbel_noise`): per token, the maximum over the columns is
:math:`G^*_i + \log K`, the column holding it is uniform, and every other column holds a
standard Gumbel truncated below it. That is exactly the law of ``K`` i.i.d. Gumbel columns
(the maximum of i.i.d. Gumbels is independent of which one attains it, and the others are
truncated below it), so the construction is the paper's, and
:math:`Y = \arg\max_i \log p_i + G^*_i`: under one seed **the stream is the target's own
Gumbel-max stream, for every drafter and every k**, the very stream of ``gumbel``. With
``K = 1`` the single column is :math:`G^*`: ``gls`` is ``gumbel``.

Exact laws (derived, :mod:`coupling.rules.gls.laws`; checked exactly in
``proofs/gls_collision.py`` and the tests): the collision probability
:math:`\alpha = P(Y \in \{X_c\})` and the joint law of (drafts, ``Y``) are closed forms over
the exponential race; ``K = 1`` reduces to the Gumbel coupling's
:math:`\sum_i 1 / \sum_j \max(p_j/p_i, q_j/q_i)`. Along a draft tree the surviving branches
show ``m <= K`` of the columns while the target reads all ``K``; the walk uses the law of
``m`` observed columns of ``K`` (:meth:`Gls.outcomes`). That is the price of invariance along
a tree: a lone surviving branch of ``K = 4`` columns matches far less often than one draft of
one column (0.46 against 0.96 on ``notebooks/08_lossy_and_invariant.ipynb``'s pair). A
verifier reading only the survivors' columns would keep the per-offset collision of ``m``
drafts, but the drafts would then decide which columns the target reads, and its stream would
depend on the drafter; it is not implemented.

Bounds (derived): :math:`\alpha \ge \sum_i K p_i / (K + \varphi(r_i))` (the winning column's
own draft, :func:`own_column`) :math:`\ge \sum_i (1/p_i + 1/(K q_i))^{-1}`
(:func:`list_matching`, from :math:`\varphi(r_i) \le r_i`); above by the i.i.d. optimum
(:func:`coupling.optimal_acceptance`). ``gls >= strict`` (the other drafter-invariant rule)
holds on every seeded law tried (``benchmarks/bench_lossy_invariant.py``), proved for
``K = 1`` only (:mod:`coupling.rules.strict`).

Sampling given the drafts (:func:`verify`, what :func:`coupling.check_sampler` tests): each
column's noise is drawn conditionally on its draft (top-down Gumbel,
:func:`coupling.rules.gumbel.conditional_noise`, ``V + 1`` uniforms a column), then ``Y``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ... import keyed
from ...dist import tuple_law, validate_count, validate_seed
from ...lm import check_length, check_models, check_noise, check_num_paths
from ...lp.cut import optimal_acceptance
from ..base import Rule
from ..common import require_generator
from ..gumbel import conditional_noise
from ..gumbel import verify_block as gumbel_verify_block
from ..walk import survivor_counts, walk_outcomes
from . import laws
from .laws import list_matching, own_column

__all__ = ["acceptance", "joint", "verify", "target_token", "list_from_noise", "list_noise",
           "draft_block",
           "own_column", "list_matching", "Gls", "RULE"]


def acceptance(p: np.ndarray, q: np.ndarray, k: int, *, observed: int | None = None,
               method: str = "auto") -> float:
    """Exact collision probability of ``k`` columns, ``observed`` of them drafted (default all):
    ``P(Y is among the observed drafts)`` (:func:`coupling.rules.gls.laws.collision`)."""
    return laws.acceptance(p, q, k if observed is None else observed, k, method=method)


def joint(p: np.ndarray, q: np.ndarray, k: int, *, observed: int | None = None) -> np.ndarray:
    """Exact law ``[T, V]`` of (the observed drafts, ``Y``), rows in i.i.d.
    :func:`coupling.dist.tuple_law` order (small ``V``)."""
    tuples, _ = tuple_law(q, k if observed is None else observed)
    return laws.joint(p, q, tuples, k)


def target_token(p: np.ndarray, G: np.ndarray) -> int:
    """``argmax log p + max_c G[c]``: what the target alone emits with the noise ``G [K, V]``."""
    with np.errstate(divide="ignore"):
        return int(np.argmax(np.log(p) + G.max(axis=0)))


def list_from_noise(p: np.ndarray, q: np.ndarray, G: np.ndarray) -> tuple[np.ndarray, int]:
    """Deterministic core of one position: noise ``G [K, V]`` -> ``(drafts [K], Y)``, column
    ``c`` drafting ``argmax log q + G[c]``; ``K = 1`` is
    :func:`coupling.rules.gumbel.pair_from_noise`."""
    with np.errstate(divide="ignore"):
        drafts = np.argmax(np.log(q)[None, :] + G, axis=1)
    return drafts, target_token(p, G)


def verify(p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: np.ndarray) -> int:
    """Deterministic core: ``Y`` given the drafts and ``K (V + 1)`` uniforms in (0, 1), column
    ``c``'s noise drawn conditionally on ``argmax(log q + G_c) = drafts[c]`` from
    ``u[c (V + 1): (c + 1)(V + 1)]``."""
    V = p.size
    G = np.stack([conditional_noise(q, int(x), u[c * (V + 1):(c + 1) * (V + 1)])
                  for c, x in enumerate(drafts)])
    return target_token(p, G)


def list_noise(seed: int, position: int, vocab_size: int, k: int) -> np.ndarray:
    """The ``k`` keyed noise columns ``[k, V]`` of absolute position ``position`` (module doc).

    Keys (``STREAM_GUMBEL``, counters by token id ``v``): the target's noise
    :math:`G^*_v` at ``v`` (the ``gumbel`` rule's), the column holding the maximum from the
    uniform at ``V + v``, column ``c``'s fresh Gumbel at ``(2 + c) V + v``. The torch twin's
    :func:`coupling.rules.gls.torch.list_noise` gives the same numbers (to 1e-15 in the
    truncated entries, where the libraries' ``logaddexp`` may round apart).
    """
    V, k = validate_count(vocab_size, "vocab_size"), validate_count(k, "k")
    seed, position = validate_seed(seed), validate_seed(position, "position")
    v = np.arange(V, dtype=np.uint64)
    top = keyed.gumbel_noise(seed, [position], v)[0] + math.log(k)
    who = np.floor(keyed.uniforms(seed, position, keyed.STREAM_GUMBEL, v + np.uint64(V)) * k)
    fresh = keyed.gumbel_noise(seed, [position], (np.arange(2, k + 2, dtype=np.uint64)[:, None]
                                                  * np.uint64(V) + v).ravel()).reshape(k, V)
    G = -np.logaddexp(-top, -fresh)                   # standard Gumbels truncated below top
    G[np.minimum(who, k - 1).astype(np.int64), np.arange(V)] = top
    return G


def draft_block(draft: Callable, context: tuple, gamma: int, noise: np.ndarray) -> np.ndarray:
    """Draft ``K`` branches of ``gamma`` tokens, branch ``c`` by Gumbel-max with column ``c`` of
    ``noise [gamma, K, V]`` along its own prefix: ``[K, gamma]`` int64."""
    K = noise.shape[1]
    out = np.zeros((K, gamma), dtype=np.int64)
    for c in range(K):
        for i in range(gamma):
            law = np.asarray(draft(context + tuple(out[c, :i].tolist())), dtype=np.float64)
            with np.errstate(divide="ignore"):
                out[c, i] = int(np.argmax(np.log(law) + noise[i, c]))
    return out


class _Observed:
    """The step law of the walk for ``K`` columns: ``m`` survivors show ``m`` of them."""

    def __init__(self, K: int):
        self.K = K

    def chain_step(self, p, q):
        stay = laws.collision(p, q, 1, self.K)
        return stay, np.maximum(p - stay, 0.0)

    def joint(self, p, q, m, replacement=True):
        return joint(p, q, self.K, observed=m)

    def draft_law(self, q, m, replacement=True):
        return tuple_law(q, m, replacement=replacement)


class Gls(Rule):
    """Gumbel-max list sampling: ``k`` drafts from ``k`` shared Gumbel columns; the output is
    the target's Gumbel-max token over the columns' maximum."""

    name = "gls"
    twin = "coupling.rules.gls.torch"
    title = "Gumbel-max list sampling (drafter-invariant, k drafts)"
    reference = "Rowan, Phan, Khisti 2025, arXiv 2506.05632 (abstract); laws derived here"
    draft_laws = (True,)
    drafter_invariant = True
    shared_noise = True
    open_uniforms = True
    bound_text = ("in [sum_i (1/p_i + 1/(k q_i))^-1 (list matching, derived), i.i.d. optimum]; "
                  "k = 1: the gumbel rule")

    def n_uniforms(self, k: int, V: int) -> int:
        """Each column's conditional noise and its maximum: ``k (V + 1)`` uniforms."""
        return k * (V + 1)

    def _acceptance(self, p, q, k, replacement):
        return acceptance(p, q, k)

    def _joint(self, p, q, k, replacement):
        return joint(p, q, k)

    def _verify(self, p, q, drafts, u, replacement):
        return verify(p, q, drafts, u)

    def _bound(self, p, q, k, replacement):
        return list_matching(p, q, k), optimal_acceptance(p, q, k)

    def chain_step(self, p, q):
        return _Observed(1).chain_step(p, q)

    def verify_block(self, drafts, p, q, noise, *, replacement: bool = True,
                     validate: bool = True) -> tuple[int, int, int]:
        """Verify one request's ``k`` branches with the target's noise ``noise [gamma + 1, V]``
        (:math:`G^*` of the call's positions, :func:`coupling.keyed.gumbel_noise`): the token
        at each offset is the target's Gumbel-max token, whatever the drafts (module doc).
        ``q`` is only validated (``None`` skips it)."""

        d, P, G = check_noise(drafts, p, q, noise, values=validate)
        return gumbel_verify_block(d, P, G)

    def outcomes(self, target, draft, gamma, context, *, k=1, replacement=True):
        """Exact law of one call: the walk with the step law of ``m`` surviving columns of
        ``k`` (:mod:`coupling.rules.gls.laws`)."""

        self.require(k, replacement)
        check_num_paths(target(context).size, gamma)
        return walk_outcomes(_Observed(k), target, draft, gamma, context, k, True)

    def sample_call(self, target, draft, gamma, rng, context, *, k=1, replacement=True):
        """One call with fresh i.i.d. Gumbel columns from ``rng`` (``[gamma + 1, k, V]``):
        branch ``c`` drafts with column ``c``, the target reads the columns' maximum."""

        gamma, (k, _) = check_length(gamma), self.require(k, replacement)
        target, draft, context = check_models(target, draft, context)
        G = require_generator(rng).gumbel(size=(gamma + 1, k, target(context).size))
        drafts = draft_block(draft, context, gamma, G[:gamma])
        P = np.stack([np.stack([target(context + tuple(drafts[c, :i].tolist()))
                                for i in range(gamma + 1)]) for c in range(k)])
        n, j, y = gumbel_verify_block(drafts, P, G.max(axis=1))
        return [int(t) for t in drafts[j, :n]] + [int(y)]

    def predict(self, drafts, p, q, branch, *, replacement=True):
        """Per-offset acceptance along the chosen branch: ``m`` surviving columns of ``k``."""
        K = int(np.asarray(drafts).shape[0])
        out = []
        for i, m in enumerate(survivor_counts(np.asarray(drafts), int(branch), True)):
            pi, qi = (np.asarray(x[branch, i], dtype=np.float64) for x in (p, q))
            keep = (pi > 0) | (qi > 0)
            out.append(laws.acceptance(pi[keep] / pi[keep].sum(), qi[keep] / qi[keep].sum(),
                                       m, K))
        return out


RULE = Gls()
