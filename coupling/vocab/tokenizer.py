"""Small tokenizers with a canonical encoding, for drafts in another vocabulary.

A :class:`Tokenizer` is a tuple of *pieces* (token id -> string). Its canonical encoding is
greedy longest match, left to right, the rule WordPiece and many byte-level BPE vocabularies
agree with on short strings; decoding concatenates the pieces. Every single character of the
alphabet must be a piece, so every string over the alphabet encodes. Two tokenizers of one
alphabet tokenize the same text differently: with pieces ``a b c ab bc`` and ``a b c ca``,
``"abca"`` is ``ab c a`` in the first and ``a b ca`` in the second.

Greedy longest match reads at most :attr:`Tokenizer.max_len` characters ahead, so the first
``n`` tokens of a string's encoding are final (no continuation of the string changes them)
once the string runs ``max_len - 1`` characters past their end (:meth:`Tokenizer.final`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

__all__ = ["Tokenizer", "shared_pieces", "toy_tokenizers", "to_transformers"]


@dataclass(frozen=True)
class Tokenizer:
    """Pieces ``pieces[i]`` (the string of token ``i``), encoded by greedy longest match.

    >>> tok = Tokenizer(("a", "b", "c", "ab", "bc"))
    >>> tok.encode("abca"), tok.decode((3, 2, 0))
    ((3, 2, 0), 'abca')
    """

    pieces: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.pieces, str) or not isinstance(self.pieces, Sequence):
            raise TypeError("pieces must be a tuple of strings, e.g. ('a', 'b', 'ab')")
        pieces = tuple(self.pieces)
        if not pieces or not all(isinstance(p, str) and p for p in pieces):
            raise ValueError("pieces must be non-empty strings, at least one")
        if len(set(pieces)) != len(pieces):
            raise ValueError(f"pieces repeat a string: {pieces}; each piece once")
        missing = sorted({ch for p in pieces for ch in p} - set(pieces))
        if missing:
            raise ValueError(f"every character must be a piece of its own, so that every "
                             f"string encodes; add the pieces {missing}")
        object.__setattr__(self, "pieces", pieces)

    @property
    def size(self) -> int:
        """The vocabulary size."""
        return len(self.pieces)

    @cached_property
    def max_len(self) -> int:
        """The longest piece, in characters."""
        return max(len(p) for p in self.pieces)

    @cached_property
    def _ids(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.pieces)}

    def encode(self, text: str) -> tuple[int, ...]:
        """The canonical token ids of ``text`` (greedy longest match)."""
        out, at = [], 0
        while at < len(text):
            for n in range(min(self.max_len, len(text) - at), 0, -1):
                t = self._ids.get(text[at:at + n])
                if t is not None:
                    out.append(t)
                    at += n
                    break
            else:
                raise ValueError(f"character {text[at]!r} of text is not a piece; the "
                                 f"alphabet is {sorted(set(''.join(self.pieces)))}")
        return tuple(out)

    def decode(self, ids: Sequence[int]) -> str:
        """The string of the token ids ``ids``."""
        return "".join(self.pieces[int(i)] for i in ids)

    def final(self, text: str, n: int) -> tuple[int, ...] | None:
        """The first ``n`` tokens of ``encode(text)`` if no continuation of ``text`` can change
        them (module doc), else ``None``.

        >>> tok = Tokenizer(("a", "b", "c", "ab", "bc"))
        >>> tok.final("ab", 1), tok.final("abc", 1)
        (None, (3,))
        """
        ids = self.encode(text)
        if len(ids) < n:
            return None
        end = len(self.decode(ids[:n]))
        return ids[:n] if len(text) >= end + self.max_len - 1 else None


def shared_pieces(target: Tokenizer, draft: Tokenizer) -> dict[int, int]:
    """``{draft id: target id}`` for the pieces both vocabularies hold.

    >>> shared_pieces(*toy_tokenizers())
    {0: 0, 1: 1, 2: 2}
    """
    ids = {p: i for i, p in enumerate(target.pieces)}
    return {j: ids[p] for j, p in enumerate(draft.pieces) if p in ids}


def toy_tokenizers() -> tuple[Tokenizer, Tokenizer]:
    """``(target, draft)`` over the alphabet ``abc``: the target merges ``ab`` and ``bc``, the
    draft merges ``ca``; they share the three characters."""
    return Tokenizer(("a", "b", "c", "ab", "bc")), Tokenizer(("a", "b", "c", "ca"))


def to_transformers(tok: Tokenizer):
    """``tok`` as a Hugging Face ``PreTrainedTokenizerFast`` (ids kept), to run an engine's
    own cross-vocabulary code on the toy vocabularies.

    A BPE model whose merges build each two-character piece from its characters, in piece
    order, and a decoder that concatenates; on :func:`toy_tokenizers` it encodes as ``tok``
    does (greedy longest match). Needs the ``tokenizers`` and ``transformers`` packages.
    """
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"tok must be a coupling.vocab.Tokenizer, got {type(tok).__name__}")
    if tok.max_len > 2:
        raise ValueError("to_transformers builds merges for pieces of at most two characters; "
                         f"{tok.pieces} has longer ones")
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {p: i for i, p in enumerate(tok.pieces)}
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=[(p[0], p[1]) for p in tok.pieces
                                                       if len(p) == 2]))
    raw.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=raw, clean_up_tokenization_spaces=False)
