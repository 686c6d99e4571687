"""Speculative generation on real Hugging Face causal LMs, gpt-fast style.

One request (batch of one sequence); ``k`` draft branches run as a batch of ``k`` through the draft,
and through the target as one row with tree attention (or, for models that do not take a custom
attention mask, as a batch of ``k``). Four short functions do the work:

``prefill``      feed the prompt (all but its last token) into a model's KV cache.
``draft_block``  sample ``k`` branches of ``gamma`` tokens from the draft (k i.i.d. branches, or
                 with ``replacement=False`` k *distinct* first tokens by successive sampling,
                 each branch then a single chain), recording the exact laws ``q`` they came from.
``verify``       one target call on ``[pending tokens, branch tokens]`` for all k branches
                 (one row ``[pending, branch_0, .., branch_{k-1}]`` whose tokens see only their
                 own branch, :meth:`CachedLM.forward_tree`; or a batch of k rows), giving ``p``
                 along every branch; then the batched rule from :mod:`coupling.torch_backend`
                 decides accepted length, branch and next token.
``generate``     the loop; after each step both KV caches are rolled back (``DynamicCache.crop``
                 with a negative count) to the longest prefix that is still the committed text,
                 and the chosen branch is selected (its cache entries moved next to the prefix,
                 :meth:`CachedLM.select_branch`; or ``batch_select_indices`` on k rows).

Drafters: :class:`ModelDrafter` (any causal LM with the target's tokenizer),
:class:`coupling.llm.feature_draft.FeatureDrafter` (EAGLE-style: reads the target's final
hidden states, which the target's :class:`CachedLM` keeps, cropped and branch-selected with its
cache, when the drafter sets ``needs_target_features``), :class:`NgramDrafter` (prompt lookup)
and :class:`NoDrafter`; :func:`sample_chain` holds the sampling they share.

Cache invariant: a :class:`CachedLM` knows exactly which tokens its cache holds
(``self.tokens``); :meth:`CachedLM.sync` crops it to the longest common prefix with the committed
sequence (keeping at least one token to feed, whose logits give the next law). Correctness of a
rollback therefore never depends on off-by-one bookkeeping in the loop, and it is tested against a
fresh recomputation (``tests/test_llm_real.py``).

Attention. A verification call feeds several tokens under a mask. With grouped-query heads,
transformers' ``sdpa`` then copies the KV cache to every query head, which a 1-token decoding
call never does. On a CPU, ``models.use_grouped_sdpa(model)`` removes the copy, with
bit-identical logits; ``models.load_target`` applies it. Call it on any other target you
bring.

Laws. ``q`` and ``p`` are produced by :func:`coupling.llm.sampling.probs` with the *same*
:class:`SamplingConfig` (temperature, top-k, top-p) in float32: ``q`` is the law drafts were
really sampled from, ``p`` the law plain sampling uses. A point-mass drafter (n-gram) has
``q = one_hot(token)``.

Randomness: drafts use a ``torch.Generator`` seeded with ``seed``; the rules draw their uniforms
from the backend's per-request generators keyed by ``(seed, absolute position)``. The
autoregressive sampler in ``mode="gumbel"`` uses the backend's Gumbel noise at ``(seed, position)``
so that, under one seed, ``gumbel`` verification and plain sampling emit the same stream.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from coupling.rules import RULES

from .models import GROUPED_SDPA
from .rules_adapter import MULTI_DRAFT_RULES
from .sampling import SamplingConfig, probs


def _count(value, name: str, low: int) -> int:
    """``value`` as an int >= ``low``, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    return int(value)


def _check_confidence(confidence: float | None, name: str = "draft_confidence") -> None:
    if confidence is not None and not 0.0 <= confidence <= 1.0:   # NaN fails too
        raise ValueError(f"{name}={confidence} must lie in [0, 1] (a bound on the draft's "
                         "largest first-token probability), or be None")


def _check_prompt(prompt: list[int], vocab_size: int | None) -> list[int]:
    """The prompt as a non-empty list of token ids inside the model's vocabulary."""
    ids = list(prompt)
    if not ids:
        raise ValueError("prompt must hold at least one token id")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, (int, np.integer))
           or t < 0 or (vocab_size is not None and t >= vocab_size)]
    if bad:
        raise ValueError(f"prompt has token ids outside [0, {vocab_size}) or not integers: "
                         f"{bad[:5]}; tokenize with the model's own tokenizer")
    return ids


def _check_seed(seed: int) -> int:
    # keyed uniforms and torch tensors hold seeds as int64
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not -2**63 <= seed < 2**63:
        raise ValueError(f"seed={seed!r} must be an integer in [-2**63, 2**63)")
    return int(seed)


