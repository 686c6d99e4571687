"""A feature-level draft for the SmolLM2 target (EAGLE-style), and its drafter for the engine.

Why
---
A token-level draft must guess the target's next-token law from the text alone; the trained
1-layer draft of :mod:`coupling.llm.models` reaches a mean overlap sum_x min(p, q) of only
about 0.25-0.3. The target's own last hidden state already *is* its next-token law (the LM head
is linear in it), so a draft that predicts the target's next hidden state from the current one
has a much easier job (Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", ICML 2024).

Model
-----
Write ``f_j`` for the target's final-normed hidden state at position ``j`` (so the target's law
of token ``x_{j+1}`` is ``softmax(W f_j / T)`` with ``W`` its LM head) and ``e(x)`` for its token
embedding. The draft reads the pair ``(x_i, f_{i-1})`` at position ``i`` and predicts ``f_i``:

    f^_i = norm( Layer( fc([e(x_i); f_{i-1}]) ) ),    q(x_{i+1}) = softmax(W f^_i / T)

with ``fc`` a linear map 2d -> d, ``Layer`` one Llama decoder layer with its own KV cache over
the pairs, and ``norm``, ``e`` and ``W`` the target's own tensors (shared, frozen). Drafting
``gamma`` tokens after the committed text ``x_0 .. x_{L-1}`` feeds the pairs whose feature the
target has computed (``f_{i-1}`` for ``i <= L - 1``), samples ``x^_L`` from ``q``, and then feeds
``(x^_L, f^_{L-1})``, i.e. its own predicted feature, for the next positions.

Only ``fc`` and the layer are trained (``scripts/train_feature_draft.py``) and shipped
(``coupling/data/feature_draft_smollm2.safetensors``). The draft needs the target's hidden
states, so it is a drafter of *this engine*; Hugging Face assisted generation cannot run it (its
fair baseline is the token-level draft, :func:`coupling.llm.models.load_draft`).

Losslessness does not depend on any of this: ``q`` is the law the drafts were sampled from,
whatever produced it, and every rule verifies against the target's ``p``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from .models import DATA_DIR, DraftSpec, SubsetHead, build_draft, head_ranking, write_weights
from .sampling import SamplingConfig, probs

FEATURE_DRAFT_WEIGHTS = DATA_DIR / "feature_draft_smollm2.safetensors"


class FeatureDraft(torch.nn.Module):
    """``fc`` + one Llama decoder layer on top of the target's features (see module docstring).

    ``head`` is the target's LM head or a :class:`coupling.llm.models.SubsetHead` of it. The
    target's embeddings, final norm, rotary tables and head are referenced, not copied.
    """

    def __init__(self, target, init_layer: int | None = None) -> None:
        super().__init__()
        tcfg = target.config
        d = tcfg.hidden_size
        src = tcfg.num_hidden_layers - 1 if init_layer is None else init_layer
        # the body of a 1-layer token-level draft: its own layer (a copy of target layer src),
        # the target's embeddings, final norm and rotary tables (shared)
        self.body = build_draft(target, DraftSpec(1, (src,))).model
        self.fc = torch.nn.Linear(2 * d, d, bias=True, device=target.device, dtype=target.dtype)
        with torch.no_grad():
            # start as "the previous feature, nudged by the token": a sane point for training
            self.fc.weight.zero_()
            self.fc.weight[:, d:] = torch.eye(d, dtype=target.dtype)
            self.fc.weight[:, :d] = 0.1 * torch.eye(d, dtype=target.dtype)
            self.fc.bias.zero_()
        self.head = target.lm_head
        self.vocab_size = tcfg.vocab_size

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors only (``fc`` and the decoder layer)."""
        sd = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        sd.update({f"layer.{k}": v for k, v in self.body.layers[0].state_dict().items()})
        return {k: v.detach().contiguous() for k, v in sd.items()}

    def features(self, ids: torch.Tensor, feats: torch.Tensor, cache=None) -> torch.Tensor:
        """Predicted features f^ [B, n, d] for pairs (ids [B, n], feats [B, n, d]).

        With ``cache`` (a ``DynamicCache``) the pairs are appended to it; positions continue
        from the cache length, as in the target.
        """
        e = self.body.embed_tokens(ids)
        x = self.fc(torch.cat([e, feats.to(e.dtype)], -1))
        out = self.body(inputs_embeds=x, cache=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def logits(self, feat: torch.Tensor) -> torch.Tensor:
        """Next-token logits [.., V] from features (``-inf`` outside a subset head)."""
        return self.head(feat)


def save_feature_draft(draft: FeatureDraft, path: Path = FEATURE_DRAFT_WEIGHTS,
                       meta: dict | None = None,
                       head_tokens: torch.Tensor | None = None) -> Path:
    """Write the trained tensors (bf16 safetensors) and a ``.json`` sidecar with ``meta``."""
    return write_weights(draft.own_state_dict(), path, meta, head_tokens)


def load_feature_draft(target, path: Path | None = None,
                       head_tokens: int | None = 0) -> FeatureDraft:
    """Rebuild a feature draft on ``target`` from ``path`` (default: ``$COUPLING_FEATURE_DRAFT``,
    else the shipped weights); ``head_tokens`` > 0 restricts its head to that many tokens of the
    file's ranking (as :func:`coupling.llm.models.load_draft`)."""
    from safetensors import safe_open

    if path is None:
        path = Path(os.environ.get("COUPLING_FEATURE_DRAFT", FEATURE_DRAFT_WEIGHTS))
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"feature-draft weights {path} are missing; reproduce them with "
                                "`python scripts/train_feature_draft.py`")
    with safe_open(str(path), framework="pt") as f:
        own = {k: f.get_tensor(k) for k in f.keys()}
    draft = FeatureDraft(target)
    want = set(draft.own_state_dict())
    if not want <= set(own):
        raise ValueError(f"{path} lacks tensors {sorted(want - set(own))[:4]}; retrain it")
    with torch.no_grad():
        for k, v in draft.fc.state_dict().items():
            v.copy_(own[f"fc.{k}"].to(v.dtype))
        for k, v in draft.body.layers[0].state_dict().items():
            v.copy_(own[f"layer.{k}"].to(v.dtype))
    if head_tokens:
        ranking = head_ranking(own, path, head_tokens).to(target.device)
        draft.head = SubsetHead(target.lm_head.weight, ranking)
    return draft.eval()


