"""The library's argument names in the words of the command lines.

The functions behind ``coupling analyze`` and ``coupling conformance`` name their arguments
as Python does (``k=2``, ``replacement=True``, ``exact=False``); a message that reaches the
shell says the flag instead.

>>> flag_words("rule 'kseq' does not take k=3, replacement=False; use exact=True")
"rule 'kseq' does not take --drafts 3, --without-replacement; use --exact"
"""

from __future__ import annotations

import re

__all__ = ["FLAGS", "flag_words"]

#: (pattern of a Python argument in a message, the command line's words for it)
FLAGS: tuple[tuple[str, str], ...] = (
    (r"\bk=(\d+)", r"--drafts \1"),
    (r"\bnum_drafts=(\d+)", r"--drafts \1"),
    (r"\breplacement=True\b", "i.i.d. drafts (no --without-replacement)"),
    (r"\breplacement=False\b", "--without-replacement"),
    (r"\bexact=True\b", "--exact"),
    (r"\bexact=False\b", "the statistical mode (no --exact)"),
    (r"\bgamma=(\d+)", r"--gamma \1"),
    (r"\blength=(\d+)", r"--length \1"),
    (r"\bdraws=(\d+)", r"--draws \1"),
)


def flag_words(text: str) -> str:
    """``text`` with every Python argument of :data:`FLAGS` replaced by its flag."""
    for pattern, words in FLAGS:
        text = re.sub(pattern, words, text)
    return text
