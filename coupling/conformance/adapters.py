r"""Adapters that put other verifiers' calling conventions behind the checker's protocol.

Batched torch verifiers
-----------------------
Engines verify a batch of requests at once. :func:`from_torch` wraps any callable

``fn(drafts, p, q, generator) -> (accepted, branch, next_token)``

with ``drafts`` int64 ``[B, k, gamma]``, ``p`` ``[B, k, gamma + 1, V]``, ``q`` ``[B, k, gamma,
V]`` (the checker's laws as tensors of ``dtype`` on ``device``) and a seeded
``torch.Generator``; it returns three ``[B]`` integer tensors (or any object with those
attributes, such as this package's ``Verdict``). Request ``b`` then emits
``drafts[b, branch[b], :accepted[b]]`` followed by ``next_token[b]``. The checker hands a
batched verifier all its unfinished generation loops in one call, so a torch verifier runs
at batch speed. :func:`torch_rule` wraps this package's own twins (``coupling.verify``).

Hugging Face transformers
-------------------------
:func:`hf_speculative_sampling` runs ``transformers.generation.utils._speculative_sampling``
(token verification, one branch) on the checker's laws: ``candidate_logits = log q``,
``new_logits = log p`` (``-inf`` where a probability is 0, which its softmax maps back to 0),
``candidate_input_ids`` the drafted block. It draws from torch's global generator, so each
call runs inside ``torch.random.fork_rng`` seeded from the checker's numpy generator: the
check is reproducible and the caller's global torch state is left alone.

:func:`hf_assisted_generation` checks Hugging Face's whole assisted generation in loop mode
(:func:`check_generation`), the drafting included: ``model.generate(..., assistant_model=,
do_sample=True)``, with ``tokenizer=`` and ``assistant_tokenizer=`` when the two models
tokenize differently (transformers then drafts on the pieces both vocabularies hold, Timor et
al.'s TLI). It returns the pair (the target's law after ``prompt`` and each context, from its
logits in float64) and the generation loop, so the reference is the model's own law.

On a CPU the adapters run the wrapped call with one intra-op thread (restored after): the
tensors are tiny, and on a loaded machine several threads make each small op wait for the
others rather than run faster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ..rules import verify
from .pairs import Pair

__all__ = ["TorchVerifier", "from_torch", "torch_rule", "hf_speculative_sampling",
           "hf_assisted_generation"]


@contextmanager
def _one_thread(device) -> Iterator[None]:
    import torch

    if torch.device(device).type != "cpu":
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _unpack(result):
    if all(hasattr(result, a) for a in ("accepted", "branch", "next_token")):
        return result.accepted, result.branch, result.next_token
    try:
        accepted, branch, next_token = tuple(result)[:3]
    except (TypeError, ValueError):
        raise TypeError(
            "a batched verifier must return (accepted, branch, next_token) tensors of shape [B] "
            f"or an object with those attributes, got {type(result).__name__}"
        ) from None
    return accepted, branch, next_token


def _as_numpy(x, name: str, B: int) -> np.ndarray:
    arr = np.asarray(x.detach().cpu() if hasattr(x, "detach") else x).reshape(-1)
    if arr.shape != (B,) or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer tensor of shape [B] = [{B}], got "
                         f"{arr.dtype} {arr.shape}")
    return arr.astype(np.int64)


class TorchVerifier:
    """A batched torch verifier behind the checker's protocol (see :func:`from_torch`)."""

    batched = True

    def __init__(self, fn: Callable, *, dtype=None, device="cpu", name: str | None = None,
                 ragged: bool = False, greedy: bool = False):
        import torch

        self.fn = fn
        self.dtype = torch.float32 if dtype is None else dtype
        if not (isinstance(self.dtype, torch.dtype) and self.dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch dtype (torch.float32, "
                            f"torch.bfloat16, ...), got {dtype!r}")
        self.device = torch.device(device)
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.layout = "ragged" if ragged else "call"
        self.greedy = bool(greedy)

    def step(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
             rng: np.random.Generator, *, num_drafts: np.ndarray | None = None,
             greedy: np.ndarray | None = None) -> list[np.ndarray]:
        """Verify ``B`` requests in one call; return each request's emitted tokens.

        ``num_drafts [B]``: each row's own draft length (a ragged batch, padded to
        ``drafts.shape[2]``); ``greedy [B]``: the rows that decode greedily. Each reaches
        ``fn`` as a keyword of the same name, and only when given."""
        import torch

        B, k, G = drafts.shape
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(rng.integers(2**63 - 1)))
        extra = {name: torch.as_tensor(v, device=self.device)
                 for name, v in (("num_drafts", num_drafts), ("greedy", greedy))
                 if v is not None}
        with _one_thread(self.device):
            res = self.fn(torch.as_tensor(drafts, device=self.device),
                          torch.as_tensor(p, dtype=self.dtype, device=self.device),
                          torch.as_tensor(q, dtype=self.dtype, device=self.device), gen,
                          **extra)
        acc, br, nxt = (_as_numpy(t, n, B) for t, n in
                        zip(_unpack(res), ("accepted", "branch", "next_token"), strict=True))
        most = np.full(B, G) if num_drafts is None else np.asarray(num_drafts)
        if ((acc < 0) | (acc > most)).any() or ((br < 0) | (br >= k)).any():
            b = int(np.flatnonzero((acc < 0) | (acc > most) | (br < 0) | (br >= k))[0])
            raise ValueError(f"a batched verifier returned accepted = {acc[b]} for request "
                             f"{b} of {int(most[b])} drafts (or branch {br[b]} outside "
                             f"[0, {k})): accepted must lie in [0, that request's drafts]")
        return [np.append(drafts[b, br[b], :acc[b]], nxt[b]) for b in range(B)]

    def __call__(self, drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
        """One request through the batched call (``B = 1``)."""
        return self.step(drafts[None], p[None], q[None], rng)[0]


def from_torch(fn: Callable, *, dtype=None, device="cpu", name: str | None = None,
               ragged: bool = False, greedy: bool = False):
    """Wrap a batched torch verifier ``fn(drafts, p, q, generator)`` (see the module doc).

    ``dtype``: the laws' dtype, ``torch.float32`` by default as engines run them
    (``torch.bfloat16`` and ``torch.float64`` also work). ``ragged=True``: ``fn`` also takes
    ``num_drafts`` int64 ``[B]``, each request's own draft length, with the batch padded
    adversarially past it (:func:`coupling.conformance.loop.pad_trees`). ``greedy=True``:
    ``fn`` also takes ``greedy`` bool ``[B]`` in every call, and greedy requests ride beside
    the sampled ones; a greedy request must emit the target's argmax tokens.
    """
    if not callable(fn):
        raise TypeError(f"from_torch needs a callable, got {type(fn).__name__}")
    return TorchVerifier(fn, dtype=dtype, device=device, name=name, ragged=ragged,
                         greedy=greedy)


def torch_rule(rule: str, *, replacement: bool = True, dtype=None, device="cpu"):
    """This package's batched twin ``coupling.verify(rule, ...)`` as a checker verifier.

    Each call keys the twin's counter-based randomness by fresh seeds from the generator.
    """
    import torch


    extra = {} if replacement else {"replacement": False}

    def fn(drafts, p, q, generator):
        B = drafts.shape[0]
        seeds = torch.randint(0, 2**62, (B,), generator=generator, device=drafts.device)
        return verify(rule, drafts, p, q, seeds=seeds,
                      positions=torch.zeros(B, dtype=torch.int64, device=drafts.device),
                      **extra)

    return TorchVerifier(fn, dtype=dtype, device=device, name=f"coupling.verify({rule!r})")


def hf_speculative_sampling(fn: Callable | None = None, **kwargs):
    """Hugging Face's ``_speculative_sampling`` as a one-branch verifier (see the module doc).

    ``fn`` defaults to the installed ``transformers.generation.utils._speculative_sampling``;
    ``kwargs`` are passed through (``assistant_ensemble_weight=...`` for its lossy variant).
    """
    import torch

    if fn is None:
        from transformers.generation.utils import _speculative_sampling as fn

    def verify(drafts: np.ndarray, p: np.ndarray, q: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
        if drafts.shape[0] != 1:
            raise ValueError("_speculative_sampling verifies one branch: run the check with k=1")
        g = drafts.shape[1]
        with np.errstate(divide="ignore"):
            log_q, log_p = np.log(q[0])[None], np.log(p[0])[None]
        with torch.random.fork_rng(devices=[]), _one_thread("cpu"):
            torch.default_generator.manual_seed(int(rng.integers(2**63 - 1)))
            tokens, _ = fn(torch.as_tensor(drafts[0])[None], torch.from_numpy(log_q), g,
                           torch.from_numpy(log_p), **kwargs)
        return tokens[0].numpy()

    verify.name = "transformers _speculative_sampling" + (f" {kwargs}" if kwargs else "")
    return verify


def hf_assisted_generation(model, assistant_model, prompt, *, tokenizer=None,
                           assistant_tokenizer=None, **generate_kwargs):
    """``(pair, generate)`` for :func:`check_generation`: Hugging Face assisted generation of
    ``model`` with ``assistant_model`` after the token ids ``prompt`` (see the module doc).

    ``tokenizer`` and ``assistant_tokenizer`` go to ``generate`` together (assisted generation
    across vocabularies), ``generate_kwargs`` as they are (``assistant_ensemble_weight=0.5``
    for DIVERSE's lossy ensemble). The pair's draft is the assistant's law after the prompt
    alone (the loop drafts by itself and does not read it). Every loop seeds torch's global
    generator from the checker's, inside ``torch.random.fork_rng``.
    """
    import torch

    if (tokenizer is None) != (assistant_tokenizer is None):
        raise ValueError("pass tokenizer and assistant_tokenizer together (two vocabularies), "
                         "or neither (one vocabulary)")
    head = [int(t) for t in prompt]
    if not head:
        raise ValueError("prompt is empty: give at least one token id")
    cross = {} if tokenizer is None else dict(tokenizer=tokenizer,
                                              assistant_tokenizer=assistant_tokenizer)

    def law(lm, ids: list[int]) -> np.ndarray:
        with torch.no_grad(), _one_thread("cpu"):
            logits = lm(torch.tensor([ids])).logits[0, -1].double()
        return torch.softmax(logits, -1).numpy()

    def target(context) -> np.ndarray:
        return law(model, head + [int(t) for t in context])

    def draft(context) -> np.ndarray:
        return law(assistant_model, [int(t) for t in
                                     (assistant_tokenizer(tokenizer.decode(head)).input_ids
                                      if cross else head)])

    def generate(tlogits, dlogits, context, max_new_tokens, rng) -> list[int]:
        ids = torch.tensor([head + [int(t) for t in context]])
        with torch.random.fork_rng(devices=[]), torch.no_grad(), _one_thread("cpu"):
            torch.manual_seed(int(rng.integers(2**63 - 1)))
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 assistant_model=assistant_model, do_sample=True,
                                 max_new_tokens=max_new_tokens, **cross, **generate_kwargs)
        return out[0, ids.shape[1]:].tolist()

    name = "transformers assisted generation" + (" across vocabularies" if cross else "")
    generate.name = name + (f" {generate_kwargs}" if generate_kwargs else "")
    return Pair(name, f"after prompt {head}", target, draft), generate