def _vocab_size(model) -> int | None:
    return getattr(getattr(model, "config", None), "vocab_size", None)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists.

    Bisects on slice equality (compared in C) rather than walking the lists in Python: a
    step's caches agree with the committed text on all but the last few of some hundreds of
    tokens, and the walk cost 0.1-0.2 ms per call.
    """
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n                 # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class CachedLM:
    """A causal LM plus a ``DynamicCache`` that knows which tokens it holds.

    ``tokens`` is a list of token lists, one per batch row (1 row except between
    :func:`draft_block` / :func:`verify` and :meth:`select`).
    """

    def __init__(self, model) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()
        self.tokens: list[list[int]] = [[]]
        self.calls = 0
        self.seconds = 0.0
        # final-normed hidden states [rows, len(tokens), d], kept only for feature drafters
        self.keep_features = False
        self.feats: torch.Tensor | None = None
        # (cache length before the branches, branch tokens) between forward_tree / select_branch
        self.tree: tuple[int, list[list[int]]] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.tokens = [[]]
        self.feats = None
        self.tree = None

    def sync(self, seq: list[int]) -> list[int]:
        """Crop the cache to the longest common prefix with ``seq``; return the tokens to feed.

        Keeps at most ``len(seq) - 1`` tokens so that at least one token is fed and the logits
        of the next position come out of the next forward pass.
        """
        if len(self.tokens) != 1 or self.tree is not None:
            raise RuntimeError("sync needs a single-row cache; call select() / select_branch() "
                               "after a branch step")
        held = self.tokens[0]
        n = common_prefix(held, seq[: len(seq) - 1])
        drop = len(held) - n
        if drop:
            self.cache.crop(-drop)  # transformers 5.x: a negative count of tokens to remove
            self.tokens = [held[:n]]
            if self.feats is not None:
                self.feats = self.feats[:, :n]
        return seq[n:]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
        """Append ``ids`` [rows, n] to the cache; return logits [rows, n, V] (model dtype), or
        [rows, 1, V] of the last position only with ``last_only`` (the head is skipped on the
        others: a fifth of SmolLM2's weights, and most of a one-layer draft's)."""
        if self.tree is not None:
            raise RuntimeError("a forward_tree call is pending; call select_branch() first")
        if ids.shape[0] != len(self.tokens):
            raise ValueError(f"ids has {ids.shape[0]} rows but the cache holds {len(self.tokens)}")
        logits = self._call(ids, logits_to_keep=1) if last_only else self._call(ids)
        self.tokens = [held + row for held, row in zip(self.tokens, ids.tolist(), strict=True)]
        return logits

    def _call(self, ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """One timed model call appending ``ids`` [rows, n] to the cache (``kwargs``: a custom
        mask and positions); keeps the final hidden states when ``keep_features``. Returns the
        logits; the token record is the caller's to update."""
        t0 = time.perf_counter()
        out = self.model(input_ids=ids.to(self.device), cache=self.cache, use_cache=True,
                         output_hidden_states=self.keep_features, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        if self.keep_features:
            h = out.hidden_states[-1]                   # final-normed: logits = lm_head(h)
            self.feats = h if self.feats is None or self.feats.shape[1] == 0 else \
                torch.cat([self.feats, h], 1)
            if self.feats.shape[1] != len(self.tokens[0]) + ids.shape[1]:
                raise RuntimeError("feature store out of step with the cache; call reset()")
        return out.logits

    def expand(self, rows: int) -> None:
        """Repeat the single cached row ``rows`` times (branches share the committed prefix)."""
        if rows == len(self.tokens):
            return
        if len(self.tokens) != 1:
            raise RuntimeError("expand needs a single-row cache")
        if self.cache.get_seq_length() > 0:
            self.cache.batch_repeat_interleave(rows)
        if self.feats is not None:
            self.feats = self.feats.expand(rows, -1, -1).contiguous()
        self.tokens = [list(self.tokens[0]) for _ in range(rows)]

    @torch.no_grad()
    def forward_tree(self, feed: list[int],
                     drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score k draft branches in one call of a single row, by tree attention.

        The row is ``[feed, branch_0, ..., branch_{k-1}]`` (``1 + k * g`` tokens when one token
        is fed). A branch's token attends to the cached prefix, to ``feed`` and to its own
        branch's earlier tokens, and takes the position it would have in its branch alone, so
        its logits are those of the sequence ``prefix + feed + branch_j``:

            mask[a, b] = 1  iff  b is cached, or b <= a within feed, or a in branch j and
                                 (b in feed, or b in branch j with b <= a)

        Returns ``(logits, rows)``: logits [1 + k * g, V] of the last fed token and of the
        branch tokens in row order, and int64 rows [k, g + 1] with ``logits[rows[j]]`` branch
        j's logits (row 0, the last fed token's, is common to all branches, so laws computed
        on ``logits`` cost 1 + k * g rows instead of k * (g + 1)).

        Why: on a CPU a batch of k rows costs about k times the attention and a repeated KV
        cache, while one row of ``1 + k * g`` tokens costs about what a ``1 + g``-token call
        does (``benchmarks/bench_tree.py``). Call :meth:`select_branch` before the next call.
        """
        if len(self.tokens) != 1 or self.tree is not None:
            raise RuntimeError("forward_tree needs a single-row cache with no branch pending")
        k, g = drafts.shape
        n0, f = len(self.tokens[0]), len(feed)
        dev = self.device
        pos = torch.cat([torch.arange(n0, n0 + f), torch.arange(n0 + f, n0 + f + g).repeat(k)])
        q_len = f + k * g
        among_new = torch.zeros(q_len, q_len, dtype=torch.bool)
        among_new[:, :f] = True                                   # everyone sees feed ...
        among_new[:f, :f] = torch.ones(f, f, dtype=torch.bool).tril()    # ... causally
        among_new[f:, f:] = torch.block_diag(*[torch.ones(g, g, dtype=torch.bool).tril()] * k)
        allowed = torch.cat([torch.ones(q_len, n0, dtype=torch.bool), among_new], 1)
        dtype = next(self.model.parameters()).dtype
        # additive float mask: read the same way by the sdpa and eager attention paths
        mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed,
                                                                    torch.finfo(dtype).min)
        ids = torch.cat([torch.tensor(feed, dtype=torch.long), drafts.reshape(-1).cpu()])[None]
        logits = self._call(ids, position_ids=pos[None].to(dev),
                            attention_mask=mask[None, None].to(dev))
        self.tree = (n0 + f, drafts.tolist())
        self.tokens = [self.tokens[0] + feed]
        rows = torch.cat([torch.zeros(k, 1, dtype=torch.long),
                          1 + torch.arange(k * g).reshape(k, g)], 1)            # [k, g + 1]
        return logits[0, f - 1:], rows.to(dev)

    def select_branch(self, branch: int, keep: int | None = None) -> None:
        """After :meth:`forward_tree`: keep the chosen branch's first ``keep`` entries (all g
        by default), contiguous after feed; the rest of the tree is dropped.

        ``keep`` = the accepted length saves copying entries the next :meth:`sync` would crop
        (a rejected first token keeps none: no copy at all). Each layer's copy is one
        ``copy_`` between disjoint slices (a later branch starts after the first one ends).
        """
        if self.tree is None:
            raise RuntimeError("select_branch needs a pending forward_tree call")
        base, branches = self.tree
        k, g = len(branches), len(branches[0])
        if not 0 <= branch < k:
            raise ValueError(f"branch={branch} must be in [0, {k})")
        keep = g if keep is None else keep
        if not 0 <= keep <= g:
            raise ValueError(f"keep={keep} must be in [0, {g}]")
        src = base + branch * g
        if branch and keep:
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values):
                    t.narrow(2, base, keep).copy_(t.narrow(2, src, keep))
            if self.feats is not None:
                self.feats.narrow(1, base, keep).copy_(self.feats.narrow(1, src, keep))
        drop = k * g - keep
        if drop:
            self.cache.crop(-drop)
            if self.feats is not None:
                self.feats = self.feats[:, :base + keep]
        self.tokens = [self.tokens[0] + branches[branch][:keep]]
        self.tree = None

    def select(self, row: int) -> None:
        """Keep only batch row ``row`` of the cache (the branch the verifier chose)."""
        if len(self.tokens) == 1:
            return
        self.cache.batch_select_indices(torch.tensor([row], device=self.device))
        if self.feats is not None:
            self.feats = self.feats[row:row + 1]
        self.tokens = [self.tokens[row]]


def prefill(lm: CachedLM, prompt: list[int], *, reuse: bool = False) -> None:
    """Put ``prompt[:-1]`` in the cache (the last prompt token is fed with the first step).

    ``reuse``: keep what the cache already holds of ``prompt[:-1]`` (its longest common prefix)
    and feed only the rest, so that many generations from one prompt pay its prefill once.
    The kept keys and values are those an earlier call computed; with the whole prompt kept
    they are bit for bit a fresh prefill's. Off by default: a timed run pays its prefill.
    """
    prompt = _check_prompt(prompt, _vocab_size(lm.model))
    keeps_feats = not lm.keep_features or (
        lm.feats is not None and lm.feats.shape[1] == len(lm.tokens[0]))
    if reuse and len(lm.tokens) == 1 and lm.tree is None and keeps_feats:
        if not lm.keep_features:
            lm.feats = None
        rest = lm.sync(prompt)[:-1]
    else:
        lm.reset()
        rest = prompt[:-1]
    if rest:
        lm.forward(torch.tensor([rest]), last_only=True)


class Drafter(Protocol):
    name: str
    #: the tokenizer's vocabulary size (``generate`` checks it against the target's)
    vocab_size: int | None

    def reset(self, prompt: list[int]) -> None: ...

    def propose(self, seq: list[int], gamma: int, k: int, cfg: SamplingConfig,
                gen: torch.Generator, *, distinct_first: bool = False,
                gumbel: tuple[int, int] | None = None,
                confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return drafts int64 [k, g] and their laws float32 [k, g, V] (g <= gamma, may be 0).

        ``confidence``: draft one token, not gamma, when the first law is flatter than that
        (see :func:`sample_chain`)."""
        ...

    def accept(self, branch: int) -> None: ...


