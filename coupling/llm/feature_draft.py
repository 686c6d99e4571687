"""A feature-level draft for the SmolLM2 target (EAGLE-style), and its drafter for the engine.

Why
---
A token-level draft must guess the target's next-token law from the text alone; the trained
1-layer draft of :mod:`coupling.llm.drafts` reaches a mean overlap sum_x min(p, q) of only
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
fair baseline is the token-level draft, :func:`coupling.llm.drafts.load_draft`).

Losslessness does not depend on any of this: ``q`` is the law the drafts were sampled from,
whatever produced it, and every rule verifies against the target's ``p``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from .drafts import DraftSpec, build_draft, head_ranking, stored_logit_scale, write_weights
from .heads import SubsetHead, quantized_head_int8
from .int8 import Int8Linear, quantize_layer_int8, quantize_linears_int8
from .models import DATA_DIR
from .sampling import SamplingConfig, native_law, probs

FEATURE_DRAFT_WEIGHTS = DATA_DIR / "feature_draft_smollm2.safetensors"


class FeatureDraft(torch.nn.Module):
    """``fc`` + one Llama decoder layer on top of the target's features (see module docstring).

    ``head`` is the target's LM head or a :class:`coupling.llm.heads.SubsetHead` of it. The
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
        # stacked int8 projections for the lean path, built by quantize_int8
        self.fused: torch.nn.ModuleDict | None = None
        self.fused_sizes: list[int] = []
        # calibrated for the sampling settings (coupling.llm.calibrate); 1.0 while training
        self.logit_scale = 1.0

    def quantize_int8(self) -> FeatureDraft:
        """Weight-only int8 for ``fc``, the layer and the head (in place; see
        :class:`coupling.llm.int8.Int8Linear`). A shared full head is copied, not modified.
        For inference only: the quantized draft has no trainable weights left.

        The lean path (:meth:`_features_lean`) also gets the layer's q/k/v projections as one
        int8 matrix and gate/up as another (``fused``): the scales are per output row, so the
        stacked rows quantize exactly as they do apart, and a step runs 5 products, not 8.
        """
        lay = self.body.layers[0]
        att, mlp = lay.self_attn, lay.mlp
        qkv = (att.q_proj, att.k_proj, att.v_proj)
        if all(getattr(m, "bias", None) is None for m in qkv + (mlp.gate_proj, mlp.up_proj)):
            self.fused = torch.nn.ModuleDict({
                "qkv": Int8Linear(torch.cat([m.weight for m in qkv])),
                "gate_up": Int8Linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))})
            self.fused_sizes = [m.weight.shape[0] for m in qkv]
        quantize_linears_int8(self, ("fc",))
        quantize_layer_int8(lay)
        self.head = quantized_head_int8(self.head)
        return self

    def own_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors only (``fc`` and the decoder layer)."""
        sd = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        sd.update({f"layer.{k}": v for k, v in self.body.layers[0].state_dict().items()})
        return {k: v.detach().contiguous() for k, v in sd.items()}

    def features(self, ids: torch.Tensor, feats: torch.Tensor, cache=None) -> torch.Tensor:
        """Predicted features f^ [B, n, d] for pairs (ids [B, n], feats [B, n, d]).

        With ``cache`` the pairs are appended to it; positions continue from the cache length,
        as in the target. A :class:`PairCache` takes the lean path (:meth:`_features_lean`, what
        the drafter runs); ``None`` or a ``DynamicCache`` go through the Hugging Face body
        (training, and the reference the lean path is tested against).
        """
        e = self.body.embed_tokens(ids)
        x = self.fc(torch.cat([e, feats.to(e.dtype)], -1))
        if isinstance(cache, PairCache):
            return self._features_lean(x, cache)
        out = self.body(inputs_embeds=x, cache=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def _features_lean(self, x: torch.Tensor, cache: PairCache) -> torch.Tensor:
        """The decoder layer and final norm on x [B, n, d], written out (gpt-fast style).

        The same arithmetic as the Hugging Face layer (RMSNorm in float32, rotary embedding,
        grouped-query attention, SiLU-gated MLP), without its per-call machinery (mask
        construction, cache objects, kwargs plumbing), which a one-token draft step would pay
        in full on every call; the rest is reading the weights.
        """
        lay = self.body.layers[0]
        att = lay.self_attn
        B, n, _ = x.shape
        hd = att.head_dim
        start = cache.length
        cos, sin = cache.rotary(self.body.rotary_emb, x, start + n)
        cos, sin = cos[start:start + n], sin[start:start + n]                 # [n, hd]
        h = _rms_norm(lay.input_layernorm, x)
        if self.fused is not None:
            q, k, v = self.fused["qkv"](h).split(self.fused_sizes, -1)
        else:
            q, k, v = att.q_proj(h), att.k_proj(h), att.v_proj(h)
        q = q.view(B, n, -1, hd).transpose(1, 2)                              # [B, H, n, hd]
        k = k.view(B, n, -1, hd).transpose(1, 2)                              # [B, Hkv, n, hd]
        v = v.view(B, n, -1, hd).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = cache.append(k, v)                                     # [B, Hkv, L, hd]
        mask = None
        if n > 1:   # new position j sees every cached position and the new ones up to j
            L = keys.shape[2]
            mask = torch.arange(L, device=x.device)[None, :] <= \
                torch.arange(L - n, L, device=x.device)[:, None]              # [n, L]
        o = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=att.scaling, enable_gqa=True)
        x = x + att.o_proj(o.transpose(1, 2).reshape(B, n, -1))
        h = _rms_norm(lay.post_attention_layernorm, x)
        if self.fused is not None:
            gate, up = self.fused["gate_up"](h).chunk(2, -1)
            x = x + lay.mlp.down_proj(lay.mlp.act_fn(gate) * up)
        else:
            x = x + lay.mlp(h)
        return _rms_norm(self.body.norm, x)

    def logits(self, feat: torch.Tensor) -> torch.Tensor:
        """Next-token logits [.., V] from features (``-inf`` outside a subset head), times the
        calibrated ``logit_scale``."""
        return self._scaled(self.head(feat))

    def head_logits(self, feat: torch.Tensor) -> torch.Tensor:
        """Logits over the head's own tokens: [.., n] for a subset head, else [.., V]."""
        return self._scaled(self.head.subset_logits(feat) if isinstance(self.head, SubsetHead)
                            else self.head(feat))

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.logit_scale == 1.0 else logits * self.logit_scale

    def law(self, head_logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
        """q [.., V] from :meth:`head_logits`: ``probs`` over the head's tokens, zero elsewhere.

        The same law as ``probs(self.logits(feat), cfg)`` (tokens at ``-inf`` get probability 0
        and never enter the top-k), without building and scanning ``V - n`` logits at ``-inf``.
        """
        if isinstance(self.head, SubsetHead):
            # the compiled law is written straight into its [.., V] place (no to_vocab pass)
            q = native_law(head_logits, cfg, self.head.tokens, self.head.vocab_size)
            if q is not None:
                return q
        q = probs(head_logits, cfg)
        return self.head.to_vocab(q) if isinstance(self.head, SubsetHead) else q


def save_feature_draft(draft: FeatureDraft, path: Path = FEATURE_DRAFT_WEIGHTS,
                       meta: dict | None = None,
                       head_tokens: torch.Tensor | None = None) -> Path:
    """Write the trained tensors (bf16 safetensors) and a ``.json`` sidecar with ``meta``."""
    return write_weights(draft.own_state_dict(), path, meta, head_tokens)


def load_feature_draft(target, path: Path | None = None, head_tokens: int | None = 0,
                       int8: bool = False, logit_scale: float | None = None) -> FeatureDraft:
    """Rebuild a feature draft on ``target`` from ``path`` (default: ``$COUPLING_FEATURE_DRAFT``,
    else the shipped weights); ``head_tokens`` > 0 restricts its head to that many tokens of the
    file's ranking (as :func:`coupling.llm.drafts.load_draft`); ``int8`` stores its own weights
    and head weight-only int8 (:meth:`FeatureDraft.quantize_int8`); ``logit_scale`` ``None``
    takes the file's calibrated scale (1.0 if none), a number overrides it."""
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
    draft.logit_scale = stored_logit_scale(own, logit_scale)
    if int8:
        draft.quantize_int8()
    return draft.eval()


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama RMSNorm module's output by ``F.rms_norm``: its arithmetic (float32 statistics,
    cast back, times the weight) in 3 ops instead of its 7."""
    y = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon)
    return norm.weight * y.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PairCache:
    """Key/value store of the draft's single layer, preallocated: [rows, Hkv, capacity, hd].

    The drafter's only cache operations are append, crop to a length, repeat the one row for
    k branches and keep one row, so this replaces ``DynamicCache`` with plain tensor slicing
    (its methods keep ``DynamicCache``'s names and conventions: ``crop`` takes a negative count
    of tokens to drop). It also keeps the rotary tables, extended on demand.
    """

    def __init__(self, capacity: int = 512) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0
        self.capacity = capacity
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, n: int) -> None:
        if n >= 0:
            raise ValueError(f"crop({n}): pass a negative count of tokens to drop")
        self.length = max(0, self.length + n)

    def rotary(self, rope, x: torch.Tensor, upto: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [>= upto, hd] in x's dtype, from the model's own rotary module."""
        if self._cos is None or self._cos.shape[0] < upto or self._cos.dtype != x.dtype:
            size = max(upto, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
            pos = torch.arange(size, device=x.device)[None]
            cos, sin = rope(x, pos)
            self._cos, self._sin = cos[0], sin[0]
        return self._cos, self._sin

    def reserve(self, B: int, H: int, n: int, hd: int, dtype: torch.dtype,
                device: torch.device) -> None:
        """Make room for n more positions of B rows (keeping the held ones); writes nothing."""
        end = self.length + n
        if self.k is None or self.k.shape[0] != B or end > self.k.shape[2]:
            cap = max(self.capacity, end, 2 * (0 if self.k is None else self.k.shape[2]))
            new_k = torch.empty(B, H, cap, hd, dtype=dtype, device=device)
            new_v = torch.empty(B, H, cap, hd, dtype=dtype, device=device)
            if self.k is not None and self.length:
                if self.k.shape[0] not in (1, B):
                    raise RuntimeError(f"cache has {self.k.shape[0]} rows, input {B}")
                new_k[:, :, :self.length] = self.k[:, :, :self.length]
                new_v[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = new_k, new_v

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, Hkv, n, hd] after the held length; return all held [.., L, hd]."""
        B, H, n, hd = k.shape
        end = self.length + n
        self.reserve(B, H, n, hd, k.dtype, k.device)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def batch_repeat_interleave(self, rows: int) -> None:
        if self.k is None or self.k.shape[0] != 1:
            raise RuntimeError("batch_repeat_interleave needs a single-row cache")
        self.k = self.k.expand(rows, -1, -1, -1).clone()
        self.v = self.v.expand(rows, -1, -1, -1).clone()

    def batch_select_indices(self, idx: torch.Tensor) -> None:
        self.k, self.v = self.k[idx].contiguous(), self.v[idx].contiguous()


class FeatureDrafter:
    """Engine drafter around a :class:`FeatureDraft`; reads the target's features.

    :func:`coupling.llm.engine.generate` sees ``needs_target_features`` and makes the target's
    :class:`~coupling.llm.cache.CachedLM` keep its final hidden states; ``bind`` hands that
    ``CachedLM`` over. The draft cache holds pairs ``(x_i, f_{i-1})``, i >= 1, at position
    ``i - 1``; only pairs fed with the *target's* features survive from one call to the next
    (drafted pairs carry predicted features and are cropped away).
    """

    needs_target_features = True

    def __init__(self, draft: FeatureDraft, name: str = "feature") -> None:
        self.draft, self.name = draft, name
        self.vocab_size = draft.vocab_size
        self.cache = PairCache()
        self.true_pairs = 0          # leading cache entries fed with the target's features
        self.seq: list[int] = []     # committed tokens those pairs were computed from
        self.rows = 1
        self.target = None
        self.calls, self.seconds = 0, 0.0

    def bind(self, target) -> None:
        self.target = target

    def reset(self, prompt: list[int]) -> None:
        self.cache, self.true_pairs, self.seq, self.rows = PairCache(), 0, [], 1

    def _crop(self, n: int) -> None:
        held = self.cache.get_seq_length()
        if held > n:
            self.cache.crop(-(held - n))  # transformers 5.x: a negative count of tokens to drop

    @torch.no_grad()
    def _feed(self, ids: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append pairs; return the last position's predicted feature [rows, d] and its
        :meth:`FeatureDraft.head_logits`."""
        t0 = time.perf_counter()
        f = self.draft.features(ids, feats, self.cache)[:, -1]
        logits = self.draft.head_logits(f)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return f, logits

    @torch.no_grad()
    def propose(self, seq, gamma, k, cfg: SamplingConfig, gen, *, distinct_first=False,
                noise=None, confidence=None):
        from .cache import common_prefix
        from .drafters import sample_chain

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
        n = max(0, min(self.true_pairs, L - 1, common_prefix(self.seq, seq) - 1))
        n = min(n, L - 2)   # feed at least one pair: its output is the next law
        self._crop(n)
        dev = tgt.feats.device
        ids = torch.tensor([seq[n + 1: L]], device=dev)                  # pairs n+1 .. L-1
        feats = tgt.feats[:, n: L - 1]                                   # f_n .. f_{L-2}
        fhat, logits = self._feed(ids, feats)                            # [1, d], [1, n]
        self.true_pairs, self.seq = L - 1, list(seq)
        state = {"f": fhat}

        def expand(rows: int) -> None:
            if rows != 1:
                self.cache.batch_repeat_interleave(rows)
                state["f"] = state["f"].expand(rows, -1).contiguous()
            self.rows = rows

        def step(x: torch.Tensor) -> torch.Tensor:
            state["f"], lg = self._feed(x[:, None], state["f"][:, None])  # [k, d], [k, n]
            return self.draft.law(lg, cfg)                               # [k, V]

        return sample_chain(self.draft.law(logits, cfg), step, expand, gamma, k, gen,
                            distinct_first=distinct_first, noise=noise,
                            confidence=confidence)

    def accept(self, branch: int) -> None:
        if self.rows != 1:
            self.cache.batch_select_indices(
                torch.tensor([branch], device=self.target.feats.device))
            self.rows = 1
        self._crop(self.true_pairs)
