"""One model's KV cache for rows that advance by different numbers of tokens.

Rows of a batch accept different numbers of drafted tokens at each step. The cache stays one
padded ``DynamicCache`` ``[rows, heads, columns, head_dim]``; a 2-D mask ``[rows, columns]``
says which columns hold a token of the row's sequence. Left padding of the prompt and the
columns of rejected drafts ("holes") are masked out of every later attention, exactly as
left padding is in plain ``generate``, and each token gets the position id of its place in
its own row (the number of real tokens before it), so a row's logits are those of the row
alone. Trailing columns that no row uses are cropped (``Cache.crop``): for one row the cache
then holds no hole at all, and in a batch a row carries at most the holes of the steps where
another row accepted more.

Only public ``transformers`` API is used: the model's ``forward(input_ids, attention_mask,
position_ids, cache, use_cache, logits_to_keep)`` and ``Cache.crop`` /
``Cache.batch_select_indices``.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

__all__ = ["RaggedCache", "check_cache"]


def check_cache(cache: object, who: str) -> DynamicCache:
    """``cache`` if it is a ``DynamicCache`` of attention layers, else ``ValueError``."""
    if cache is None:
        raise ValueError(
            f"coupling.hf.generate needs a KV cache for the {who}: call generate with "
            "use_cache=True on a model whose generate builds a DynamicCache")
    if not isinstance(cache, DynamicCache):
        raise ValueError(
            f"the {who}'s cache is a {type(cache).__name__}; coupling.hf.generate keeps rows of "
            "different lengths in a DynamicCache (leave cache_implementation unset)")
    if any(getattr(cache, "is_linear", [])):
        raise ValueError(
            f"the {who} has linear-attention cache layers; coupling.hf.generate masks rejected "
            "drafts out of an attention cache and supports only those")
    return cache


def sliding_window(cache: DynamicCache) -> int | None:
    """The smallest sliding window of the cache's layers (``None`` if none slides).

    A sliding layer keeps the last ``window - 1`` columns; while a row's columns (holes
    included) fit in them, it attends to every one, as a full-attention layer does, so the
    run is exact there and refused beyond (:meth:`RaggedCache.forward`)."""
    windows = [layer.sliding_window for layer, sliding in zip(cache.layers, cache.is_sliding,
                                                              strict=True) if sliding]
    return min(windows) if windows else None


class RaggedCache:
    """``model`` with its cache, the mask of real columns and each row's length.

    ``lengths[r]`` counts the real tokens of row ``r`` in the cache, which is the position id of
    the row's next token.
    """

    def __init__(self, model, cache: DynamicCache, rows: int, device: torch.device) -> None:
        self.model = model
        self.cache = cache
        self.window = sliding_window(cache)
        self.mask = torch.zeros(rows, 0, dtype=torch.long, device=device)
        self.lengths = torch.zeros(rows, dtype=torch.long, device=device)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        if self._cache_arg not in params:
            raise ValueError(f"{type(model).__name__}.forward takes no cache argument: "
                             "coupling.hf.generate needs a model with a KV cache")
        self._keep_arg = "logits_to_keep" in params

    def forward(self, tokens: torch.Tensor, real: torch.Tensor,
                last_only: bool = False) -> torch.Tensor:
        """Append ``tokens [R, m]`` (``real [R, m]``: 1 for a token of the row, 0 for a hole) and
        return float32 logits ``[R, m, V]`` (``[R, 1, V]``, the last position's, with
        ``last_only``)."""
        real = real.to(torch.long)
        columns = self.mask.shape[1] + real.shape[1]
        if self.window is not None and columns >= self.window:
            name = type(self.model).__name__
            raise ValueError(f"the run needs {columns} cache columns, but {name}'s sliding "
                             f"layers keep {self.window - 1}: lower "
                             "max_new_tokens, or run rows whose lengths differ less in "
                             "separate batches")
        steps = real.cumsum(1)
        # a hole's position id is never read (its key is masked): the row's last real position
        position_ids = (self.lengths.unsqueeze(1) + steps - 1).clamp_(min=0)
        mask = torch.cat([self.mask, real], dim=1)
        kwargs = {self._cache_arg: self.cache}
        if self._keep_arg:
            kwargs["logits_to_keep"] = 1 if last_only else 0
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=position_ids,
                         use_cache=True, **kwargs)
        self.mask = mask
        self.lengths = self.lengths + steps[:, -1]
        logits = out.logits[:, -1:] if last_only else out.logits
        return logits.to(torch.float32)

    def keep(self, new: int, kept: torch.Tensor) -> None:
        """Of the last ``new`` columns, keep the first ``kept[r]`` in row ``r``; the others become
        holes, and trailing columns that are holes in every row are cropped."""
        if new == 0:
            return
        tail = self.mask[:, -new:]
        drop = torch.arange(new, device=tail.device).unsqueeze(0) >= kept.unsqueeze(1)
        self.lengths = self.lengths - (tail * drop).sum(1)
        tail.masked_fill_(drop, 0)
        self._crop()

    def drop_last(self, counts: torch.Tensor) -> None:
        """Make the last ``counts[r]`` real tokens of row ``r`` holes (an assistant with another
        tokenizer whose re-encoded context no longer starts with them), and crop trailing
        columns that are holes in every row."""
        if not bool((counts > 0).any()):
            return
        if bool((counts > self.lengths).any()):
            raise ValueError("drop_last: a row holds fewer tokens than it is asked to drop")
        after = self.mask.flip(1).cumsum(1).flip(1)        # real tokens at or after a column
        self.mask = self.mask.masked_fill((after <= counts.unsqueeze(1)) & (self.mask > 0), 0)
        self.lengths = self.lengths - counts
        self._crop()

    def _crop(self) -> None:
        """Crop the trailing columns that are holes in every row."""
        used = torch.nonzero(self.mask.any(0))
        width = int(used.max()) + 1 if used.numel() else 0
        extra = self.mask.shape[1] - width
        if extra:
            self.cache.crop(-extra)
            self.mask = self.mask[:, :width]

    def select(self, rows: torch.Tensor) -> None:
        """Keep (and reorder, or repeat) the given rows: finished rows leave, and the rows of a
        draft tree take the cache of the branch their row accepted."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.lengths = self.lengths[rows]