class ModelDrafter:
    """Draft with a causal LM sharing the target's tokenizer (batch of k branches)."""

    def __init__(self, model, name: str = "trained") -> None:
        self.lm = CachedLM(model)
        self.name = name
        self.vocab_size = _vocab_size(model)

    def reset(self, prompt: list[int]) -> None:
        prefill(self.lm, prompt)

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, gumbel=None,
                confidence=None):
        return draft_block(self.lm, seq, gamma, k, cfg, gen, distinct_first=distinct_first,
                           gumbel=gumbel, confidence=confidence)

    def accept(self, branch: int) -> None:
        self.lm.select(branch)

    @property
    def calls(self) -> int:
        return self.lm.calls

    @property
    def seconds(self) -> float:
        return self.lm.seconds


class NgramDrafter:
    """Prompt lookup: continue the latest earlier occurrence of the last ``n`` tokens.

    Tries n = ``max_n`` down to ``min_n``; proposes up to ``gamma`` tokens; q is a point mass.
    With no match it proposes nothing and the step is a plain target step.
    """

    def __init__(self, vocab_size: int, max_n: int = 3, min_n: int = 1, name: str = "ngram"):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.vocab_size, self.max_n, self.min_n, self.name = vocab_size, max_n, min_n, name

    def reset(self, prompt: list[int]) -> None:
        pass

    def lookup(self, seq: list[int], gamma: int) -> list[int]:
        arr = np.asarray(seq)
        for n in range(min(self.max_n, len(seq) - 1), self.min_n - 1, -1):
            tail = arr[-n:]
            # latest earlier occurrence whose continuation exists
            for start in range(len(seq) - n - 1, -1, -1):
                if np.array_equal(arr[start:start + n], tail):
                    return [int(t) for t in arr[start + n:start + n + gamma]]
        return []

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, gumbel=None,
                confidence=None):
        if k != 1:
            raise ValueError(f"k={k}: the n-gram drafter proposes a single branch; use k=1")
        toks = self.lookup(seq, _count(gamma, "gamma", 0))
        if any(t >= self.vocab_size for t in toks):
            raise ValueError(f"the text holds token ids >= vocab_size={self.vocab_size}: build "
                             "the NgramDrafter with the target's vocabulary size")
        dev = gen.device
        q = torch.zeros(1, len(toks), self.vocab_size, device=dev)
        t = torch.tensor([toks], dtype=torch.long, device=dev).reshape(1, len(toks))
        if toks:
            q[0, torch.arange(len(toks), device=dev), t[0]] = 1.0
        return t, q

    def accept(self, branch: int) -> None:
        pass


