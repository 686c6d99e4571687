"""A causal LM's KV cache that knows which tokens it holds, and the calls the engine makes
on it: prefill, sync to the committed text, one verification call on k branches (tree
attention or a batch of k rows), and the selection of the chosen branch.

Cache invariant: a :class:`CachedLM` knows exactly which tokens its cache holds
(``self.tokens``); :meth:`CachedLM.sync` crops it to the longest common prefix with the committed
sequence (keeping at least one token to feed, whose logits give the next law). Correctness of a
rollback therefore never depends on off-by-one bookkeeping in the loop, and it is tested against a
fresh recomputation (``tests/test_llm_real.py``). Rollback is ``DynamicCache.crop`` with a
negative count; the chosen branch is kept by :meth:`CachedLM.select_branch` (its cache entries
moved next to the prefix) or ``batch_select_indices`` on k rows (:meth:`CachedLM.select`).

Attention. A verification call feeds several tokens under a mask. With grouped-query heads,
transformers' ``sdpa`` then copies the KV cache to every query head, which a 1-token decoding
call never does. On a CPU, ``models.use_grouped_sdpa(model)`` removes the copy, with
bit-identical logits; ``models.load_target`` applies it. Call it on any other target you
bring.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..lm import common_prefix
from .models import GROUPED_SDPA

__all__ = ["CachedLM", "TREE_ATTENTION", "TREE_MODEL_TYPES", "check_prompt", "common_prefix",
           "prefill", "supports_tree", "tree_positions", "tree_mask", "ancestor_mask",
           "chain_parents", "vocab_size"]


def check_prompt(prompt: list[int], vocab_size: int | None) -> list[int]:
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


def vocab_size(model) -> int | None:
    """The model's vocabulary size from its config (None if it has none)."""
    return getattr(getattr(model, "config", None), "vocab_size", None)


def chain_parents(k: int, g: int) -> list[int]:
    """Parent pointers of ``k`` branches of ``g`` tokens laid out branch after branch (the
    layout of :meth:`CachedLM.forward_tree`): entry ``j g + i`` continues ``j g + i - 1``."""
    return [-1 if i == 0 else j * g + i - 1 for j in range(k) for i in range(g)]


def ancestor_mask(cached: int, fed: int, parent: list[int], dtype: torch.dtype,
                  pending: list[int] | None = None) -> torch.Tensor:
    """Additive attention mask ``[fed + n, cached + P + fed + n]`` of a call that appends
    ``fed`` committed tokens (causal among themselves) and ``n`` tree entries after ``P``
    pending ones: ``parent`` (``pending + parent`` indexes all ``P + n`` entries, ``-1`` the
    committed text). An entry sees the cache, the committed tokens, its ancestors and itself.

    Float, not boolean: the sdpa and eager attention paths read it the same way.

    >>> ancestor_mask(1, 1, [-1, 0, -1], torch.float32).eq(0).int().tolist()
    [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]]
    """
    pending = list(pending or [])
    links = pending + list(parent)
    P, n = len(pending), len(parent)
    if P and fed:       # the pending entries come before the committed ones in the cache
        raise ValueError("committed tokens cannot follow pending tree entries; keep a path "
                         "(CachedLM.select_path) first")
    sees = torch.zeros(n, P + n, dtype=torch.bool)
    for e in range(n):
        a = P + e
        while a >= 0:
            sees[e, a] = True
            a = links[a]
    allowed = torch.zeros(fed + n, cached + P + fed + n, dtype=torch.bool)
    allowed[:, :cached] = True
    allowed[:fed, cached + P:cached + P + fed] = torch.ones(fed, fed, dtype=torch.bool).tril()
    allowed[fed:, cached + P:cached + P + fed] = True
    allowed[fed:, cached:cached + P] = sees[:, :P]
    allowed[fed:, cached + P + fed:] = sees[:, P:]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


