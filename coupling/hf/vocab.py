r"""An assistant with another tokenizer: its drafts as target tokens.

Two proposals of Timor et al. (arXiv:2502.05202), :data:`PROPOSALS`:

``"intersection"`` (TLI)
    the assistant drafts only the pieces both vocabularies hold: its law is restricted to the
    shared pieces and renormalised, so a drafted piece is a target token as it is, and the
    law it was drawn from is a law over the target's vocabulary. Any rule of
    :data:`coupling.RULES` verifies it unchanged, and losslessly: ``q`` is the law each draft
    was drawn from, whatever the assistant read.
``"retokenized"`` (SLEM, string-level exact match)
    the assistant drafts ``gamma + 1`` tokens of its own vocabulary; the drafted text, encoded
    by the target's tokenizer after the row's text, gives the candidate (its last token
    dropped, since more text could merge it, and at most ``gamma``; a shorter one is padded by
    repeating its last token, or the row's). Given the assistant's draws the candidate is
    determined, and its draws are independent of the verifier's: ``q`` is the point mass at
    each drafted token, and every rule verifies it losslessly (token verification accepts a
    draft ``x`` with the target's own probability ``p(x)``, exact match's acceptance:
    ``strict`` is SLEM itself). The string-level law SLRS divides by sums over every
    tokenization of the drafted string, a sum that grows exponentially with its length (the
    paper's cost argument); it is exact in :mod:`coupling.vocab` on small vocabularies only.

:mod:`coupling.vocab` proves both exactly on toy tokenizers.

Glossary
--------
shared piece
    a string that is one token in both vocabularies (special tokens excepted); the
    assistant's space mark is read as the target's (``Ġ`` as ``▁``), the matching
    transformers' universal assisted generation uses.
the assistant's context
    the text of the row's target tokens (special tokens skipped), encoded by the assistant's
    tokenizer, then the pieces drafted in this step fed as the assistant's own ids.

Each step the text is re-encoded; the assistant's cache keeps the longest common prefix of
what it holds and the new encoding (rejected drafts, and a last piece the new text merges
with, are dropped) and is fed the rest: :class:`Retokenizer` does this for every row.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..keyed import STREAM_DRAFT
from ..lm import common_prefix
from ..torch_backend import sample_rows, uniforms
from .ragged import RaggedCache

__all__ = ["shared_token_ids", "Retokenizer", "check_tokenizers", "check_proposal", "PROPOSALS",
           "retokenized_chain"]

#: how an assistant with another tokenizer proposes target tokens (module doc)
PROPOSALS = ("intersection", "retokenized")


def _space_mark(tokenizer) -> str | None:
    """The character a tokenizer writes for a leading space (``Ġ``, ``▁``), or None."""
    ids = tokenizer(" a", add_special_tokens=False).input_ids
    pieces = tokenizer.convert_ids_to_tokens(ids)
    first = pieces[0] if pieces else ""
    return first[0] if first and first[0] != "a" and not first[0].isspace() else None


@functools.lru_cache(maxsize=4)     # 0.3 s for Gemma 3's 262144 pieces, once per pair
def shared_token_ids(tokenizer, assistant_tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """``(assistant ids, target ids)`` of the shared pieces (module glossary), by assistant id.

    Works on any two Hugging Face tokenizers (``get_vocab``, ``convert_ids_to_tokens``,
    ``all_special_ids``).

    >>> from coupling.vocab import to_transformers, toy_tokenizers
    >>> d, t = shared_token_ids(*(to_transformers(tok) for tok in toy_tokenizers()))
    >>> dict(zip(d.tolist(), t.tolist()))
    {0: 0, 1: 1, 2: 2}
    """
    mark_t, mark_d = _space_mark(tokenizer), _space_mark(assistant_tokenizer)
    special = set(tokenizer.all_special_ids)
    target = {p: i for p, i in tokenizer.get_vocab().items() if i not in special}
    special = set(assistant_tokenizer.all_special_ids)
    pairs = []
    for piece, j in assistant_tokenizer.get_vocab().items():
        if j in special:
            continue
        if mark_t and mark_d and piece.startswith(mark_d):
            piece = mark_t + piece[len(mark_d):]
        i = target.get(piece)
        if i is not None:
            pairs.append((j, i))
    if not pairs:
        raise ValueError("the two tokenizers share no piece: an assistant with another "
                         "vocabulary drafts the shared pieces, and there are none")
    d, t = np.array(sorted(pairs), dtype=np.int64).T
    return d, t


def check_tokenizers(tokenizers) -> tuple:
    """``tokenizers`` as ``(tokenizer, assistant_tokenizer)``, else ``TypeError``."""
    if (not isinstance(tokenizers, (tuple, list)) or len(tokenizers) != 2
            or not all(callable(t) and hasattr(t, "get_vocab") for t in tokenizers)):
        raise TypeError("tokenizers= must be (tokenizer, assistant_tokenizer): the target's and "
                        "the assistant's Hugging Face tokenizers")
    return tuple(tokenizers)


def check_proposal(proposal: str, cross_vocab: bool) -> str:
    """``proposal`` if the run can use it, else ``ValueError`` naming the fix."""
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal={proposal!r}: choose one of {PROPOSALS}")
    if proposal != "intersection" and not cross_vocab:
        raise ValueError(f"proposal={proposal!r} is for an assistant with another tokenizer: "
                         "pass tokenizers=(tokenizer, assistant_tokenizer)")
    return proposal


class Retokenizer:
    """The assistant's side of a run across vocabularies (module doc): each row's target
    tokens and what the assistant's cache holds of its re-encoded text.

    ``vocab_size``: the target's logits width; ``draft_size``: the assistant's; ``prompts``:
    each row's prompt tokens (padding removed).
    """

    def __init__(self, tokenizers, vocab_size: int, draft_size: int,
                 prompts: list[list[int]], device: torch.device,
                 proposal: str = "intersection") -> None:
        self.tokenizer, self.assistant_tokenizer = check_tokenizers(tokenizers)
        self.proposal = proposal
        d, t = shared_token_ids(self.tokenizer, self.assistant_tokenizer)
        keep = (d < draft_size) & (t < vocab_size)
        d, t = torch.from_numpy(d[keep]).to(device), torch.from_numpy(t[keep]).to(device)
        self.draft_cols, self.target_cols = d, t
        self.to_draft = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
        self.to_draft[t] = d
        self.vocab_size = vocab_size
        self.context = [list(p) for p in prompts]      # each row's target tokens
        self.cached: list[list[int]] = [[] for _ in prompts]   # what the assistant holds

    def logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """``[R, V_assistant]`` -> ``[R, V_target]``: the shared pieces' logits at their target
        ids, ``-inf`` elsewhere (the restriction; the softmax renormalises)."""
        out = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        out[:, self.target_cols] = draft_logits[:, self.draft_cols]
        return out

    def draft_ids(self, x: torch.Tensor) -> torch.Tensor:
        """The assistant's ids of drafted target tokens ``x`` (shared pieces only)."""
        return self.to_draft[x]

    def encode(self, ids: list[int]) -> list[int]:
        """The assistant's tokens of the text of target tokens ``ids``."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        out = self.assistant_tokenizer(text).input_ids
        if not out:
            raise ValueError("a prompt has no text the assistant's tokenizer encodes (only "
                             "special tokens?); give each row some text")
        return list(out)

    def sync(self, cache: RaggedCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Drop from ``cache`` what no longer prefixes each row's re-encoded context; return
        the feed ``(tokens, real)`` ``[R, m]`` of the rest (left-padded with holes, so that
        every row's last column is its last token). At least the last token is fed: its
        logits are the first draft's law."""
        drop, rest = [], []
        for r, ctx in enumerate(self.context):
            new, old = self.encode(ctx), self.cached[r]
            m = min(common_prefix(new, old), len(new) - 1)
            drop.append(len(old) - m)
            rest.append(new[m:])
            self.cached[r] = new
        dev = cache.mask.device
        cache.drop_last(torch.tensor(drop, dtype=torch.long, device=dev))
        width = max(len(x) for x in rest)
        tokens = torch.zeros(len(rest), width, dtype=torch.long, device=dev)
        real = torch.zeros_like(tokens)
        for r, x in enumerate(rest):
            tokens[r, width - len(x):] = torch.tensor(x, dtype=torch.long)
            real[r, width - len(x):] = 1
        return tokens, real

    def candidate(self, r: int, own: list[int], gamma: int) -> list[int]:
        """Row ``r``'s ``gamma`` target tokens from the assistant's drafted ids ``own``
        (``"retokenized"``, module doc)."""
        text = self.tokenizer.decode(self.context[r], skip_special_tokens=True)
        drafted = self.assistant_tokenizer.decode(own, skip_special_tokens=True)
        base = self.tokenizer(text, add_special_tokens=False).input_ids
        full = self.tokenizer(text + drafted, add_special_tokens=False).input_ids
        # the drafted text must continue the row's tokens, not merge into its last one
        out = list(full[len(base):-1][:gamma]) if full[:len(base)] == base else []
        return out + [out[-1] if out else self.context[r][-1]] * (gamma - len(out))

    def drafted(self, fed: torch.Tensor) -> None:
        """Record the assistant ids ``fed [R, j]`` this step appended to every row."""
        for r, x in enumerate(fed.tolist()):
            self.cached[r].extend(x)

    def emitted(self, tokens: list[list[int]]) -> None:
        """Append each row's emitted target tokens to its context."""
        for ctx, x in zip(self.context, tokens, strict=True):
            ctx.extend(x)

    def select(self, rows: list[int]) -> None:
        """Keep the given rows (those that did not stop)."""
        self.context = [self.context[r] for r in rows]
        self.cached = [self.cached[r] for r in rows]