class FeatureDrafter:
    """Engine drafter around a :class:`FeatureDraft`; reads the target's features.

    :func:`coupling.llm.engine.generate` sees ``needs_target_features`` and makes the target's
    :class:`~coupling.llm.engine.CachedLM` keep its final hidden states; ``bind`` hands that
    ``CachedLM`` over. The draft cache holds pairs ``(x_i, f_{i-1})``, i >= 1, at position
    ``i - 1``; only pairs fed with the *target's* features survive from one call to the next
    (drafted pairs carry predicted features and are cropped away).
    """

    needs_target_features = True

    def __init__(self, draft: FeatureDraft, name: str = "feature") -> None:
        from transformers import DynamicCache

        self.draft, self.name = draft, name
        self.cache = DynamicCache()
        self.true_pairs = 0          # leading cache entries fed with the target's features
        self.seq: list[int] = []     # committed tokens those pairs were computed from
        self.rows = 1
        self.target = None
        self.calls, self.seconds = 0, 0.0

    def bind(self, target) -> None:
        self.target = target

    def reset(self, prompt: list[int]) -> None:
        from transformers import DynamicCache

        self.cache, self.true_pairs, self.seq, self.rows = DynamicCache(), 0, [], 1

    def _crop(self, n: int) -> None:
        held = self.cache.get_seq_length()
        if held > n:
            self.cache.crop(-(held - n))  # transformers 5.x: a negative count of tokens to drop

    @torch.no_grad()
    def _feed(self, ids: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append pairs; return the last position's predicted feature [rows, d] and logits."""
        t0 = time.perf_counter()
        f = self.draft.features(ids, feats, self.cache)[:, -1]
        logits = self.draft.logits(f)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return f, logits

    @torch.no_grad()
    def propose(self, seq, gamma, k, cfg: SamplingConfig, gen, *, distinct_first=False,
                gumbel=None):
        from .engine import sample_chain

        if self.target is None:
            raise RuntimeError("FeatureDrafter.bind(target) was not called; use engine.generate")
        tgt = self.target
        L = len(seq)
        # the target must hold the committed text up to x_{L-2} with its features
        if len(tgt.tokens) != 1 or tgt.tokens[0][: L - 1] != seq[: L - 1] or tgt.feats is None:
            raise RuntimeError("the target cache does not hold seq[:-1] with features")
        if self.rows != 1:
            raise RuntimeError("accept(branch) was not called after the last proposal")
        if L < 2:           # no target feature yet: nothing to draft from
            dev = gen.device
            return (torch.zeros(k, 0, dtype=torch.long, device=dev),
                    torch.zeros(k, 0, self.draft.vocab_size, device=dev))
        # pair i needs f_{i-1} and x_i, so it stays valid while x_0 .. x_i are unchanged
        common = 0
        for a, b in zip(self.seq, seq, strict=False):
            if a != b:
                break
            common += 1
        n = max(0, min(self.true_pairs, L - 1, common - 1))
        n = min(n, L - 2)   # feed at least one pair: its output is the next law
        self._crop(n)
        dev = tgt.feats.device
        ids = torch.tensor([seq[n + 1: L]], device=dev)                  # pairs n+1 .. L-1
        feats = tgt.feats[:, n: L - 1]                                   # f_n .. f_{L-2}
        fhat, logits = self._feed(ids, feats)                            # [1, d], [1, V]
        self.true_pairs, self.seq = L - 1, list(seq)
        state = {"f": fhat}

        def expand(rows: int) -> None:
            if rows != 1:
                self.cache.batch_repeat_interleave(rows)
                state["f"] = state["f"].expand(rows, -1).contiguous()
            self.rows = rows

        def step(x: torch.Tensor) -> torch.Tensor:
            state["f"], lg = self._feed(x[:, None], state["f"][:, None])  # [k, d], [k, V]
            return probs(lg, cfg)

        return sample_chain(probs(logits, cfg), step, expand, gamma, k, gen,
                            distinct_first=distinct_first, gumbel=gumbel)

    def accept(self, branch: int) -> None:
        if self.rows != 1:
            self.cache.batch_select_indices(
                torch.tensor([branch], device=self.target.feats.device))
            self.rows = 1
        self._crop(self.true_pairs)