class NoDrafter:
    """Proposes nothing: every step is one target call (used by the drafter-invariance test)."""

    name = "none"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def reset(self, prompt):
        pass

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, gumbel=None,
                confidence=None):
        dev = gen.device
        return (torch.zeros(k, 0, dtype=torch.long, device=dev),
                torch.zeros(k, 0, self.vocab_size, device=dev))

    def accept(self, branch):
        pass


def _sample_rows(q: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row of q [rows, V] (float32) by inverse CDF with uniforms from ``gen``:
    :func:`coupling.llm.sampling.sample_rows`, the backend's draw (float64 running sums, a token
    of probability 0 never returned; ``torch.multinomial`` costs ~3 ms per call at V = 49152 on
    CPU)."""
    from .sampling import sample_rows

    u = torch.rand(q.shape[0], generator=gen, device=q.device, dtype=torch.float64)
    return sample_rows(q, u)


def draft_block(lm: CachedLM, seq: list[int], gamma: int, k: int, cfg: SamplingConfig,
                gen: torch.Generator, *, distinct_first: bool = False,
                gumbel: tuple[int, int] | None = None,
                confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample k branches of gamma tokens; return tokens [k, gamma] and laws q [k, gamma, V].

    Position 1 is common to all branches (one forward at batch 1); then the cache is expanded
    to k rows and positions 2..gamma run as batch-k single-token steps. With ``distinct_first``
    the k first tokens are drawn without replacement (successive sampling from q_1). With
    ``gumbel=(seed, position)`` drafts are Gumbel argmaxes from the backend's shared noise.
    """
    _count(gamma, "gamma", 1)
    feed = lm.sync(seq)
    logits = lm.forward(torch.tensor([feed], device=lm.device))[:, -1]  # [1, V]

    def step(x: torch.Tensor) -> torch.Tensor:
        return probs(lm.forward(x[:, None])[:, -1], cfg)               # [k, V]

    return sample_chain(probs(logits, cfg), step, lm.expand, gamma, k, gen,
                        distinct_first=distinct_first, gumbel=gumbel, confidence=confidence)