def retokenized_chain(draft: RaggedCache, retok: Retokenizer, feed: tuple[torch.Tensor, ...],
                      gamma: int, seeds: torch.Tensor, starts: torch.Tensor,
                      temperature: float | None, do_sample: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``"retokenized"`` proposal for every row (module doc): the assistant samples
    ``gamma + 1`` of its own tokens at ``temperature`` (its argmax without ``do_sample``), drawn by
    inverse CDF with ``U(seed, t, STREAM_DRAFT, i)`` as every drafter here draws
    (:mod:`.drafting`), then each row's text gives its candidate. ``feed``: what the
    assistant's cache lacks (:meth:`Retokenizer.sync`); ``seeds``, ``starts`` ``[A]``.
    Returns ``drafts [A, 1, gamma]`` (target ids) and their point masses ``q [A, 1, gamma,
    V]`` (module doc)."""
    n = gamma + 1                                       # the last target token is dropped
    u = uniforms(seeds, starts, n, stream=STREAM_DRAFT).to(feed[0].device)       # [A, n]
    tokens, real = feed
    own = []
    for i in range(n):
        logits = draft.forward(tokens, real, last_only=True)[:, 0]
        if do_sample:
            x = sample_rows(torch.softmax(logits / (temperature or 1.0), -1), u[:, i])
        else:
            x = logits.argmax(-1)
        own.append(x)
        tokens, real = x.unsqueeze(1), torch.ones_like(x).unsqueeze(1)
    own_ids = torch.stack(own, 1)                                                # [A, n]
    retok.drafted(own_ids[:, :n - 1])             # the assistant was fed all but the last
    drafts = torch.tensor([retok.candidate(r, x, gamma) for r, x in enumerate(own_ids.tolist())],
                          dtype=torch.long, device=own_ids.device).view(-1, 1, gamma)
    q = torch.zeros(*drafts.shape, retok.vocab_size, device=drafts.device)
    q.scatter_(-1, drafts.unsqueeze(-1), 1.0)
    return drafts, q
