"""The token-level draft: its architecture, its weights file, and its loading on a target.

``load_draft`` rebuilds a full ``LlamaForCausalLM`` (so Hugging Face assisted generation can
use the very same object) from

* the draft's *own* weights, shipped in ``coupling/data/draft_smollm2.safetensors`` (its
  decoder layers, trained by distillation with ``scripts/train_draft.py``), and
* the target's embeddings, final norm and LM head, shared (same tensors, no copy).

A weights file holds the draft's own tensors in bf16, its :class:`DraftSpec` in the header,
optionally a ``head_tokens`` ranking (tokens by target mass on the training corpus, for a
:class:`~coupling.llm.heads.SubsetHead`) and a calibrated ``logit_scale``
(``scripts/calibrate_draft.py``), with a ``.json`` sidecar describing how it was made. The
feature draft (:mod:`coupling.llm.feature_draft`) uses the same file format.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .calibrate import check_logit_scale
from .heads import ScaledHead, quantized_head_int8, restrict_head
from .int8 import quantize_layer_int8
from .models import DATA_DIR, config_with_layers

DRAFT_WEIGHTS = DATA_DIR / "draft_smollm2.safetensors"
# Tensors a draft shares with its target (never stored in the draft's own file).
SHARED_KEYS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
#: The draft heads' token subset as the demo runs them (``--draft-head``): the first 4096 tokens
#: of the shipped ranking. The feature draft agrees with the target on as much of the mass at
#: 4096 tokens as at 8192 on the demo's text, for about half the head's cost
#: (``python scripts/draft_overlap.py --int8 --head-tokens 2048,4096,8192``).
DRAFT_HEAD_TOKENS = 4096


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
        draft = LlamaForCausalLM(config_with_layers(target.config, s + spec.n_layers))
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
