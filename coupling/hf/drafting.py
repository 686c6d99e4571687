"""Drafting a tree of ``k`` branches of ``gamma`` tokens per row, with keyed randomness.

Model row ``r = b * k + j`` holds branch ``j`` of batch row ``b``. Every draw is a pure function
of the row's seed and the absolute position of the step's first drafted token ``t`` (the
verifier's ``positions``): branch ``j``'s token at offset ``i`` is drawn by inverse CDF from
``U(seed, t, STREAM_DRAFT, i * k + j)``. Start positions strictly increase along a row, so no
draw is reused by a later step, whose verification could otherwise see a draft correlated with
an earlier decision. A shared-noise rule (``rule.shared_noise``: ``gumbel``, ``gls``) drafts with
its keyed noise of the token's own position instead, the very noise its verifier reads (its
twin's ``draft_branches``: ``gls``'s branch ``c`` by its noise column ``c``).

Branches are i.i.d. (``replacement=True``), or their first tokens are ``k`` distinct draws from
the shared first law (``replacement=False``): successive draws without replacement, or the
rule's own draft law where its twin drafts one (a ``draft_roots(q [B, V], u [B, k])`` in the
rule's ``torch`` module: ``greedy``'s likeliest tokens and one draw, ``spechub``'s hub pair),
with the same uniforms; each branch then continues as a chain of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..keyed import STREAM_DRAFT
from ..rules import RULES
from ..torch_backend import sample_rows, uniforms
from .options import Options
from .processors import Laws
from .ragged import RaggedCache

__all__ = ["Tree", "draft_tree", "draw"]


@dataclass
class Tree:
    """``drafts [B, k, g]`` and their laws ``q [B, k, g, V]``."""

    drafts: torch.Tensor
    q: torch.Tensor


def draft_tree(draft: RaggedCache, laws: Laws, opts: Options, feed: tuple[torch.Tensor, ...],
               ext: torch.Tensor, cur: torch.Tensor, batch_rows: torch.Tensor,
               seeds: torch.Tensor, starts: torch.Tensor) -> Tree:
    """Draft every branch of every row.

    ``feed = (tokens, real)`` ``[R, m]``: what the draft cache still lacks before the first
    drafted token. ``ext [R, L]``: each model row's sequence as plain ``generate`` holds it, in
    its first ``cur[r]`` columns; the drafts are written after it (the context of the next
    law), ``batch_rows [R]`` the input batch row of each. ``seeds``, ``starts`` ``[B]``: the
    rows' seeds and first drafted positions.
    """
    k, g = opts.num_drafts, opts.gamma
    R = ext.shape[0]
    rows = torch.arange(R, device=ext.device)
    u = None
    if opts.do_sample and not RULES[opts.rule].shared_noise:
        u = uniforms(seeds, starts, g * k, stream=STREAM_DRAFT).to(ext.device)  # [B, g*k]
    tokens, real = feed
    drafts, qs = [], []
    for i in range(g):
        logits = draft.forward(tokens, real, last_only=True)[:, 0]
        _, q = laws(ext, cur + i, batch_rows, logits)
        if i == 0 and k > 1:  # one context: every branch's first law is branch 0's, bit for bit
            q = q[::k].repeat_interleave(k, 0)
        x = draw(q, i, opts, u, seeds, starts)
        ext[rows, cur + i] = x
        drafts.append(x)
        qs.append(q)
        tokens, real = x.unsqueeze(1), torch.ones_like(x).unsqueeze(1)
    B = R // k
    return Tree(torch.stack(drafts, 1).view(B, k, g), torch.stack(qs, 1).view(B, k, g, -1))


def draw(q: torch.Tensor, i: int, opts: Options, u: torch.Tensor | None, seeds: torch.Tensor,
         starts: torch.Tensor) -> torch.Tensor:
    """The tokens drafted at offset ``i`` from ``q [R, V]``, ``R = B k`` rows (module doc):
    ``u [B, g k]`` the step's drafting uniforms (``None`` for a shared-noise rule or greedy
    laws), ``seeds``, ``starts`` ``[B]``. Returns ``[R]``."""
    k = opts.num_drafts
    if not opts.do_sample:
        return q.argmax(-1)
    rule = RULES[opts.rule]
    if rule.shared_noise:
        B = q.shape[0] // k
        return rule.torch.draft_branches(q.view(B, k, -1), seeds.to(q.device),
                                         starts.to(q.device) + i).reshape(-1)
    ui = u[:, i * k:(i + 1) * k].reshape(-1)  # [B*k], row b*k+j gets U(., i*k + j)
    if i == 0 and k > 1 and not opts.replacement:
        return _distinct_first(q[::k], u[:, :k], opts.rule)
    return sample_rows(q, ui)


def _distinct_first(q0: torch.Tensor, u: torch.Tensor, rule: str) -> torch.Tensor:
    """``k`` distinct first tokens from each row of ``q0 [B, V]`` with the uniforms ``u [B, k]``
    (module doc); returns ``[B*k]`` (row-major: the k first tokens of each row)."""
    B, k = u.shape
    support = (q0 > 0).sum(-1)
    if bool((support < k).any()):
        raise ValueError(
            f"replacement=False drafts {k} distinct first tokens, but the draft's processed law "
            f"has only {int(support.min())} token(s) of positive probability at some row (top-k, "
            "top-p or min-p cut it); lower num_drafts or use replacement=True")
    own = getattr(RULES[rule].torch, "draft_roots", None)
    if own is not None:
        return own(q0, u).reshape(-1)
    w = q0.to(torch.float64).clone()
    out = []
    for j in range(k):  # each draw removes its token from the law of the next
        x = sample_rows(w, u[:, j])
        w.scatter_(1, x.unsqueeze(1), 0.0)
        out.append(x)
    return torch.stack(out, 1).reshape(-1)
