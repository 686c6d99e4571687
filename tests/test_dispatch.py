"""Results that do not depend on the CPU: the promises of :mod:`coupling.keyed`, checked under
every dispatch path this machine can emulate in one run.

Each configuration runs ``python -m tests.dispatch_probe`` in a fresh process (the variables
below are read when torch and numpy load): torch's kernels for its default, AVX2 and native
capability (``ATEN_CPU_CAPABILITY``), numpy with every optional SIMD loop switched off
(``NPY_DISABLE_CPU_FEATURES``: its ``log`` is then the C library's, which rounds some inputs
apart from torch's), and torch on 1 and 2 threads. In each:

* the keyed hashes and uniforms are bit for bit a pinned digest, the same on every machine,
  and the same bits on both backends;
* numpy's and torch's Gumbel noise lie within ``keyed.NOISE_ULPS`` units in the last place;
* the Gumbel-max tokens of 6,000 (seed, position) pairs, and every rule's keyed verdicts on
  random trees, are the same on both backends and the same in every configuration.

A result that depended on the CPU's math library, SIMD width or thread count would fail here
rather than on a user's machine. The control: at least one configuration must reach a ``log``
that rounds differently, or the comparison shows nothing on this machine (then it is skipped,
saying so).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coupling import keyed

ROOT = Path(__file__).resolve().parents[1]

#: sha256 of the keyed hashes and uniforms on the probe's grid: the same on every machine
HASHES = "673312bab705178aa811bff8c316f1838d2bb3898b2bc067ed99e298548aa509"


def _numpy_dispatch() -> str:
    """numpy's optional CPU features (the ones it dispatches to at run time), comma-separated."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy < 2
        from numpy.core import _multiarray_umath as umath
    return ",".join(getattr(umath, "__cpu_dispatch__", []))


CONFIGS = {
    "native": ({}, None),
    "torch-default-kernels": ({"ATEN_CPU_CAPABILITY": "default"}, None),
    "torch-avx2-kernels": ({"ATEN_CPU_CAPABILITY": "avx2"}, None),
    "numpy-without-simd": ({"NPY_DISABLE_CPU_FEATURES": _numpy_dispatch()}, None),
    "one-thread": ({}, 1),
    "two-threads": ({}, 2),
}


@functools.cache
def probe(config: str) -> dict:
    """The probe's fingerprint under one configuration (a fresh process)."""
    env_vars, threads = CONFIGS[config]
    env = {**os.environ, **env_vars}
    cmd = [sys.executable, "-m", "tests.dispatch_probe"]
    if threads:
        cmd += ["--threads", str(threads)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config", list(CONFIGS))
def test_results_do_not_depend_on_the_dispatch_path(config):
    if config == "numpy-without-simd" and not CONFIGS[config][0]["NPY_DISABLE_CPU_FEATURES"]:
        pytest.skip("this numpy dispatches to no optional CPU feature")
    got, native = probe(config), probe("native")
    assert got["hashes"] == HASHES and got["hash_backends_equal"]
    assert got["noise_max_gap"] <= keyed.NOISE_ULPS, got["config"]
    assert got["gumbel_decisions_differing"] == 0, got["config"]
    assert got["gumbel_decisions"] == native["gumbel_decisions"], got["config"]
    assert not any(got["twin_core_mismatches"].values()), got["twin_core_mismatches"]
    assert got["decisions"] == native["decisions"], got["config"]


def test_some_configuration_reaches_a_log_that_rounds_apart():
    """The control: the configurations are not all one math library in disguise; at least one
    makes numpy's and torch's noise differ in the last bit (about 1 pair in 5 on x86-64 with
    numpy's SIMD off), and the decisions above stayed equal even so."""
    differing = {c: probe(c)["noise_pairs_differing"] for c in CONFIGS}
    if not any(differing.values()):
        pytest.skip(f"numpy's and torch's log agree bit for bit in every configuration here "
                    f"({differing}): the comparison cannot show a CPU dependence on this machine")
    worst = max(differing, key=differing.get)
    assert probe(worst)["noise_max_gap"] >= 1.0


def test_the_pinned_digest_is_what_the_grid_hashes_to():
    """The pinned digest is the probe's own computation in this process: a change of the hash,
    of the uniforms' grid or of the key layout fails here first, with its new value."""
    from tests.dispatch_probe import hashes

    digest, equal = hashes()
    assert equal and digest == HASHES, digest
    assert np.isfinite(keyed.gumbel_noise(0, [0], [0])).all()
