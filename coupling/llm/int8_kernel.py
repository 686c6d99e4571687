"""The weight-only int8 product :class:`coupling.llm.models.Int8Linear` runs on an AVX2 CPU.

Why
---
Speculative decoding sells a target call that scores ``gamma + 1`` tokens for about the price of
a one-token call. On a CPU without bf16 instructions (AVX2 only) torch's weight-only int8 kernel
(``aten._weight_int8pack_mm``) grows with the rows it scores: on SmolLM2's projections 2 rows
cost 1.0-1.2 and 4 rows 1.3-1.5 times one row (``benchmarks/bench_cpu_matmul.py``). The kernel
here (``csrc/int8_mm_avx2.cpp``) widens each int8 weight to float once per group of up to six
rows of ``x`` and feeds it to one FMA per row, so 2-6 rows stream the weights once (one row
costs about 0.75 of torch's; 2, 3, 4, 5, 6 rows 1.1, 1.2, 1.35, 1.5, 1.85 times one row here:
each row beyond the first few costs its FMAs at about the CPU's peak rate):

    y[m, n] = s[n] * sum_k x[m, k] * Wq[n, k]

with float32 accumulation. Each output's sum is the same sequence of FMAs whatever the number of
rows and the thread split, so a row's result is bit for bit the same whether it is scored alone
or with 50 others: a token's projections never depend on the tokens it is verified with (the
model's attention kernel may still round differently in calls of different lengths).

A second product, ``int8_mm_i16`` (:func:`kernel` with ``activations="int16"``), rounds each
row of ``x`` to int16 on its own scale first and sums integer products exactly (AVX2's
``vpmaddwd``), the scheme of :func:`int16_rows`:

    y[m, n] = float(sum_k xq[m, k] * Wq[n, k]) * (t[m] * s[n]),   xq = round(x / t)

The integer products need no float widening of the weights and issue about twice the
multiply-adds per instruction, so on SmolLM2's 211 products one row costs about 0.97 and a row
beyond the first about half what it costs in float32 (2 and 3 rows 1.05 and 1.14 times one row
against 1.11 and 1.24); a whole target call costs 0.97x (1 token) and 0.92-0.95x (2-3 tokens)
the float kernel's, and every decoding method of ``coupling demo`` runs 4-5% faster
(``docs/RESULTS.md``, stop 28). It is another target: the rounding of ``x`` moves a product by
about 1e-4 of its norm, less than rounding ``x`` to bf16 does, and the next-token laws are as
far from the float32 target's as the float kernel's (TV 0.041 against 0.040).
:class:`~coupling.llm.models.Int8Linear` runs it with ``activations="int16"``; where the
extension is missing it applies :func:`round_rows_int16` before torch's product, so the
numbers stay those of the scheme up to float rounding.

The same extension holds two more things a CPU step would otherwise spend in small tensor
operations: the int8 feature draft's whole step (:func:`feature_step`), and the sampling laws'
fast path (:func:`function`: ``top_k_law``, the top-k / top-p law of a few logit rows;
``inverse_cdf``, the engine's inverse-CDF draw; ``union_support``, the tokens a rule must look
at), which :mod:`coupling.llm.sampling` takes where it applies (``sampling.native_laws``).

When
----
``COUPLING_INT8_KERNEL`` chooses: ``auto`` (default) uses the extension on a CPU whose best
instruction set torch reports as AVX2 or AVX512 (an AVX-512 CPU runs AVX2 code too), ``avx2``
the same (the setting's older name for "use it"), ``torch`` keeps ``_weight_int8pack_mm`` and
the Python steps. Where it was measured it wins: on the AVX2-only EPYC of stops 15-28 (the
products, stop 20; the laws, stop 24), and on a Zen 5 EPYC with AVX-512 (stop 29), where the
compiled laws and draft step take 0.4 ms off the feature draft's step and 0.9 ms off the rest
of a speculative step on the bf16 target, and a w8a16 target call costs 0.85-0.98x torch's
int8 one for 1-3 tokens. The extension is compiled on first use with
``torch.utils.cpp_extension`` (a C++ compiler and ninja, the ``ninja`` wheel of the ``llm``
extra; about 40 s) into ``$COUPLING_CACHE/torch_extensions``, one directory per kernel source
and torch installation (so once per virtual environment), and loaded from there afterwards. If
it cannot be built or loaded, :func:`kernel` returns None, :func:`status` says why, and
``Int8Linear`` keeps torch's kernel: the model is then the same up to float rounding, only
slower.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch

ENV = "COUPLING_INT8_KERNEL"
CHOICES = ("auto", "avx2", "torch")
#: torch's CPU capabilities (``torch.backends.cpu.get_cpu_capability()``) that run the extension
CAPABILITIES = ("AVX2", "AVX512")
SOURCE = Path(__file__).resolve().parent / "csrc" / "int8_mm_avx2.cpp"
_status = {"kernel": "not loaded yet"}


def choice() -> str:
    """The ``COUPLING_INT8_KERNEL`` setting, validated."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: choose one of {', '.join(CHOICES)}")
    return value


