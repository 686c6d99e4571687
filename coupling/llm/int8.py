"""Weight-only int8 linear layers, and the quantisation of a target's or a draft's projections.

``Int8Linear`` stores ``W ~ diag(s) Wq`` with one scale per output row (``s_r = max_c |W_rc| /
127``, ``Wq = round(W / s)``, symmetric) and multiplies activations in the model's dtype by it.
Why: at batch 1 a decoding or draft step is bound by streaming its weights from memory, so
halving the bytes nearly halves the step. The layer's product is whichever of two paths is
known to be right on this machine, each on the same int8 weights:

* ``"torch"``: torch's ``_weight_int8pack_mm`` (the kernel gpt-fast uses), kept only where it
  reproduces the dequantised product on a probe at construction (it needs ``in_features`` a
  multiple of 16 and has returned garbage on other shapes);
* ``"dense"``: the weight dequantised once and an ordinary ``linear``.

Rounding moves each logit by under 1% (relative norm). The laws a quantised model gives are
the laws the engine verifies against or drafts from, so no rule's losslessness is affected:
an int8 target is another target, an int8 draft another draft.
"""

from __future__ import annotations

import torch

#: the target quantisations ``coupling demo --target-quant`` takes, with their labels
TARGET_QUANTS = {"none": "", "int8": "weight-only int8"}


class Int8Linear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` stored weight-only int8 (module docstring); ``kernel``
    names the product's path: ``"torch"`` or ``"dense"``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
        self.out_features, self.in_features = w.shape
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp_(-127, 127)
                             .to(torch.int8).contiguous())
        self.register_buffer("scale", scale.to(weight.dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # the fallback's dequantised weight (a buffer, so that .to(device) moves it too)
        self.register_buffer("dense", None if self._torch_kernel_is_right() else
                             self.dequantized(), persistent=False)

    @property
    def kernel(self) -> str:
        """The product's path: ``"torch"`` or ``"dense"``."""
        return "torch" if self.dense is None else "dense"

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear) -> Int8Linear:
        return cls(lin.weight, lin.bias)

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

    def _torch_kernel_is_right(self) -> bool:
        if self.in_features % 16 or self.scale.dtype not in (torch.bfloat16, torch.float16,
                                                             torch.float32):
            return False
        return self._probe(
            lambda x: torch.ops.aten._weight_int8pack_mm(x, self.qweight, self.scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.scale.dtype)
        if self.dense is None:
            y = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.qweight, self.scale)
        else:
            y = torch.nn.functional.linear(x2, self.dense)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def quantize_linears_int8(module: torch.nn.Module, names: tuple[str, ...]) -> None:
    """Replace the ``torch.nn.Linear`` attributes ``names`` of ``module`` by :class:`Int8Linear`
    (in place; shared modules must not be named here, or the target would change too)."""
    for name in names:
        lin = getattr(module, name)
        if not isinstance(lin, torch.nn.Linear):
            raise TypeError(f"{type(module).__name__}.{name} is {type(lin).__name__}, not Linear")
        setattr(module, name, Int8Linear.from_linear(lin))


def quantize_layer_int8(layer: torch.nn.Module) -> None:
    """Weight-only int8 for one Llama decoder layer's seven projections."""
    quantize_linears_int8(layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj"))
    quantize_linears_int8(layer.mlp, ("gate_proj", "up_proj", "down_proj"))


def target_quants(text: str) -> list[str]:
    """A comma-separated ``--target-quant`` list (``"none,int8"``) as its entries, each a key of
    :data:`TARGET_QUANTS`; ValueError naming the choices otherwise."""
    quants = text.split(",")
    if not set(quants) <= set(TARGET_QUANTS):
        raise ValueError(f"--target-quant {text}: choose among {', '.join(TARGET_QUANTS)}")
    return quants


def quantize_target(target, quant: str):
    """``quant`` ``"none"`` returns ``target`` as it is; ``"int8"`` quantizes it in place by
    :func:`quantize_target_int8`. The ``--target-quant`` of ``coupling demo`` and the
    benchmarks."""
    if quant not in TARGET_QUANTS:
        raise ValueError(f"target quant {quant!r}: choose one of {', '.join(TARGET_QUANTS)}")
    return target if quant == "none" else quantize_target_int8(target)


def quantize_target_int8(target):
    """Weight-only int8 for the target's decoder projections and LM head (in place), the
    scheme of :class:`Int8Linear` (embeddings and norms untouched). Returns ``target``, its
    ``coupling_target_quant`` set to ``"int8"``.

    Why: on a CPU without native bf16 products, a bf16 call that scores a few tokens costs up
    to twice a one-token call, so no rule can beat plain sampling there; the int8 target
    scores them for about the price of one (``python benchmarks/bench_target_quant.py``
    prints both). Its next-token laws are at TV about 0.04 from the float32 target's on the
    demo's text (bf16's about 0.015, the same benchmark); every method of ``coupling demo
    --target-quant int8`` runs this same quantized target.

    Call it after building drafts that share the target's modules (``load_draft``,
    ``load_feature_draft``): the head is replaced, not modified, so a draft holding the
    original head module keeps it; a decoder layer the draft shares *would* be quantized too.
    """
    if getattr(target, "coupling_target_quant", None) == "int8":
        raise ValueError("target is already weight-only int8 (quantize_target_int8 ran on it)")
    for layer in target.model.layers:
        quantize_layer_int8(layer)
    target.lm_head = Int8Linear.from_linear(target.lm_head)
    target.coupling_target_quant = "int8"
    return target
