"""Drafters for the engine: what proposes the k branches a rule verifies, with the exact laws
``q`` they were sampled from.

:class:`ModelDrafter` (any causal LM with the target's tokenizer; :func:`draft_block`),
:class:`coupling.llm.feature_draft.FeatureDrafter` (EAGLE-style, reads the target's hidden
states), :class:`NgramDrafter` (prompt lookup; ``q`` a point mass) and :class:`NoDrafter`.
:func:`sample_chain` holds the sampling they share: ``k`` i.i.d. branches, or k *distinct*
first tokens by successive sampling (``distinct_first``, for rules verifying
``replacement=False``), each branch then a single chain, or the keyed Gumbel argmaxes of the
drafter side of the Gumbel coupling. Draft uniforms come from a ``torch.Generator`` seeded
by the run.

``q`` is produced by :func:`coupling.llm.sampling.probs` with the run's
:class:`~coupling.llm.sampling.SamplingConfig` in float32: the law drafts were really
sampled from.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from coupling.dist import validate_count
from coupling.tree import Tree

from .cache import CachedLM, prefill, vocab_size
from .rules_adapter import noise_draft
from .sampling import SamplingConfig, probs

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "NoDrafter", "check_confidence",
           "draft_block", "draft_topology", "draw_children", "draw_rows", "sample_chain"]


def check_confidence(confidence: float | None, name: str = "draft_confidence") -> None:
    if confidence is not None and not 0.0 <= confidence <= 1.0:   # NaN fails too
        raise ValueError(f"{name}={confidence} must lie in [0, 1] (a bound on the draft's "
                         "largest first-token probability), or be None")


class Drafter(Protocol):
    name: str
    #: the tokenizer's vocabulary size (``generate`` checks it against the target's)
    vocab_size: int | None

    def reset(self, prompt: list[int]) -> None: ...

    def propose(self, seq: list[int], gamma: int, k: int, cfg: SamplingConfig,
                gen: torch.Generator, *, distinct_first: bool = False,
                noise: tuple[str, int, int] | None = None,
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
        self.vocab_size = vocab_size(model)

    def reset(self, prompt: list[int]) -> None:
        prefill(self.lm, prompt)

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, noise=None,
                confidence=None):
        return draft_block(self.lm, seq, gamma, k, cfg, gen, distinct_first=distinct_first,
                           noise=noise, confidence=confidence)

    def accept(self, branch: int) -> None:
        self.lm.select(branch)

    def propose_tree(self, seq: list[int], tree: Tree, cfg: SamplingConfig,
                     gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill a static draft tree (:func:`draft_topology`)."""
        drafts, q, self._entries = draft_topology(self.lm, seq, tree, cfg, gen)
        return drafts, q

    def accept_path(self, path: list[int]) -> None:
        """Keep the accepted nodes' cache entries (those the drafter fed; a tree of depth 1
        feeds none)."""
        if self.lm.pending is not None:
            self.lm.select_path([self._entries[n] for n in path if n in self._entries])

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

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, noise=None,
                confidence=None):
        if k != 1:
            raise ValueError(f"k={k}: the n-gram drafter proposes a single branch; use k=1")
        toks = self.lookup(seq, validate_count(gamma, "gamma", minimum=0))
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

    def propose(self, seq, gamma, k, cfg, gen, *, distinct_first=False, noise=None,
                confidence=None):
        dev = gen.device
        return (torch.zeros(k, 0, dtype=torch.long, device=dev),
                torch.zeros(k, 0, self.vocab_size, device=dev))

    def accept(self, branch):
        pass


def draw_children(law: torch.Tensor, m: int, children: str,
                  gen: torch.Generator) -> torch.Tensor:
    """``m`` children of a tree node from its draft law ``law [V]`` (:data:`coupling.tree.
    CHILD_LAWS`): i.i.d. inverse-CDF draws, successive draws without replacement, or the
    ``m`` likeliest tokens in order. Returns int64 ``[m]``."""
    if children == "iid":
        return draw_rows(law.expand(m, -1).contiguous(), gen)
    if children == "topk":
        return torch.topk(law, m).indices
    support = law.nonzero().squeeze(-1)
    if support.numel() < m:
        raise ValueError(f"a node has {m} children drawn without replacement, but the draft's "
                         f"law has {support.numel()} token(s) of positive probability; use "
                         "fewer children or children='iid'")
    return support[torch.multinomial(law[support], m, replacement=False, generator=gen)]


def draft_topology(lm: CachedLM, seq: list[int], tree: Tree, cfg: SamplingConfig,
                   gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, dict[int, int]]:
    """Fill ``tree`` depth by depth with one draft call per depth, by tree attention.

    The children of every node of depth ``d`` are drawn from its law (:func:`draw_children`),
    then the nodes of depth ``d`` are fed in one call (:meth:`CachedLM.forward_nodes`) to give
    their own laws. Returns ``drafts`` int64 ``[N]`` in node order, ``q [N + 1, V]`` (row 0 the
    root's law, row ``1 + n`` the law after node ``n``; a node of the deepest level is never
    fed and gets the root's law there, a row the walk never reads, since no node of that
    depth has children) and the cache entry of each fed node, for :meth:`ModelDrafter.
    accept_path`.
    """
    feed = lm.sync(seq)
    root = probs(lm.forward(torch.tensor([feed], device=lm.device), last_only=True)[0], cfg)
    laws: dict[int, torch.Tensor] = {-1: root[0]}
    drafts = torch.zeros(tree.size, dtype=torch.long, device=root.device)
    entries: dict[int, int] = {}
    by_depth = [[n for n in range(tree.size) if tree.depths[n] == d]
                for d in range(1, tree.depth + 1)]
    for d, level in enumerate(by_depth, start=1):
        for a in dict.fromkeys(tree.parent[n] for n in level):
            kids = list(tree.kids[a])
            drafts[kids] = draw_children(laws[a], len(kids), tree.children, gen)
        if d == tree.depth:
            break
        parents = [entries[tree.parent[n]] if tree.parent[n] >= 0 else -1 for n in level]
        out = lm.forward_nodes([], drafts[level].tolist(), parents)
        q_level = probs(out, cfg)
        for i, n in enumerate(level):
            entries[n] = len(entries)
            laws[n] = q_level[i]
    q = torch.stack([laws.get(n, root[0]) for n in range(-1, tree.size)])
    return drafts, q, entries


