r"""What every verification rule is: the :class:`Rule` base class and its shared pieces.

Glossary
--------
``p``
    the target's next-token law, ``[V]`` (float64, or exact Fractions where noted).
``q``
    the draft's law, ``[V]``: the law the drafts were sampled from.
``k``
    the number of drafts judged at once; ``replacement`` says how they were drawn: i.i.d.
    (``True``) or distinct by successive sampling (``False``, e.g. Gumbel-top-k).
uniforms
    every sampler is a deterministic core fed explicit uniforms in ``[0, 1)``: one *coin* per
    draft, then one *draw* for the emitted token (inverse CDF in token order), unless a rule
    says otherwise (:meth:`Rule.n_uniforms`). Batched twins pass keyed uniforms
    (:mod:`coupling.keyed`), tests pass their own, samplers pass ``rng.random``.
gamma, block, tree
    a call verifies ``k`` branches of ``gamma`` drafted tokens each, with the laws along every
    branch: ``drafts [k, gamma]``, ``p [k, gamma + 1, V]`` (the last row is the bonus law),
    ``q [k, gamma, V]``; it emits the accepted prefix of one branch and one more token.

verify, verify_block, step: one name, one meaning in each layer
    * ``Rule.verify(p, q, drafts, u)``: the numpy core of one step fed explicit uniforms;
      ``Rule.verify_block(drafts, p, q, coins, u)``: of one request's tree (a shared-noise
      rule reads ``noise [gamma + 1, V]`` for ``coins, u``); both return what was emitted;
    * in a rule's folder, the module-level ``verify(p, q, ...)`` is the single-step kernel behind
      ``Rule.verify`` (its uniforms as the rule reads them), ``verify_block(drafts, p, q, ...)``
      the tree kernel of a rule that judges trees whole, ``verify_path`` (``block``) one path's;
    * a twin's ``verify(drafts, p, q, *, seeds, positions, ...) -> Verdict``: the batched twin,
      what :func:`coupling.rules.verify` dispatches to;
    * a twin's ``step(p_i, q_i, x, alive, coins, u, i, act)``: the batched single-step kernel
      the walk calls (:func:`coupling.torch_backend.tree.walk_tree`); ``make_step(...)``
      builds it where it depends on a variant or on the call, as :meth:`Rule.make_step` builds
      the numpy walk's.

A rule subclasses :class:`Rule`, declares what it is (``name``, ``reference``, which draft laws
and how many drafts it takes, whether it is lossless or drafter-invariant) and implements the
hooks ``_acceptance``, ``_joint``, ``_verify``, ``_bound`` on validated float64 arrays (a
lossy rule also ``_output_law``, its exact output law). The
base class validates every public call once, draws the uniforms, lifts the single-step rule
to blocks and trees (:mod:`coupling.rules.walk`), and finds the batched torch twin in the
rule's folder (its module ``torch``, imported on first use).

Draft law: the ``k`` drafts a rule verifies are i.i.d. from ``q`` or distinct by successive
sampling (:func:`coupling.dist.tuple_law`) unless the rule overrides ``_draft_law`` and
``_draw_drafts`` (the greedy law: the likeliest tokens of ``q`` and one draw). The exact
checks, the walk's law and the LP oracle (:meth:`Rule.optimum`) all read :meth:`Rule.draft_law`;
``replacement=False`` then says that the drafts are distinct, so that each branch of a draft
tree continues as a chain after its first token. Such a rule's twin module also drafts its law
batched, ``draft_roots(q [B, V], u [B, k]) -> [B, k]`` from explicit uniforms: what a batched
drafter (:mod:`coupling.hf`) draws the first tokens with.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from ..dist import (
    as_distribution,
    check_pair,
    sample_tuple,
    total_mass,
    tuple_law,
    validate_drafts,
    validate_k,
    validate_replacement,
)
from ..keyed import call_uniforms
from ..lm import check_length, check_models, check_num_paths, check_tree, draft_tree
from ..lp.cut import optimal_acceptance
from ..lp.solve import solve_draft_law
from .common import check_uniforms, require_generator
from .walk import survivor_counts, walk, walk_outcomes

__all__ = ["Rule"]


class Rule:
    """A verification rule: a coupling of ``k`` drafts from ``q`` with an output of law ``p``.

    Subclasses set the class attributes and implement the hooks (module doc). Every public
    method validates its inputs (``ValueError``/``TypeError`` naming the argument) and works on
    probability vectors; the hooks receive validated float64 arrays.
    """

    #: registry name (``coupling.rules.RULES[name]``)
    name: ClassVar[str] = ""
    #: one line: what the rule is
    title: ClassVar[str] = ""
    #: the paper(s) it comes from
    reference: ClassVar[str] = ""
    #: the largest number of drafts judged at once (``None``: any)
    max_drafts: ClassVar[int | None] = None
    #: the draft laws it is defined for: ``True`` i.i.d., ``False`` distinct (successive)
    draft_laws: ClassVar[tuple[bool, ...]] = (True, False)
    #: whether its output has exactly the target law; a lossy rule (``False``) reports its exact
    #: output law and distortion (:meth:`output_law`, :meth:`distortion`)
    lossless: ClassVar[bool] = True
    #: whether its output under a fixed seed does not depend on the drafter
    drafter_invariant: ClassVar[bool] = False
    #: whether :meth:`verify_block` takes the target's shared Gumbel noise of the call's
    #: positions, ``noise [gamma + 1, V]`` (:func:`coupling.keyed.gumbel_noise`, the noise its
    #: twin hashes), in place of the coins and draws of :meth:`call_uniforms`; its drafter
    #: then drafts by that noise too: the twin's ``draft_branches(q [B, k, V], seeds [B],
    #: positions [B]) -> [B, k]``
    shared_noise: ClassVar[bool] = False
    #: whether its drafts follow a law of its own (:meth:`draft_law`: ``greedy``'s likeliest
    #: tokens, ``spechub``'s hub pair) rather than i.i.d. or successive draws from ``q``
    own_draft_law: ClassVar[bool] = False
    #: whether the draw of the token emitted at offset ``i`` is keyed by that token's absolute
    #: position, ``U(seed, t + i, STREAM_SAMPLE, 0)`` (the target sampling alone, as a
    #: drafter-invariant rule needs), rather than ``U(seed, t, STREAM_SAMPLE, i)``
    draws_by_position: ClassVar[bool] = False
    #: whether its acceptance at every node is the LP optimum of its own draft law (the
    #: oracle of :meth:`optimum` has nothing left to gain on its drafts)
    attains_optimum: ClassVar[bool] = False
    #: whether its sampler may solve an LP with POT while it verifies (where a closed form of
    #: the plan fails its check), so a timed run imports POT first
    solves_lp: ClassVar[bool] = False
    #: whether it still means something under greedy decoding (``do_sample=False``): with one
    #: branch and point-mass laws it accepts a draft iff it is the target's argmax, which is
    #: greedy decoding token for token (rules that couple *sampled* drafts do not)
    greedy_ok: ClassVar[bool] = False
    #: ``"token"``: a single-step coupling, lifted to blocks and trees by the walk;
    #: ``"block"``: it judges a drafted block as a whole (no single-step form of its own)
    unit: ClassVar[str] = "token"
    #: its guarantee, in words (what :meth:`bound` returns)
    bound_text: ClassVar[str] = ""

    # ------------------------------------------------------------------ what it supports
    @property
    def support_text(self) -> str:
        drafts = "one draft (k = 1)" if self.max_drafts == 1 else (
            "any k >= 1" if self.max_drafts is None else f"k <= {self.max_drafts}")
        laws = {(True, False): "i.i.d. or distinct drafts", (True,): "i.i.d. drafts "
                "(replacement=True)", (False,): "distinct drafts (replacement=False)"}
        tail = "" if self.max_drafts == 1 else f", {laws[self.draft_laws]}"
        return f"{self.name} takes {drafts}{tail}"

    def supports(self, k: int = 1, replacement: bool = True) -> bool:
        """Whether the rule verifies ``k`` drafts (or ``k`` branches) of the given draft law.

        ``ValueError`` for a ``k`` that is not a positive integer or a ``replacement`` that is
        not a bool, as every other method raises on them.
        """
        k, replacement = validate_k(k), validate_replacement(replacement)
        if self.max_drafts is not None and k > self.max_drafts:
            return False
        return k == 1 or replacement in self.draft_laws

    def require(self, k: int, replacement: bool) -> tuple[int, bool]:
        """``(k, replacement)`` validated, or ``ValueError`` saying what the rule takes."""
        if not self.supports(k, replacement):
            raise ValueError(f"rule {self.name!r} does not support k={k}, "
                             f"replacement={replacement}; {self.support_text}")
        return int(k), bool(replacement)

    def prepare(self, p: ArrayLike, q: ArrayLike, k: int,
                replacement: bool) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """Validated ``(p, q, k, replacement)`` for a single-step call."""
        self._single_step()
        k, replacement = self.require(k, replacement)
        pa, qa = check_pair(p, q)
        return pa, qa, *self._drawable(qa, k, replacement)

    def _drawable(self, q: np.ndarray, k: int, replacement: bool) -> tuple[int, bool]:
        """``(k, replacement)`` once ``q`` can give ``k`` distinct drafts if they must be."""
        if not replacement and k > 1 and np.count_nonzero(q) < k:
            raise ValueError(f"cannot draw k={k} distinct tokens without replacement: q has "
                             f"only {np.count_nonzero(q)} token(s) of positive probability; "
                             "lower k or use replacement=True")
        return k, replacement

    # ------------------------------------------------------------------ its draft law
    def draft_law(self, q: ArrayLike, k: int = 1, *,
                  replacement: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The law of the ``k`` drafts the rule verifies, ``(tuples [T, k], probs [T])``: the
        rows of :meth:`joint`, what :meth:`draw_drafts` samples, and the information model of
        :meth:`optimum`. :func:`coupling.dist.tuple_law` (i.i.d. or successive sampling from
        ``q``) unless the rule drafts otherwise."""
        return self._draft_law(*self._prepare_law(q, k, replacement))

    def draw_drafts(self, q: ArrayLike, k: int, replacement: bool,
                    rng: np.random.Generator) -> np.ndarray:
        """``k`` drafts drawn from :meth:`draft_law` with ``rng``, ``[k]`` int64."""
        law = self._prepare_law(q, k, replacement)
        return np.asarray(self._draw_drafts(*law, require_generator(rng)), dtype=np.int64)

    def _prepare_law(self, q: ArrayLike, k: int, replacement: bool) -> tuple[np.ndarray, int,
                                                                              bool]:
        self._single_step()
        k, replacement = self.require(k, replacement)
        qa = as_distribution(q, name="q")
        return qa, *self._drawable(qa, k, replacement)

    def optimum(self, p: ArrayLike, q: ArrayLike, k: int = 1, *, replacement: bool = True,
                solver: str = "cut") -> float:
        """The LP optimum of the rule's information model: the best acceptance of any lossless
        rule fed the drafts of :meth:`draft_law`.

        ``solver="cut"``: its closed form (:meth:`_optimum`; for i.i.d. and successive drafts
        the min-cut scan, :func:`coupling.optimal_acceptance`, at any vocabulary size);
        ``"pot"``, ``"highs"``, ``"cvxpy"``: the LP itself over the enumerated draft law
        (:func:`coupling.lp.solve.solve_draft_law`), the cross-check on small vocabularies.
        """
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        if solver == "cut":
            return min(1.0, max(0.0, float(self._optimum(pa, qa, k, replacement))))
        tuples, probs = self._draft_law(qa, k, replacement)
        return solve_draft_law(pa, tuples, probs, solver=solver).acceptance

    # ------------------------------------------------------------------ single step
    def acceptance(self, p: ArrayLike, q: ArrayLike, k: int = 1, *,
                   replacement: bool = True) -> float:
        """Probability that the output is one of the ``k`` drafts (closed form or exact)."""
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        return min(1.0, max(0.0, float(self._acceptance(pa, qa, k, replacement))))

    def joint(self, p: ArrayLike, q: ArrayLike, k: int = 1, *,
              replacement: bool = True) -> np.ndarray:
        """Exact law ``[T, V]`` of (draft tuple, output), rows in :meth:`draft_law` order."""
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        return self._joint(pa, qa, k, replacement)

    def output_law(self, p: ArrayLike, q: ArrayLike, k: int = 1, *,
                   replacement: bool = True) -> np.ndarray:
        """Exact law ``[V]`` of the output token: ``p`` for a lossless rule (what it promises;
        :func:`coupling.check_rule` holds it to that), a lossy rule's own closed form."""
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        return self._output_law(pa, qa, k, replacement)

    def distortion(self, p: ArrayLike, q: ArrayLike, k: int = 1, *,
                   replacement: bool = True) -> float:
        r"""Exact distortion :math:`\mathrm{TV}(\nu, p)` of the output law :math:`\nu`
        (:meth:`output_law`): 0 for a lossless rule."""
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        return 0.5 * float(np.abs(self._output_law(pa, qa, k, replacement) - pa).sum())

    def bound(self, p: ArrayLike, q: ArrayLike, k: int = 1, *,
              replacement: bool = True) -> tuple[float, float]:
        """``(lower, upper)``: the rule's own guarantee on its acceptance (:attr:`bound_text`)."""
        pa, qa, k, replacement = self.prepare(p, q, k, replacement)
        lo, hi = self._bound(pa, qa, k, replacement)
        return float(lo), float(hi)

    def n_uniforms(self, k: int, V: int) -> int:
        """How many uniforms :meth:`verify` reads: a coin per draft and the emitted-token draw."""
        return k + 1

    #: whether the uniforms must lie strictly inside (0, 1) (e.g. for ``-log(-log u)``)
    open_uniforms: ClassVar[bool] = False

    def verify(self, p: ArrayLike, q: ArrayLike, drafts: ArrayLike, u: ArrayLike, *,
               replacement: bool = True) -> int:
        """The deterministic core: the output token for these drafts and explicit uniforms
        ``u`` (:meth:`n_uniforms` of them)."""
        pa, qa, d, replacement = self._prepare_drafts(p, q, drafts, replacement)
        u = check_uniforms(u, self.n_uniforms(d.size, pa.size), open_interval=self.open_uniforms)
        return int(self._verify(pa, qa, d, u, replacement))

    def sample(self, p: ArrayLike, q: ArrayLike, drafts: ArrayLike, rng: np.random.Generator,
               *, replacement: bool = True, validate: bool = True) -> int:
        """One verification step: :meth:`verify` with uniforms from ``rng``. ``validate=False``
        trusts float64 laws and int64 drafts its caller already checked (a loop that builds
        them, as the conformance checker does), skipping the per-call checks."""
        if validate:
            pa, qa, d, replacement = self._prepare_drafts(p, q, drafts, replacement)
        else:       # the very arrays validation returns: float64, divided by their mass
            self._single_step()
            pa, qa = (np.asarray(a, dtype=np.float64) for a in (p, q))
            pa, qa = pa / total_mass(pa), qa / total_mass(qa)
            d, replacement = np.asarray(drafts, dtype=np.int64), bool(replacement)
        u = self.draw_uniforms(require_generator(rng), self.n_uniforms(d.size, pa.size))
        return int(self._verify(pa, qa, d, u, replacement))

    def call_uniforms(self, seed: int, position: int, gamma: int,
                      k: int) -> tuple[np.ndarray, np.ndarray]:
        """The keyed uniforms of one request's call, ``(coins [gamma, k], u [gamma + 1])`` for
        :meth:`verify_block`: the numbers the rule's torch twin draws for this request
        (:func:`coupling.keyed.call_uniforms` unless the rule keys its own)."""

        return call_uniforms(seed, position, gamma, k)

    def draw_uniforms(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` uniforms from ``rng`` in the rule's interval."""
        u = rng.random(n)
        if self.open_uniforms:   # a zero has probability 2**-53 per draw; keep (0, 1) exact
            u = np.where(u > 0, u, np.nextafter(0.0, 1.0))
        return u

    def _single_step(self) -> None:
        if self.unit != "token":
            raise ValueError(f"rule {self.name!r} judges a drafted block as a whole and has no "
                             "single-step form: use coupling.block_efficiency, "
                             f"RULES[{self.name!r}].verify_block or its torch twin")

    def _prepare_drafts(self, p, q, drafts, replacement):
        self._single_step()
        if drafts is None:
            raise TypeError("drafts must be a 1-D array of drafted token ids, got None")
        pa, qa = check_pair(p, q)
        d = validate_drafts(drafts, qa)
        k, replacement = self.require(d.size, replacement)
        if not replacement and np.unique(d).size != d.size:
            raise ValueError(f"drafts {d.tolist()} repeat a token but replacement=False "
                             "promises distinct drafts; pass replacement=True for i.i.d. drafts")
        return pa, qa, d, replacement

    def chain_step(self, p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One draft along a chain: ``(stay [V], stop [V])``, the probability that the draft
        and the output are both ``y`` (the walk goes on) and that the output is ``y`` but
        the draft is not (the call ends). From the joint by default; rules whose closed form
        also serves exact Fraction laws override it."""
        J = self._joint(p, q, 1, True)
        stay = np.diagonal(J).copy()
        return stay, J.sum(axis=0) - stay

    # ------------------------------------------------------------------ blocks and trees
    def make_step(self, replacement: bool = True) -> Callable:
        """The single-step core on validated laws, as the walk calls it:
        ``(p, q, survivors' drafts [m], uniforms [m + 1]) -> token``."""
        self._single_step()

        def step(p, q, drafts, u):
            return self._verify(p, q, drafts, u, replacement or drafts.size == 1)

        return step

    def verify_block(self, drafts: ArrayLike, p: ArrayLike, q: ArrayLike, coins: ArrayLike,
                     u: ArrayLike, *, replacement: bool = True,
                     validate: bool = True) -> tuple[int, int, int]:
        """Verify one request's ``k`` branches of ``gamma`` drafts with explicit uniforms.

        ``drafts [k, gamma]`` int, ``p [k, gamma + 1, V]``, ``q [k, gamma, V]``,
        ``coins [gamma, k]``, ``u [gamma + 1]`` (:mod:`coupling.rules.walk`). Returns
        ``(accepted, branch, next_token)``. ``validate=False`` skips the value checks (the
        caller vouches for finite, normalised laws and drafts possible under ``q``).
        """

        d, P, Q, C, U = check_tree(drafts, p, q, coins, u, values=validate)
        _, replacement = self.require(d.shape[0], replacement)
        if not replacement and d.shape[0] > 1 and np.unique(d[:, 0]).size != d.shape[0]:
            raise ValueError("replacement=False promises k distinct first tokens, but drafts "
                             "repeats one; pass replacement=True for i.i.d. branches")
        return self._verify_block(d, P, Q, C, U, replacement)

    def _verify_block(self, drafts, p, q, coins, u, replacement) -> tuple[int, int, int]:
        return walk(self.make_step(replacement), drafts, p, q, coins, u)

    def outcomes(self, target: Callable, draft: Callable, gamma: int, context: tuple, *,
                 k: int = 1, replacement: bool = True):
        """Yield ``(emitted, accepted, probability)`` for every outcome of one call on two
        validated, memoised models (:mod:`coupling.sequence`), exactly."""

        self.require(k, replacement)
        check_num_paths(target(context).size, gamma)    # the walk can reach every draft path
        return walk_outcomes(self, target, draft, gamma, context, k, replacement)

    def sample_call(self, target: Callable, draft: Callable, gamma: int,
                    rng: np.random.Generator, context: tuple, *, k: int = 1,
                    replacement: bool = True) -> list[int]:
        """Draft ``k`` branches from ``draft`` after ``context`` (their first tokens from
        :meth:`draw_drafts`), verify them against ``target`` with uniforms from ``rng``; the
        emitted tokens (models are validated and memoised here unless they already are)."""

        gamma, (k, replacement) = check_length(gamma), self.require(k, replacement)
        target, draft, context = check_models(target, draft, context)
        rng = require_generator(rng)
        q0 = np.asarray(draft(context), dtype=np.float64)
        roots = self._draw_drafts(q0, *self._drawable(q0, k, replacement), rng)
        drafts, P, Q = draft_tree(target, draft, gamma, rng, context, k=k,
                                  replacement=replacement, roots=roots)
        coins, u = rng.random((gamma, k)), rng.random(gamma + 1)
        n, j, y = self._verify_block(drafts, P, Q, coins, u, replacement)
        return [int(t) for t in drafts[j, :n]] + [int(y)]

    def predict(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray, branch: int, *,
                replacement: bool = True) -> list[float]:
        """Per-offset acceptance along the chosen branch of a recorded call, ``[gamma]``:
        the rule's single-step acceptance with as many drafts as branches shared the prefix
        there (:func:`coupling.rules.walk.survivor_counts`), on the laws' joint support."""
        counts = survivor_counts(np.asarray(drafts), int(branch), replacement)
        out = []
        for i, m in enumerate(counts):
            ps, qs = _on_support(p[branch, i], q[branch, i])
            repl = replacement or i > 0 or m == 1
            out.append(float(self._acceptance(ps, qs, m, repl)))
        return out

    def expected_tokens(self, beta: list[float]) -> float:
        """Tokens per call predicted from :meth:`predict`'s per-offset acceptances, composed as
        if the offsets were independent: :math:`\\sum_{j=0}^{g} \\prod_{i \\le j} \\beta_i`."""
        out, prod = 1.0, 1.0
        for b in beta:
            prod *= float(b)
            out += prod
        return out

    # ------------------------------------------------------------------ torch twin
    #: the module of its batched torch twin, named in full by each rule (``None``: no twin)
    twin: ClassVar[str | None] = None

    @property
    def torch(self):
        """The batched torch twin, the module :attr:`twin` (imported on first use, so the numpy
        core never needs torch)."""
        if self.twin is None:
            raise ValueError(f"rule {self.name!r} has no torch twin")
        return importlib.import_module(self.twin)

    # ------------------------------------------------------------------ hooks
    def _optimum(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool) -> float:
        """The closed-form optimum of :meth:`draft_law`; a rule that overrides
        :meth:`_draft_law` overrides this too."""

        return optimal_acceptance(p, q, k, replacement=replacement)

    def _draft_law(self, q: np.ndarray, k: int, replacement: bool) -> tuple[np.ndarray,
                                                                          np.ndarray]:
        return tuple_law(q, k, replacement=replacement)

    def _draw_drafts(self, q: np.ndarray, k: int, replacement: bool,
                     rng: np.random.Generator) -> np.ndarray:
        return sample_tuple(q, k, replacement, rng)

    def _acceptance(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool) -> float:
        raise NotImplementedError

    def _joint(self, p: np.ndarray, q: np.ndarray, k: int, replacement: bool) -> np.ndarray:
        raise NotImplementedError

    def _verify(self, p: np.ndarray, q: np.ndarray, drafts: np.ndarray, u: np.ndarray,
                replacement: bool) -> int:
        raise NotImplementedError

    def _bound(self, p: np.ndarray, q: np.ndarray, k: int,
               replacement: bool) -> tuple[float, float]:
        raise NotImplementedError

    def _output_law(self, p: np.ndarray, q: np.ndarray, k: int,
                    replacement: bool) -> np.ndarray:
        # the lossless promise; a lossy rule (lossless = False) overrides it with its exact law
        return p.copy()

    def __repr__(self) -> str:
        return f"<rule {self.name!r}: {self.title}>"


def _on_support(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p, q)`` restricted to the tokens where either has mass, in float64, renormalised
    (tokens outside both carry no mass and change no single-step quantity)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    keep = (p > 0) | (q > 0)
    ps, qs = p[keep], q[keep]
    return ps / math.fsum(ps.tolist()), qs / math.fsum(qs.tolist())