def tree_mask(cached: int, fed: int, k: int, g: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[fed + k g, cached + fed + k g]`` of a call on ``k`` branches
    of ``g`` tokens (:meth:`CachedLM.forward_tree`): :func:`ancestor_mask` on
    :func:`chain_parents`."""
    return ancestor_mask(cached, fed, chain_parents(k, g), dtype)


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
        # (cache length before the tree, its pending tokens, their parents) between
        # forward_nodes / forward_tree and select_path / select_branch
        self.pending: tuple[int, list[int], list[int]] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.tokens = [[]]
        self.feats = None
        self.pending = None

    def sync(self, seq: list[int]) -> list[int]:
        """Crop the cache to the longest common prefix with ``seq``; return the tokens to feed.

        Keeps at most ``len(seq) - 1`` tokens so that at least one token is fed and the logits
        of the next position come out of the next forward pass.
        """
        if len(self.tokens) != 1 or self.pending is not None:
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
        if self.pending is not None:
            raise RuntimeError("tree entries are pending; call select_path() or "
                               "select_branch() first")
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
            pending = len(self.pending[1]) if self.pending is not None else 0
            if self.feats.shape[1] != len(self.tokens[0]) + pending + ids.shape[1]:
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
    def forward_nodes(self, feed: list[int], tokens: list[int],
                      parent: list[int]) -> torch.Tensor:
        """Append committed ``feed`` tokens and tree entries ``tokens`` in one call of a single
        row; return their logits ``[len(feed) + len(tokens), V]``.

        ``parent[e]`` is entry ``e``'s parent among all pending entries (those of earlier
        calls first, then these; ``-1``: the committed text). An entry attends to the cache,
        to ``feed``, to its ancestors and to itself, and takes the position it would have on
        its own path, so its logits are those of the committed text followed by its path
        (:func:`ancestor_mask`). Entries stay pending, over as many calls as a drafter needs
        to grow a tree level by level, until :meth:`select_path` keeps one path of them.
        """
        if len(self.tokens) != 1:
            raise RuntimeError("tree entries need a single-row cache")
        base, held, links = self.pending if self.pending is not None else (None, [], [])
        if base is not None and feed:
            raise ValueError("committed tokens cannot follow pending tree entries; call "
                             "select_path() first")
        n0, f = len(self.tokens[0]), len(feed)
        top = n0 + f if base is None else base
        all_links = links + list(parent)
        depth: list[int] = []
        for a in all_links:
            depth.append(1 if a < 0 else depth[a] + 1)
        pos = torch.cat([torch.arange(n0, n0 + f),
                         torch.tensor(depth[len(links):], dtype=torch.long) + top - 1])
        limit = tree_positions(self.model)
        if limit is not None and int(pos.max()) >= limit:
            raise ValueError(f"a tree call reaching position {int(pos.max())} on a model with a "
                             f"{limit}-token sliding window: tree attention is exact only "
                             "inside the window; verify shorter texts or as a batch of rows")
        mask = ancestor_mask(n0 if base is None else base, f, list(parent),
                             next(self.model.parameters()).dtype, links)
        ids = torch.tensor([list(feed) + list(tokens)], dtype=torch.long)
        logits = self._call(ids, position_ids=pos[None].to(self.device),
                            attention_mask=mask[None, None].to(self.device))
        self.tokens = [self.tokens[0] + list(feed)]
        self.pending = (top, held + list(tokens), all_links)
        return logits[0]

    def forward_tree(self, feed: list[int],
                     drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Score k draft branches of ``g`` tokens in one call of a single row, by tree
        attention (:meth:`forward_nodes` on the branches laid out one after another).

        Returns ``(logits, rows)``: logits [1 + k * g, V] of the last fed token and of the
        branch tokens in row order, and int64 rows [k, g + 1] with ``logits[rows[j]]`` branch
        j's logits (row 0, the last fed token's, is common to all branches, so laws computed
        on ``logits`` cost 1 + k * g rows instead of k * (g + 1)).

        Why: on a CPU a batch of k rows costs about k times the attention and a repeated KV
        cache, while one row of ``1 + k * g`` tokens costs about what a ``1 + g``-token call
        does (``benchmarks/bench_tree.py``). Call :meth:`select_branch` before the next call.
        """
        if len(self.tokens) != 1 or self.pending is not None:
            raise RuntimeError("forward_tree needs a single-row cache with no branch pending")
        k, g = drafts.shape
        logits = self.forward_nodes(feed, drafts.reshape(-1).tolist(), chain_parents(k, g))
        rows = torch.cat([torch.zeros(k, 1, dtype=torch.long),
                          1 + torch.arange(k * g).reshape(k, g)], 1)            # [k, g + 1]
        return logits[len(feed) - 1:], rows.to(self.device)

    def select_path(self, entries: list[int]) -> None:
        """Keep the pending entries ``entries`` (a path: each the parent of the next), in
        order and contiguous after the committed text; drop every other pending entry.

        Each layer's copy is one indexed gather (an entry's index is at least its depth, so
        the kept entries only move down); a path of leading entries moves nothing.
        """
        if self.pending is None:
            raise RuntimeError("select_path needs pending tree entries (forward_nodes)")
        base, held, links = self.pending
        entries = [int(e) for e in entries]
        for j, e in enumerate(entries):
            if not 0 <= e < len(held) or links[e] != (entries[j - 1] if j else -1):
                raise ValueError(f"entries={entries} is no path of the pending tree from its "
                                 "root")
        keep = len(entries)
        if entries != list(range(keep)):
            idx = torch.tensor(entries, device=self.device) + base
            for layer in self.cache.layers:
                for t in (layer.keys, layer.values):
                    t.narrow(2, base, keep).copy_(t.index_select(2, idx))
            if self.feats is not None:
                self.feats.narrow(1, base, keep).copy_(self.feats.index_select(1, idx))
        drop = len(held) - keep
        if drop:
            self.cache.crop(-drop)
            if self.feats is not None:
                self.feats = self.feats[:, :base + keep]
        self.tokens = [self.tokens[0] + [held[e] for e in entries]]
        self.pending = None

    def select_branch(self, branch: int, keep: int | None = None) -> None:
        """After :meth:`forward_tree`: keep the chosen branch's first ``keep`` entries (all g
        by default), contiguous after feed; the rest of the tree is dropped.

        ``keep`` = the accepted length saves copying entries the next :meth:`sync` would crop
        (a rejected first token keeps none: no copy at all).
        """
        if self.pending is None:
            raise RuntimeError("select_branch needs a pending forward_tree call")
        links = self.pending[2]
        g = next((e for e in range(1, len(links)) if links[e] < 0), len(links))
        k = len(links) // g
        if not 0 <= branch < k:
            raise ValueError(f"branch={branch} must be in [0, {k})")
        keep = g if keep is None else keep
        if not 0 <= keep <= g:
            raise ValueError(f"keep={keep} must be in [0, {g}]")
        self.select_path([branch * g + i for i in range(keep)])

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
    prompt = check_prompt(prompt, vocab_size(lm.model))
    keeps_feats = not lm.keep_features or (
        lm.feats is not None and lm.feats.shape[1] == len(lm.tokens[0]))
    if reuse and len(lm.tokens) == 1 and lm.pending is None and keeps_feats:
        if not lm.keep_features:
            lm.feats = None
        rest = lm.sync(prompt)[:-1]
    else:
        lm.reset()
        rest = prompt[:-1]
    if rest:
        lm.forward(torch.tensor([rest]), last_only=True)