def _build_directory() -> Path:
    """``$COUPLING_CACHE/torch_extensions/int8_mm_avx2_<digest>_torch<version>``, holding a copy
    of the source; the digest covers the source and the torch installation compiled against.
    ninja rebuilds whenever a command line changes, and the source's and torch's paths are on
    it: keyed by less, every checkout and every virtual environment would rebuild the shared
    library in turn, overwriting it under the processes that have it loaded."""
    from .models import cache_dir

    code = SOURCE.read_bytes()
    torch_home = str(Path(torch.__file__).resolve().parent).encode()
    digest = hashlib.sha256(code + b"\0" + torch_home).hexdigest()[:16]
    tag = f"{digest}_torch{torch.__version__.replace('+', '_')}"
    path = cache_dir() / "torch_extensions" / f"int8_mm_avx2_{tag}"
    path.mkdir(parents=True, exist_ok=True)
    copy = path / SOURCE.name
    if not copy.exists() or copy.read_bytes() != code:
        tmp = path / f".{SOURCE.name}.{os.getpid()}"
        tmp.write_bytes(code)
        os.replace(tmp, copy)                     # atomic: a concurrent reader sees old or new
    return path


def _put_ninja_on_path() -> None:
    """torch builds extensions with a ``ninja`` found on PATH; the one the ``ninja`` wheel puts
    in a virtual environment is not on PATH unless the environment is activated."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


@functools.cache
def _compiled():
    """(the compiled extension module or None, the reason :func:`status` reports)."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in CAPABILITIES:
        return None, f"torch: this CPU's capability is {cap}; the kernel needs AVX2"
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        build = _build_directory()
        if not any(build.glob("*.so")):        # a silent 40 s pause would look like a hang
            print(f"coupling: building the AVX2 int8 kernel once (about 40 s) into {build}",
                  file=sys.stderr, flush=True)
        ext = load(name="coupling_int8_mm_avx2", sources=[str(build / SOURCE.name)],
                   extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                   extra_ldflags=["-fopenmp"], build_directory=str(build),
                   verbose=False)
    except Exception as exc:  # no compiler, no ninja, a read-only cache: keep torch's kernel
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        why = f"torch: building the AVX2 kernel failed ({type(exc).__name__}: {last})"
        warnings.warn(f"coupling: {why}", RuntimeWarning, stacklevel=4)
        return None, why
    return ext, "avx2"


def _extension():
    """(the compiled extension or None, why) under the ``COUPLING_INT8_KERNEL`` setting."""
    mode = choice()
    return (None, f"torch ({ENV}=torch)") if mode == "torch" else _compiled()


ACTIVATIONS = ("float", "int16")


