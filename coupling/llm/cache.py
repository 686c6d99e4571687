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

from .models import GROUPED_SDPA

__all__ = ["CachedLM", "TREE_ATTENTION", "TREE_MODEL_TYPES", "check_prompt", "common_prefix",
           "prefill", "supports_tree", "tree_mask", "vocab_size"]


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


def tree_mask(cached: int, fed: int, k: int, g: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[fed + k g, cached + fed + k g]`` of a tree call
    (:meth:`CachedLM.forward_tree`): every new token sees the cache; ``fed`` tokens see each
    other causally; branch ``j``'s tokens see ``fed`` and their own branch causally.

    Float, not boolean: the sdpa and eager attention paths read it the same way."""
    n = fed + k * g
    among_new = torch.zeros(n, n, dtype=torch.bool)
    among_new[:, :fed] = True                                      # everyone sees feed ...
    among_new[:fed, :fed] = torch.ones(fed, fed, dtype=torch.bool).tril()    # ... causally
    among_new[fed:, fed:] = torch.block_diag(*[torch.ones(g, g, dtype=torch.bool).tril()] * k)
    allowed = torch.cat([torch.ones(n, cached, dtype=torch.bool), among_new], 1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)


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
        mask = tree_mask(n0, f, k, g, next(self.model.parameters()).dtype)
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
    prompt = check_prompt(prompt, vocab_size(lm.model))
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