def sample_chain(q1: torch.Tensor, step, expand, gamma: int, k: int, gen: torch.Generator, *,
                 distinct_first: bool = False, gumbel: tuple[int, int] | None = None,
                 confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw k branches of gamma tokens from a drafter; return tokens [k, gamma], laws [k, gamma, V].

    ``q1`` [1, V] is the law of the first drafted token (common to all branches); ``expand(k)``
    turns the drafter's state into k rows; ``step(x [k])`` feeds the k last drafted tokens and
    returns the next laws [k, V]. Sampling: i.i.d. inverse-CDF draws from ``gen``, or the k
    first tokens without replacement (``distinct_first``), or Gumbel argmaxes from the
    backend's shared noise at ``gumbel=(seed, position)`` (single branch).

    ``confidence``: a block of one token instead of ``gamma`` when the first law's largest
    probability ``max q1`` is below it. A token past the first pays off only if the first is
    accepted, which a flat ``q1`` makes unlikely, while it always costs a draft forward and a
    row of the verification call (EAGLE-2's dynamic drafts make the same bet). The length
    is a function of ``q1``, i.e. of the committed text alone, never of a drafted token nor
    of the target: every rule then verifies a block whose length was fixed before it was
    drafted, which is the setting of its losslessness guarantee.
    """
    gamma, k = _count(gamma, "gamma", 1), _count(k, "k", 1)
    _check_confidence(confidence, "confidence")
    if q1.dim() != 2 or q1.shape[0] != 1:
        raise ValueError(f"q1 must be the first token's law [1, V], got shape {tuple(q1.shape)}")
    if confidence is not None and gamma > 1 and float(q1.max()) < confidence:
        gamma = 1
    if distinct_first:
        # k distinct tokens need k tokens of positive mass: a peaked q (top-p keeps one token)
        # gets fewer branches, each still a distinct draw by successive sampling
        k = min(k, int((q1 > 0).sum()))
    qs = [q1.expand(k, -1)]
    if gumbel is not None:
        if k != 1:
            raise ValueError("gumbel drafting is single-branch (k=1)")
        x = _gumbel_draft(q1, gumbel[0], gumbel[1])
    elif distinct_first:
        # successive sampling on the tokens of positive mass only: the same law (a zero-mass
        # token is never drawn), but a draw over U <= top-k entries instead of V (1.7 ms of a
        # step at V = 49152 on the reference CPU)
        support = q1[0].nonzero().squeeze(-1)
        x = support[torch.multinomial(q1[0, support], k, replacement=False, generator=gen)]
    else:
        x = _sample_rows(q1.expand(k, -1).contiguous(), gen)
    toks = [x]
    expand(k)
    for i in range(1, gamma):
        qi = step(toks[-1])
        qs.append(qi)
        if gumbel is not None:
            toks.append(_gumbel_draft(qi, gumbel[0], gumbel[1] + i))
        else:
            toks.append(_sample_rows(qi, gen))
    if gamma == 1:      # one law: a view, not a [k, 1, V] copy
        return toks[0][:, None], qs[0][:, None]
    return torch.stack(toks, 1), torch.stack(qs, 1)


def _gumbel_draft(q: torch.Tensor, seed: int, position: int) -> torch.Tensor:
    from .rules_adapter import gumbel_draft

    return gumbel_draft(q, seed, position).reshape(q.shape[0])


@dataclass
class StepRecord:
    """One verification step: drafted length, accepted length, per-position laws' overlaps."""

    drafted: int
    accepted: int
    branch: int
    # alpha[i] = sum_x min(p_i, q_i) along the chosen branch, i = 1..drafted
    alpha: list[float] = field(default_factory=list)
    # rule-specific per-position acceptance (see coupling.llm.predict); filled when predicting
    beta: list[float] = field(default_factory=list)
    predicted: float = float("nan")      # predicted tokens for this call (coupling.llm.predict)
    conditional: float = float("nan")    # E[accepted + 1 | drafts] (token and block rules)
    # E[accepted + 1 | the same drafts] had block verification judged them (k = 1 rules):
    # pairs block with token on identical blocks, free of the runs' diverging trajectories
    block_on_drafts: float = float("nan")
    # multi-draft rules: the predicted tokens had the LP-optimal verifier judged the same
    # draft law (same k, same replacement) on these laws: what the rule leaves on the table
    optimal_predicted: float = float("nan")


@dataclass
class GenerationResult:
    tokens: list[int]                 # generated tokens (prompt excluded), EOS included if hit
    steps: list[StepRecord]
    target_calls: int
    draft_calls: int
    seconds: float
    target_seconds: float
    draft_seconds: float
    #: False when a lossy rule (``generate(lossy=True)``) made the tokens: not the target's law
    lossless: bool = True

    @property
    def block_efficiency(self) -> float:
        """Mean tokens emitted per target call (accepted + 1), untruncated."""
        return float(np.mean([s.accepted + 1 for s in self.steps])) if self.steps else 0.0

    @property
    def predicted_block_efficiency(self) -> float:
        """Mean over steps of the predicted tokens per call (see coupling.llm.predict)."""
        return float(np.mean([s.predicted for s in self.steps])) if self.steps else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens."""
        drafted = sum(s.drafted for s in self.steps)
        return sum(s.accepted for s in self.steps) / drafted if drafted else float("nan")


def verify(target: CachedLM, seq: list[int], drafts: torch.Tensor, q: torch.Tensor, rule: str,
           cfg: SamplingConfig, seed: int, *, replacement: bool = True,
           tree: bool = False) -> tuple[int, int, list[int], torch.Tensor]:
    """One target call on all k branches; the backend rule decides. Returns
    (accepted length m, chosen branch c, emitted tokens (m drafted + 1), p [k, g+1, V]).

    k > 1 branches go through the target as one row with tree attention when ``tree``
    (:meth:`CachedLM.forward_tree`), else as a batch of k rows sharing a repeated KV cache.
    """
    k, g = drafts.shape
    feed = target.sync(seq)
    if k > 1 and tree:
        logits, rows = target.forward_tree(feed, drafts)      # [1 + k g, V], one row
        p = probs(logits, cfg)[rows]                          # [k, g+1, V]
    else:
        target.expand(k)
        ids = torch.cat([torch.tensor([feed], device=drafts.device).expand(k, -1), drafts], 1)
        logits = target.forward(ids)[:, len(feed) - 1:]       # [k, g+1, V], k rows
        p = probs(logits, cfg)
    position = len(seq)
    from . import rules_adapter

    m, c, emitted = rules_adapter.decide(rule, drafts, q, p, seed, position,
                                         replacement=replacement)
    if k > 1 and tree:
        target.select_branch(c, keep=m)
    else:
        target.select(c)
    return m, c, emitted, p


TREE_MODEL_TYPES = ("llama",)
TREE_ATTENTION = ("sdpa", "eager", GROUPED_SDPA)


def supports_tree(model) -> bool:
    """Whether :meth:`CachedLM.forward_tree` may be used on ``model``.

    Tree attention needs a model that takes a custom 4D additive mask and explicit
    ``position_ids`` unchanged; in transformers 5 the Llama family does (SmolLM2 is a Llama),
    with the sdpa or eager attention (or ``models.GROUPED_SDPA``, sdpa with grouped KV heads on a
    CPU). Other models verify k branches as a batch of k rows.
    """
    cfg = getattr(model, "config", None)
    return (getattr(cfg, "model_type", None) in TREE_MODEL_TYPES
            and getattr(cfg, "_attn_implementation", None) in TREE_ATTENTION)


def generate(target_model, drafter: Drafter | None, prompt: list[int], *, max_new_tokens: int,
             rule: str = "token", gamma: int = 4, k: int = 1, cfg: SamplingConfig | None = None,
             seed: int = 0, eos_token_id: int | None = None, replacement: bool = True,
             target: CachedLM | None = None, record_alpha: bool = True,
             predict: bool = False, on_step=None,
             tree_attention: bool | None = None,
             draft_confidence: float | None = None, lossy: bool = False) -> GenerationResult:
    """Speculative sampling of up to ``max_new_tokens`` tokens after ``prompt``.

    ``drafter=None`` or ``gamma=0`` gives plain autoregressive sampling through the same cache
    code (``rule="gumbel"`` then samples with the backend's Gumbel noise at (seed, position)).
    ``on_step(record, drafts, q, p)`` is called after each verification (trace recording).
    ``tree_attention``: verify k > 1 branches as one row with tree attention (default: when
    :func:`supports_tree`), else as a batch of k rows.
    ``draft_confidence``: blocks of one token where the draft's first law peaks below it,
    of ``gamma`` elsewhere (:func:`sample_chain`; ``None``: always ``gamma``).
    ``target``: a :class:`CachedLM` of ``target_model`` to run in; it keeps the longest common
    prefix of its cache and the prompt (:func:`prefill` with ``reuse``), so many generations
    from one prompt pay its prefill once. Without it each call starts from an empty cache.
    """
    cfg = cfg or SamplingConfig()
    max_new_tokens = _count(max_new_tokens, "max_new_tokens", 1)
    k = _count(k, "k", 1)
    gamma = _count(gamma, "gamma", 0)            # 0: plain sampling through the same loop
    seed = _check_seed(seed)
    _check_confidence(draft_confidence)
    # checked here too, not only by prefill: before a passed-in cache is touched
    t_vocab = _vocab_size(target_model)
    prompt = _check_prompt(prompt, t_vocab)
    d_vocab = getattr(drafter, "vocab_size", None)
    if drafter is not None and d_vocab is not None and t_vocab is not None \
            and d_vocab != t_vocab:
        raise ValueError(f"the drafter's vocabulary has {d_vocab} tokens, the target's "
                         f"{t_vocab}: target and draft must share one tokenizer")
    from . import rules_adapter

    rules_adapter.check_rule(rule, k, replacement, lossy=lossy)
    if rule == rules_adapter.PLAIN and drafter is not None and gamma > 0:
        raise ValueError(f"rule={rule!r} samples without drafts: pass gamma=0 or drafter=None, "
                         "or a rule of coupling.rules.RULES to verify the drafts")
    rules_adapter.prepare(rule)
    tlm = target or CachedLM(target_model)
    if tree_attention is None:
        tree_attention = supports_tree(tlm.model)
    elif tree_attention and not supports_tree(tlm.model):
        raise ValueError(f"tree_attention=True, but model type "
                         f"{getattr(tlm.model.config, 'model_type', None)!r} is not one of "
                         f"{TREE_MODEL_TYPES} with attention {TREE_ATTENTION}; pass False")
    t0 = time.perf_counter()
    tlm.calls, tlm.seconds = 0, 0.0
    # a feature drafter (EAGLE-style) reads the target's hidden states
    uses_feats = drafter is not None and gamma > 0 and getattr(drafter, "needs_target_features",
                                                                False)
    tlm.keep_features = uses_feats
    prefill(tlm, prompt, reuse=target is not None)
    d_calls0 = d_sec0 = 0
    if drafter is not None and gamma > 0:
        if uses_feats:
            drafter.bind(tlm)
        drafter.reset(prompt)
        d_calls0, d_sec0 = getattr(drafter, "calls", 0), getattr(drafter, "seconds", 0.0)
    gen = torch.Generator(device=tlm.device).manual_seed(seed)
    seq = list(prompt)
    steps: list[StepRecord] = []
    # without replacement: k distinct first tokens (successive sampling from q_1)
    distinct = rules_adapter.distinct_first(replacement, k)
    excluded = 0.0
    while len(seq) - len(prompt) < max_new_tokens:
        position = len(seq)
        if drafter is not None and gamma > 0:
            g = min(gamma, max_new_tokens - (len(seq) - len(prompt)))
            gum = (seed, position) if rule == "gumbel" else None
            drafts, q = drafter.propose(seq, g, k, cfg, gen, distinct_first=distinct, gumbel=gum,
                                        confidence=draft_confidence)
        else:
            drafts, q = torch.zeros(1, 0, dtype=torch.long, device=tlm.device), None
        if drafts.shape[1] == 0:
            # nothing drafted (n-gram miss, no drafter): one plain target step
            feed = tlm.sync(seq)
            tlm.expand(1)
            p = probs(tlm.forward(torch.tensor([feed], device=tlm.device))[:, -1], cfg)  # [1, V]
            tok = rules_adapter.sample_target(rule, p, seed, position, gen)
            m, c, emitted = 0, 0, [tok]
            # exact conditionals exist for token and block only (see coupling.llm.predict)
            exact = 1.0 if rule in ("token", "block") else float("nan")
            steps.append(StepRecord(0, 0, 0, predicted=1.0, conditional=exact,
                                    block_on_drafts=exact))
        else:
            m, c, emitted, p = verify(tlm, seq, drafts, q, rule, cfg, seed,
                                      replacement=replacement, tree=tree_attention)
            drafter.accept(c)
            rec = StepRecord(int(drafts.shape[1]), m, c)
            if record_alpha:
                # overlaps along the chosen branch, positions 1..g (the bonus law has no draft);
                # analysis, like predict below: not charged to generation
                t_alpha = time.perf_counter()
                g_ = drafts.shape[1]
                rec.alpha = torch.minimum(p[c, :g_].double(), q[c].double()).sum(-1).tolist()
                excluded += time.perf_counter() - t_alpha
            if predict:
                from . import predict as P

                t_pred = time.perf_counter()

                rec.beta = P.step_beta(rule, drafts, q, p, c, drafts.shape[0], replacement)
                rec.predicted = P.predicted_block_efficiency(rule, rec.beta)
                if rule in MULTI_DRAFT_RULES:
                    rec.optimal_predicted = P.optimal_block_efficiency(
                        rule, rec, drafts, q, p, c, replacement)
                if rule in ("token", "block"):
                    rec.block_on_drafts = P.conditional_block(drafts, q, p, c)
                    rec.conditional = rec.block_on_drafts if rule == "block" \
                        else P.conditional_token(drafts, q, p, c)
                excluded += time.perf_counter() - t_pred  # analysis, not generation
            if on_step is not None:
                on_step(rec, drafts, q, p)
            steps.append(rec)
        seq.extend(emitted)
        if eos_token_id is not None and eos_token_id in emitted:
            seq = seq[: len(seq) - len(emitted) + emitted.index(eos_token_id) + 1]
            break
    out = seq[len(prompt):][:max_new_tokens]
    d_calls = d_sec = 0
    if drafter is not None and gamma > 0:
        d_calls = getattr(drafter, "calls", 0) - d_calls0
        d_sec = getattr(drafter, "seconds", 0.0) - d_sec0
    lossless = rule == rules_adapter.PLAIN or RULES[rule].lossless
    return GenerationResult(out, steps, tlm.calls, d_calls, time.perf_counter() - t0 - excluded,
                            tlm.seconds, d_sec, lossless)


def autoregressive(target_model, prompt: list[int], *, max_new_tokens: int,
                   cfg: SamplingConfig | None = None, seed: int = 0,
                   eos_token_id: int | None = None, gumbel: bool = False,
                   target: CachedLM | None = None) -> GenerationResult:
    """Plain sampling from the target, one target call per token (same cache code)."""
    return generate(target_model, None, prompt, max_new_tokens=max_new_tokens,
                    rule="gumbel" if gumbel else "plain", gamma=0, cfg=cfg, seed=seed,
                    eos_token_id=eos_token_id, target=target)


def hf_assisted(target_model, draft_model, prompt: list[int], *, max_new_tokens: int,
                cfg: SamplingConfig, gamma: int, seed: int = 0,
                eos_token_id: int | None = None,
                confidence: float | None = None) -> GenerationResult:
    """Hugging Face ``generate(assistant_model=draft, do_sample=True)`` with a constant
    ``num_assistant_tokens = gamma`` (the same draft, the same sampling settings).

    ``confidence``: Hugging Face's own gate on the draft length, its
    ``assistant_confidence_threshold`` (drafting stops after a token whose draft probability is
    below it; 0, no gate, when None): the baseline's counterpart of
    ``generate(draft_confidence=)``, which gates on the first law's peak instead."""
    from .sampling import hf_kwargs

    max_new_tokens = _count(max_new_tokens, "max_new_tokens", 1)
    gamma = _count(gamma, "gamma", 1)
    _check_confidence(confidence, "confidence")
    prompt = _check_prompt(prompt, _vocab_size(target_model))
    gc = draft_model.generation_config
    gc.num_assistant_tokens = gamma
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0 if confidence is None else float(confidence)
    torch.manual_seed(seed)
    ids = torch.tensor([prompt], device=next(target_model.parameters()).device)
    calls = [0]
    hook = target_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    t0 = time.perf_counter()
    with torch.no_grad():
        out = target_model.generate(ids, attention_mask=torch.ones_like(ids),
                                    assistant_model=draft_model, max_new_tokens=max_new_tokens,
                                    min_new_tokens=0, eos_token_id=eos_token_id,
                                    pad_token_id=eos_token_id, **hf_kwargs(cfg))
    dt = time.perf_counter() - t0
    hook.remove()
    toks = out[0, len(prompt):].tolist()
    if eos_token_id is not None and eos_token_id in toks:
        toks = toks[: toks.index(eos_token_id) + 1]
    # HF folds the prompt into its first verification call: tokens per target forward call
    return GenerationResult(toks, [], calls[0], 0, dt, 0.0, 0.0)
