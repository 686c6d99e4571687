"""The seam of the compiled paths (coupling.llm.accel): its setting, its switch for
same-process A/B runs, its build directory, its fallback when the build fails, and the
capability check. On a machine where the extension cannot be built (a CPU it does not run on,
no compiler) the tests that need it are skipped with the reason from ``accel.status()``. The
compiled paths themselves are tested against their torch counterparts beside them
(tests/test_sampling.py).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from coupling.llm import accel, sampling  # noqa: E402
from coupling.llm.sampling import SamplingConfig  # noqa: E402


@pytest.fixture(scope="module")
def law():
    fn = accel.function("top_k_law")
    if fn is None:
        pytest.skip(f"compiled paths unavailable: {accel.status()}")
    return fn


def test_the_setting_is_validated_and_torch_can_be_forced(monkeypatch):
    monkeypatch.setenv(accel.ENV, "fast-please")
    with pytest.raises(ValueError, match="COUPLING_ACCEL='fast-please': choose one of"):
        accel.function("top_k_law")
    monkeypatch.setenv(accel.ENV, "off")
    assert all(accel.function(name) is None for name in accel.NAMES)
    assert "COUPLING_ACCEL=off" in accel.status()


def test_disabled_switches_named_paths_off_inside_its_block_only(law):
    """``accel.disabled``: the named paths are None inside the block and only they (none named:
    nothing changes), nested blocks keep what the outer one switched off, and an unknown name
    is refused."""
    with accel.disabled():
        assert all(accel.function(n) is not None for n in accel.NAMES)
    with accel.disabled("top_k_law"):
        assert accel.function("top_k_law") is None
        assert accel.function("inverse_cdf") is not None
        with accel.disabled(*accel.NAMES):
            assert all(accel.function(n) is None for n in accel.NAMES)
        assert accel.function("top_k_law") is None and accel.function("inverse_cdf") is not None
    assert accel.function("top_k_law") is law
    with pytest.raises(ValueError, match="no compiled path \\['int16_mm'\\]"):
        with accel.disabled("int16_mm"):
            pass
    with pytest.raises(ValueError, match="no compiled path 'int16_mm'"):
        accel.function("int16_mm")


def test_a_failed_build_falls_back_to_torch_and_says_why(monkeypatch):
    """No compiler (simulated): every path is None, a RuntimeWarning and status() name the
    error, and the sampling laws run torch; the next build attempt is not blocked."""
    import torch.utils.cpp_extension as cpp

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setenv(accel.ENV, "auto")
    monkeypatch.setattr(accel.torch.backends.cpu, "get_cpu_capability",
                        lambda: accel.CAPABILITIES[0])
    monkeypatch.setattr(cpp, "load", no_compiler)
    accel._compiled.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="building the compiled paths failed"):
            assert accel.function("top_k_law") is None
        assert all(accel.function(name) is None for name in accel.NAMES)
        assert "c++: command not found" in accel.status()
        x = torch.randn(3, 40)
        cfg = SamplingConfig(0.7, 5, 0.9)
        assert sampling.native_law(x, cfg) is None
        assert torch.isclose(sampling.probs(x, cfg).sum(-1), torch.ones(3)).all()
    finally:
        accel._compiled.cache_clear()              # later tests load the real build


def test_the_ninja_wheel_is_put_on_path_when_none_is_there(monkeypatch):
    ninja = pytest.importorskip("ninja")
    monkeypatch.setattr(accel.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/nowhere")
    accel._put_ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR


def test_the_build_directory_is_keyed_by_sources_and_torch_not_the_checkout(monkeypatch,
                                                                            tmp_path):
    """Every checkout with the same sources and torch installation builds in (and loads from)
    one directory, compiling copies of the sources kept there: ninja would rebuild on a new
    source path; another torch installation (another venv) gets its own directory."""
    import hashlib
    from pathlib import Path

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    first = accel._build_directory()
    files = accel.SOURCES + accel.HEADERS
    home = str(Path(torch.__file__).resolve().parent).encode()
    digest = hashlib.sha256(b"\0".join([*(f.read_bytes() for f in files), home])).hexdigest()
    assert first.parent == tmp_path / "torch_extensions" and digest[:16] in first.name
    assert sorted(p.name for p in first.iterdir()) == sorted(f.name for f in files)
    copy = first / accel.SOURCES[0].name
    assert copy.read_bytes() == accel.SOURCES[0].read_bytes()
    copy.write_bytes(b"// stale")                       # a torn or older copy is replaced
    assert accel._build_directory() == first
    assert copy.read_bytes() == accel.SOURCES[0].read_bytes()
    other = tmp_path / "torch_elsewhere" / "torch" / "__init__.py"
    monkeypatch.setattr(accel.torch, "__file__", str(other))
    assert accel._build_directory() != first


def test_every_compiled_path_has_its_source_and_binding():
    """One concern per source file: each name in ``NAMES`` is a ``csrc/<name>.cpp`` and is
    exported by the bindings, and no source file is left over."""
    files = {p.name for p in accel.CSRC.glob("*.cpp")}
    assert files == {f"{n}.cpp" for n in accel.NAMES} | {"bindings.cpp"}
    bindings = (accel.CSRC / "bindings.cpp").read_text()
    for name in accel.NAMES:
        assert f'm.def("{name}", &{name},' in bindings


def test_status_follows_the_setting_back_and_forth(law, monkeypatch):
    monkeypatch.setenv(accel.ENV, "off")
    assert accel.function("top_k_law") is None and accel.status().startswith("torch (")
    monkeypatch.setenv(accel.ENV, "auto")
    assert accel.function("top_k_law") is law and accel.status() == "compiled"


@pytest.mark.parametrize("capability, loads", [(c, True) for c in accel.CAPABILITIES]
                         + [("DEFAULT", False)])
def test_auto_loads_the_extension_only_where_torch_reports_a_cpu_it_runs_on(law, monkeypatch,
                                                                            capability, loads):
    """Every capability in ``accel.CAPABILITIES`` loads the extension; a CPU torch reports
    otherwise keeps every caller on torch, and says why."""
    monkeypatch.setenv(accel.ENV, "auto")
    monkeypatch.setattr(accel.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    accel._compiled.cache_clear()
    try:
        assert all((accel.function(n) is not None) == loads for n in accel.NAMES)
        assert (accel.status() == "compiled") == loads
        if not loads:
            assert "torch reports DEFAULT here" in accel.status()
    finally:
        accel._compiled.cache_clear()              # later tests load the real build