TREE_MODEL_TYPES = ("llama", "gemma3_text")
TREE_ATTENTION = ("sdpa", "eager", GROUPED_SDPA)


def tree_positions(model) -> int | None:
    """How many positions a tree call may reach on ``model``: its sliding window where some
    layer attends through one (Gemma 3: the one mask of a tree call serves every layer, so
    it is exact only while every key lies inside the window), else ``None`` (no limit)."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    sliding = any("sliding" in str(t) for t in getattr(cfg, "layer_types", None) or ())
    return int(window) if window and sliding else None


def supports_tree(model) -> bool:
    """Whether :meth:`CachedLM.forward_tree` may be used on ``model``.

    Tree attention needs a model that takes a custom 4D additive mask and explicit
    ``position_ids`` unchanged; in transformers 5 the Llama family does (SmolLM2 is a Llama),
    and Gemma 3 text models do within their sliding window (:func:`tree_positions`), with the
    sdpa or eager attention (or ``models.GROUPED_SDPA``, sdpa with grouped KV heads on a
    CPU). Other models verify k branches as a batch of k rows.
    """
    cfg = getattr(model, "config", None)
    return (getattr(cfg, "model_type", None) in TREE_MODEL_TYPES
            and getattr(cfg, "_attn_implementation", None) in TREE_ATTENTION)