def kernel(activations: str = "float"):
    """The AVX2 extension's product ``(x [M, K], w [N, K] int8, scale [N] float32) -> y [M, N]``
    or None when torch's kernel is to be used (:func:`status` says why): ``int8_mm`` for
    ``activations="float"``, ``int8_mm_i16`` (``x`` rounded per row, :func:`int16_rows`) for
    ``"int16"``."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations={activations!r}: choose one of {', '.join(ACTIVATIONS)}")
    ext, why = _extension()
    _status["kernel"] = why
    if ext is None:
        return None
    return ext.int8_mm if activations == "float" else ext.int8_mm_i16


def int16_levels(in_features: int) -> int:
    """``A``, the largest ``|xq|`` of :func:`int16_rows` for rows of ``in_features`` entries:
    ``min(32767, (2^31 - 1) // (128 K))``, so that ``sum_k xq_k w_k`` stays inside int32 for any
    int8 ``w`` (SmolLM2: 29127 for K = 576, 10922 for K = 1536)."""
    if in_features < 1:
        raise ValueError(f"in_features={in_features}: must be at least 1")
    return min(32767, (2 ** 31 - 1) // (128 * in_features))


def int16_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x`` [M, K] rounded to integers on its own scale: ``(xq, t)`` with
    ``t[m] = max_k |x[m, k]| / A`` and ``xq = round(x / t)`` (half to even, as the kernel's
    ``vcvtps2dq``), ``|xq| <= A = int16_levels(K)``; a zero row gives ``t = 0`` and ``xq = 0``.
    The reference of ``int8_mm_i16``, computed in float32 as the kernel does (``x * (A / max)``)
    so the integers are the kernel's. Rows with a NaN or an infinity are returned unchanged
    with ``t = nan`` (the kernel sends such calls to the float product)."""
    xf = x.float()
    A = int16_levels(xf.shape[-1])
    amax = xf.abs().amax(-1, keepdim=True)
    finite = torch.isfinite(xf).all(-1, keepdim=True)
    safe = torch.where((amax > 0) & finite, amax, torch.ones_like(amax))
    # a true float32 division, as the kernel's A / max (``A / safe`` would multiply by the
    # reciprocal instead, which rounds differently)
    inv = torch.tensor(float(A), dtype=torch.float32) / safe
    xq = torch.round((xf * inv).clamp(-A, A))
    xq = torch.where(finite, torch.where(amax > 0, xq, torch.zeros_like(xq)), xf)
    t = torch.where(finite, torch.where(amax > 0, amax / A, torch.zeros_like(amax)),
                    torch.full_like(amax, float("nan")))
    return xq, t.squeeze(-1)


def round_rows_int16(x: torch.Tensor) -> torch.Tensor:
    """``x`` with each row replaced by ``xq * t`` (:func:`int16_rows`), in ``x``'s dtype: what
    ``int8_mm_i16`` multiplies, for the paths that run without the extension. Rows with a NaN
    or an infinity are left as they are."""
    xq, t = int16_rows(x)
    bad = torch.isnan(t)
    return torch.where(bad[:, None], x.float(), xq * t[:, None]).to(x.dtype)


def status() -> str:
    """Which kernel the last int8 layer built uses, and why: ``"avx2"`` or ``"torch ..."``."""
    return _status["kernel"]


def feature_step():
    """The extension's ``feature_step(...)``: the int8 feature draft's whole step (its fc, layer,
    norm and head) in one call, bit for bit :meth:`FeatureDraft._features_lean` and its head
    (``coupling.llm.feature_draft``); None where :func:`kernel` would be None."""
    ext, _ = _extension()
    return None if ext is None else getattr(ext, "feature_step", None)


def function(name: str):
    """The extension's function ``name`` (``top_k_law``, ``inverse_cdf``, ``union_support``:
    the sampling laws' fast path, :mod:`coupling.llm.sampling`), or None where :func:`kernel`
    would be None."""
    ext, _ = _extension()
    return None if ext is None else getattr(ext, name, None)
