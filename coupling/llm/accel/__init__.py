"""Compiled CPU paths of the demo's hot loop, behind one seam, each with a pure-torch fallback.

What
----
A C++ extension of torch built from ``csrc/``, one concern per file:

* ``top_k_law.cpp``: the top-k / top-p law of logit rows (:func:`coupling.llm.sampling.probs`,
  for target and drafts alike), the same kept set and the same law to float32 rounding;
* ``inverse_cdf.cpp``: the inverse-CDF draws (:func:`coupling.llm.sampling.sample_rows`), bit
  for bit the torch draws.

Callers ask :func:`function` for a path by name and run their torch code where it returns
None, so the choice moves time, never a law.

Why these paths
---------------
A path is here only while it changes the default demo's best-rule tokens/s by at least 3%,
measured with and without it in one process (``python benchmarks/bench_accel.py --threads
1``; the ratios, and those of the paths that did not pass, are in ``docs/RESULTS.md``).

When
----
``COUPLING_ACCEL`` chooses: ``auto`` (default) builds and loads the extension on a CPU whose
instruction set torch reports as AVX2 or AVX-512 (the code is AVX2 + FMA); ``off`` keeps every
caller on torch. The extension is compiled on first use with ``torch.utils.cpp_extension`` (a
C++ compiler and ninja, the ``ninja`` wheel of the ``llm`` extra; about a minute) into
``$COUPLING_CACHE/torch_extensions``, one directory per source digest and torch installation,
and loaded from there afterwards. If it cannot be built or loaded, :func:`function` returns
None for every name and :func:`status` says why. :func:`disabled` switches named paths off for
a block of code (same-process A/B measurements, tests).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

ENV = "COUPLING_ACCEL"
CHOICES = ("auto", "off")
#: the compiled paths, by the name callers ask :func:`function` for
NAMES = ("top_k_law", "inverse_cdf")
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = tuple(CSRC / f"{name}.cpp" for name in NAMES) + (CSRC / "bindings.cpp",)
HEADERS = (CSRC / "accel.h",)
#: torch's names for the CPUs that run the AVX2 + FMA code (an AVX-512 CPU runs it too)
CAPABILITIES = ("AVX2", "AVX512")
_FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
_off: set[str] = set()


def choice() -> str:
    """The ``COUPLING_ACCEL`` setting, validated."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: choose one of {', '.join(CHOICES)}")
    return value


def function(name: str):
    """The compiled path ``name`` (one of :data:`NAMES`), or None where its caller runs torch:
    ``COUPLING_ACCEL=off``, a CPU the code does not run on, a failed build, or ``name`` switched
    off by :func:`disabled`."""
    if name not in NAMES:
        raise ValueError(f"no compiled path {name!r}; choose one of {', '.join(NAMES)}")
    if name in _off or choice() == "off":
        return None
    ext, _ = _compiled()
    return None if ext is None else getattr(ext, name)


def status() -> str:
    """``"compiled"`` where the extension serves, else why every caller runs torch."""
    if choice() == "off":
        return f"torch ({ENV}=off)"
    ext, why = _compiled()
    return "compiled" if ext is not None else why


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Inside the block, :func:`function` returns None for ``names`` (none named: nothing
    changes; ``disabled(*NAMES)`` switches every path off). Callers ask for a path at each
    call, so the block decides every call made inside it."""
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise ValueError(f"no compiled path {bad}; choose among {', '.join(NAMES)}")
    added = set(names) - _off
    _off.update(added)
    try:
        yield
    finally:
        _off.difference_update(added)


def _build_directory() -> Path:
    """``$COUPLING_CACHE/torch_extensions/accel_<digest>_torch<version>``, holding a copy of the
    sources; the digest covers the sources and the torch installation compiled against. ninja
    rebuilds whenever a command line changes, and the sources' and torch's paths are on it:
    keyed by less, every checkout and every virtual environment would rebuild the shared library
    in turn, overwriting it under the processes that have it loaded."""
    from ..models import cache_dir

    files = SOURCES + HEADERS
    codes = [f.read_bytes() for f in files]
    torch_home = str(Path(torch.__file__).resolve().parent).encode()
    digest = hashlib.sha256(b"\0".join([*codes, torch_home])).hexdigest()[:16]
    tag = f"{digest}_torch{torch.__version__.replace('+', '_')}"
    path = cache_dir() / "torch_extensions" / f"accel_{tag}"
    path.mkdir(parents=True, exist_ok=True)
    for f, code in zip(files, codes, strict=True):
        copy = path / f.name
        if not copy.exists() or copy.read_bytes() != code:
            tmp = path / f".{f.name}.{os.getpid()}"
            tmp.write_bytes(code)
            os.replace(tmp, copy)             # atomic: a concurrent reader sees old or new
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
        return None, f"torch: the compiled paths need AVX2; torch reports {cap} here"
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        build = _build_directory()
        if not any(build.glob("*.so")):        # a silent minute would look like a hang
            print(f"coupling: building the compiled CPU paths once (about a minute) into {build}",
                  file=sys.stderr, flush=True)
        ext = load(name="coupling_accel", sources=[str(build / f.name) for f in SOURCES],
                   extra_cflags=_FLAGS, extra_ldflags=["-fopenmp"], build_directory=str(build),
                   verbose=False)
    except Exception as exc:  # no compiler, no ninja, a read-only cache: keep torch
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
        why = f"torch: building the compiled paths failed ({type(exc).__name__}: {last})"
        warnings.warn(f"coupling: {why}", RuntimeWarning, stacklevel=4)
        return None, why
    return ext, "compiled"