def draw_rows(q: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token per row of q [rows, V] (float32) by inverse CDF with uniforms from ``gen``:
    :func:`coupling.llm.sampling.sample_rows`, the backend's draw (float64 running sums, a token
    of probability 0 never returned; ``torch.multinomial`` costs ~3 ms per call at V = 49152 on
    CPU)."""
    from .sampling import sample_rows

    u = torch.rand(q.shape[0], generator=gen, device=q.device, dtype=torch.float64)
    return sample_rows(q, u)


def draft_block(lm: CachedLM, seq: list[int], gamma: int, k: int, cfg: SamplingConfig,
                gen: torch.Generator, *, distinct_first: bool = False,
                noise: tuple[str, int, int] | None = None,
                confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample k branches of gamma tokens; return tokens [k, gamma] and laws q [k, gamma, V].

    Position 1 is common to all branches (one forward at batch 1); then the cache is expanded
    to k rows and positions 2..gamma run as batch-k single-token steps. With ``distinct_first``
    the k first tokens are drawn without replacement (successive sampling from q_1). With
    ``noise=(rule, seed, position)``: drafts by a shared-noise rule's keyed noise.
    """
    validate_count(gamma, "gamma")
    feed = lm.sync(seq)
    logits = lm.forward(torch.tensor([feed], device=lm.device))[:, -1]  # [1, V]

    def step(x: torch.Tensor) -> torch.Tensor:
        return probs(lm.forward(x[:, None])[:, -1], cfg)               # [k, V]

    return sample_chain(probs(logits, cfg), step, lm.expand, gamma, k, gen,
                        distinct_first=distinct_first, noise=noise, confidence=confidence)


def sample_chain(q1: torch.Tensor, step, expand, gamma: int, k: int, gen: torch.Generator, *,
                 distinct_first: bool = False, noise: tuple[str, int, int] | None = None,
                 confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw k branches of gamma tokens from a drafter; return tokens [k, gamma], laws [k, gamma, V].

    ``q1`` [1, V] is the law of the first drafted token (common to all branches); ``expand(k)``
    turns the drafter's state into k rows; ``step(x [k])`` feeds the k last drafted tokens and
    returns the next laws [k, V]. Sampling: i.i.d. inverse-CDF draws from ``gen``, or the k
    first tokens without replacement (``distinct_first``), or by the keyed noise of a
    shared-noise rule at ``noise=(rule, seed, position)`` (:func:`.rules_adapter.noise_draft`:
    ``gls``'s branch ``c`` by its column ``c``).

    ``confidence``: a block of one token instead of ``gamma`` when the first law's largest
    probability ``max q1`` is below it. A token past the first pays off only if the first is
    accepted, which a flat ``q1`` makes unlikely, while it always costs a draft forward and a
    row of the verification call (EAGLE-2's dynamic drafts make the same bet). The length
    is a function of ``q1``, i.e. of the committed text alone, never of a drafted token nor
    of the target: every rule then verifies a block whose length was fixed before it was
    drafted, which is the setting of its losslessness guarantee.
    """
    gamma, k = validate_count(gamma, "gamma"), validate_count(k, "k")
    check_confidence(confidence, "confidence")
    if q1.dim() != 2 or q1.shape[0] != 1:
        raise ValueError(f"q1 must be the first token's law [1, V], got shape {tuple(q1.shape)}")
    if confidence is not None and gamma > 1 and float(q1.max()) < confidence:
        gamma = 1
    if distinct_first:
        # k distinct tokens need k tokens of positive mass: a peaked q (top-p keeps one token)
        # gets fewer branches, each still a distinct draw by successive sampling
        k = min(k, int((q1 > 0).sum()))
    qs = [q1.expand(k, -1)]
    if noise is not None:
        x = noise_draft(q1.expand(k, -1), *noise)
    elif distinct_first:
        # successive sampling on the tokens of positive mass only: the same law (a zero-mass
        # token is never drawn), but a draw over U <= top-k entries instead of V
        support = q1[0].nonzero().squeeze(-1)
        x = support[torch.multinomial(q1[0, support], k, replacement=False, generator=gen)]
    else:
        x = draw_rows(q1.expand(k, -1).contiguous(), gen)
    toks = [x]
    expand(k)
    for i in range(1, gamma):
        qi = step(toks[-1])
        qs.append(qi)
        if noise is not None:
            toks.append(noise_draft(qi, noise[0], noise[1], noise[2] + i))
        else:
            toks.append(draw_rows(qi, gen))
    if gamma == 1:      # one law: a view, not a [k, 1, V] copy
        return toks[0][:, None], qs[0][:, None]
    return torch.stack(toks, 1), torch.stack(qs, 1)
