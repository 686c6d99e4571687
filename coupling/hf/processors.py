"""The generation config's logits processors, applied identically to target and draft.

A verification rule is lossless for the laws it is given: ``q`` must be the law each draft was
sampled from and ``p`` the law plain sampling would use at the same place. Both are therefore
computed by one function, :meth:`Laws.__call__`, from a model's raw logits and the *same*
token sequence: the row as plain ``generate`` would hold it at that token (the prompt with its
left padding, the tokens generated so far, then the drafted prefix of the branch). Processors
that read the sequence (repetition penalty, no-repeat n-grams, min length, ...) thus see each
drafted prefix as the context of the next token, for the draft and for the target alike.

Every processor is called as a *row-wise* function of ``(input_ids, scores)``:
row ``i`` of its output may depend only on row ``i`` of its inputs, and on nothing else (no
state carried between calls): it is called once per row, branch and drafted position, for
both models, on batches of rows that share a sequence length, in any order. Hugging Face's
processors that meet this are listed below; any other processor of the ``transformers``
package is refused with a ``ValueError`` (classifier-free guidance runs the target model itself
with a cache of its own; ``prefix_allowed_tokens_fn`` reads the batch index; the encoder and
SynthID processors keep per-batch or per-call state). The one per-row datum a listed processor
holds, the repetition penalty's count of left-padding columns to ignore (``generate`` sets it
so that padding is not penalised), is handed to each call for the rows it holds. A processor
of the user's own is applied under the row-wise contract above.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch
from transformers.generation import logits_process as lp

__all__ = ["Laws", "CONTEXT_FREE", "ROW_WISE", "check_processors"]


def _classes(*names: str) -> tuple[type, ...]:
    # the classes of this transformers version (TopH, for one, is recent)
    return tuple(getattr(lp, n) for n in names if hasattr(lp, n))


#: processors that never read ``input_ids``: applied to every row in one call
CONTEXT_FREE: tuple[type, ...] = _classes(
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "TopHLogitsWarper",
    "MinPLogitsWarper", "TypicalLogitsWarper", "EpsilonLogitsWarper", "EtaLogitsWarper",
    "SuppressTokensLogitsProcessor", "InfNanRemoveLogitsProcessor", "LogitNormalization",
)
#: processors of ``transformers`` that are row-wise functions of the sequence (its tokens and
#: its length): applied to groups of rows of one length
ROW_WISE: tuple[type, ...] = _classes(
    "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "SequenceBiasLogitsProcessor", "NoBadWordsLogitsProcessor", "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "ForcedBOSTokenLogitsProcessor",
    "ForcedEOSTokenLogitsProcessor", "ExponentialDecayLengthPenalty",
    "SuppressTokensAtBeginLogitsProcessor", "WatermarkLogitsProcessor",
)


def _per_row_ignore(proc: object) -> torch.Tensor | None:
    """The repetition penalty's per-row count of leading columns to ignore (``generate`` passes
    each row's left padding), or None."""
    if isinstance(proc, lp.RepetitionPenaltyLogitsProcessor) and isinstance(
            proc.prompt_ignore_length, torch.Tensor):
        return proc.prompt_ignore_length
    return None


def _for_rows(proc, rows: torch.Tensor):
    """``proc`` for a call on the batch rows ``rows``: a repetition penalty that ignores each
    row's left padding gets those rows' counts (the one per-row datum a known processor holds)."""
    ignore = _per_row_ignore(proc)
    if ignore is None:
        return proc
    return lp.RepetitionPenaltyLogitsProcessor(
        proc.penalty, prompt_ignore_length=ignore.to(rows.device)[rows])


def _refusal(proc: object, batch_size: int) -> str | None:
    """Why ``proc`` cannot be applied identically to both models, row by row (None if it can)."""
    cls = type(proc)
    if isinstance(proc, CONTEXT_FREE):
        return None
    ignore = _per_row_ignore(proc)
    if ignore is not None and tuple(ignore.shape) != (batch_size,):
        return (f"its prompt_ignore_length has shape {tuple(ignore.shape)}, not one entry per "
                f"batch row ({batch_size})")
    if isinstance(proc, ROW_WISE):
        return None
    if not callable(proc):
        return "it is not callable"
    if len(inspect.signature(proc).parameters) > 2:
        return "it needs keyword arguments beyond (input_ids, scores)"
    if cls.__module__.startswith("transformers."):
        return ("it is not known to be a row-wise function of (input_ids, scores) without state "
                "between calls (it reads the batch layout, runs a model, or keeps state), so the "
                "draft's law could not be computed as the target's")
    return None  # a user's processor: applied under the row-wise contract (module doc)


def check_processors(processors: Iterable, batch_size: int) -> list:
    """The processors as a list, or ``ValueError`` naming the first one that is refused."""
    out = list(processors)
    for proc in out:
        why = _refusal(proc, batch_size)
        if why is not None:
            raise ValueError(
                f"logits processor {type(proc).__name__} cannot be applied identically to the "
                f"target and the draft: {why}. Drop it (or the generate argument that adds it) "
                "to verify drafts with coupling.hf.generate")
    return out


class Laws:
    """``(scores, probs) = laws(ids, lengths, rows, logits)``: processed scores and the law.

    ``ids [N, L]`` holds each sequence in its first ``lengths[n]`` columns (later columns are
    ignored), ``rows [N]`` the batch row it belongs to, ``logits [N, V]`` the model's raw
    next-token logits after it.
    ``probs`` is ``softmax(scores)`` in float32, as plain sampling computes it, or with
    ``greedy`` the point mass on ``argmax(scores)`` (the first maximum, as greedy decoding).
    """

    def __init__(self, processors: Iterable, batch_size: int, greedy: bool = False) -> None:
        self.processors = check_processors(processors, batch_size)
        self.greedy = greedy

    def __call__(self, ids: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor,
                 logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = logits.to(torch.float32)
        if self.processors:
            groups = _length_groups(lengths)
            for proc in self.processors:
                if isinstance(proc, CONTEXT_FREE):
                    scores = proc(ids[:, : int(lengths.min())], scores)
                else:
                    scores = _row_wise(proc, ids, groups, rows, scores)
        if self.greedy:
            probs = torch.zeros_like(scores).scatter_(-1, scores.argmax(-1, keepdim=True), 1.0)
        else:
            probs = torch.softmax(scores, dim=-1)
        return scores, probs


def _length_groups(lengths: torch.Tensor) -> list[tuple[int, torch.Tensor | None]]:
    """``(length, rows)`` for each distinct length (``rows`` None when all rows share it)."""
    values = torch.unique(lengths).tolist()
    if len(values) == 1:
        return [(int(values[0]), None)]
    return [(int(v), torch.nonzero(lengths == v).squeeze(1)) for v in values]


def _row_wise(proc, ids: torch.Tensor, groups, rows: torch.Tensor,
              scores: torch.Tensor) -> torch.Tensor:
    """Apply ``proc`` to each group of sequences of one length, with that many columns of
    ``ids`` (``rows``: their batch rows)."""
    if len(groups) == 1:
        return _for_rows(proc, rows)(ids[:, : groups[0][0]], scores)
    out = torch.empty_like(scores)  # every sequence belongs to one group
    for length, members in groups:
        out[members] = _for_rows(proc, rows[members])(ids[members, :length], scores[members])
    return out
