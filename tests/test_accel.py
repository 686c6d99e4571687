"""The seam of the compiled paths (coupling.llm.accel), its int8 product, and Int8Linear's
choice of path.

The compiled product is checked against the float64 product of the dequantised weight, for row
counts on both sides of its 6-row groups and output counts that leave tails; a row's result
must be bit for bit the same whatever rows share its call. On a machine where the extension
cannot be built (a CPU it does not run on, no compiler) those tests are skipped with the reason
from ``accel.status()``; the seam's settings, path selection and errors are checked everywhere.
(The other compiled paths are tested beside their torch counterparts: tests/test_sampling.py,
tests/test_feature_draft.py.)
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from coupling.llm import accel, int8  # noqa: E402


@pytest.fixture(scope="module")
def mm():
    fn = accel.function("int8_mm")
    if fn is None:
        pytest.skip(f"compiled int8 product unavailable: {accel.status()}")
    return fn


def quantized(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    s = torch.rand(n, generator=g) * 0.02 + 1e-3
    return w, s


def heavy_tailed(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows with a few columns 20-50 times the rest, as a transformer's activations have."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g) * torch.exp(1.5 * torch.randn(k, generator=g))


def reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T) * s.double()


@pytest.mark.parametrize("n,k", [(1, 16), (7, 32), (13, 576), (192, 576), (1537, 64)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 9, 13])
def test_kernel_equals_the_dequantised_product(mm, n, k, m):
    w, s = quantized(n, k, seed=n + k + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = mm(x, w, s)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    ref = reference(x, w, s)
    # float32 accumulation of k products: relative error a few ulps times sqrt(k)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    yb = mm(x.bfloat16(), w, s)                       # bf16 in, bf16 out, same sums
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb, mm(x.bfloat16().float(), w, s).bfloat16(), atol=0, rtol=0)


@pytest.mark.parametrize("tails", [False, True])
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 14), n=st.integers(1, 40), k16=st.integers(1, 8),
       row=st.integers(0, 10), seed=st.integers(0, 2**16))
def test_a_rows_result_does_not_depend_on_the_rows_it_is_scored_with(mm, tails, m, n, k16,
                                                                      row, seed):
    """Bit for bit: a row alone, the same row among m others at any place, and under another
    thread count (the split over outputs changes, the sums must not); on Gaussian rows and on
    heavy-tailed ones."""
    fn = mm
    k = 16 * k16
    w, s = quantized(n, k, seed)
    x = (heavy_tailed(m, k, seed) if tails else
         torch.randn(m, k, generator=torch.Generator().manual_seed(seed))).bfloat16()
    row = row % m
    alone = fn(x[row:row + 1], w, s)[0]
    assert torch.equal(fn(x, w, s)[row], alone)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(fn(x, w, s)[row], alone)
    finally:
        torch.set_num_threads(threads)


def test_kernel_refuses_bad_shapes_and_types_by_name(mm):
    w, s = quantized(8, 32, 0)
    x = torch.randn(2, 32)
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        mm(torch.randn(2, 24), torch.zeros(8, 24, dtype=torch.int8), s)
    with pytest.raises(RuntimeError, match="int8_mm: x has K = 16 columns, w has 32"):
        mm(torch.randn(2, 16), w, s)
    with pytest.raises(RuntimeError, match="contiguous int8"):
        mm(x, w.float(), s)
    with pytest.raises(RuntimeError, match="float32 \\[N\\]"):
        mm(x, w, s.bfloat16())
    with pytest.raises(RuntimeError, match="scale has 7 entries"):
        mm(x, w, s[:7].contiguous())
    with pytest.raises(RuntimeError, match=r"x must be \[M, K\]"):
        mm(x[None], w, s)


def test_int8_linear_takes_the_compiled_path_and_agrees_with_torchs_kernel(mm):
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 40).bfloat16()
    fast = int8.Int8Linear.from_linear(lin)
    with accel.disabled("int8_mm"):
        slow = int8.Int8Linear.from_linear(lin)
    assert (fast.kernel, slow.kernel) == ("compiled", "torch")
    assert fast.dense is None and slow.dense is None
    assert torch.equal(fast.qweight, slow.qweight) and torch.equal(fast.scale, slow.scale)
    x = torch.randn(2, 3, 64).bfloat16()
    with torch.no_grad():
        a, b = fast(x), slow(x)
    assert a.shape == b.shape == (2, 3, 40) and a.dtype == b.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.float(), fast.dequantized().float(),
                                          lin.bias.detach().float())
    for y in (a, b):                                   # both within bf16 rounding of the truth
        assert float((y.float() - want).norm()) <= 1e-2 * float(want.norm())
    # the layer's result for one token does not change with the tokens beside it
    with torch.no_grad():
        assert torch.equal(fast(x[:1, :1])[0, 0], fast(x)[0, 0])


def test_the_setting_is_validated_and_torch_can_be_forced(monkeypatch):
    monkeypatch.setenv(accel.ENV, "fast-please")
    with pytest.raises(ValueError, match="COUPLING_ACCEL='fast-please': choose one of"):
        accel.function("int8_mm")
    monkeypatch.setenv(accel.ENV, "off")
    assert all(accel.function(name) is None for name in accel.NAMES)
    assert "COUPLING_ACCEL=off" in accel.status()
    lin = torch.nn.Linear(32, 8)
    assert int8.Int8Linear.from_linear(lin).kernel == "torch"
    assert int8.Int8Linear.from_linear(torch.nn.Linear(5, 3)).kernel == "dense"


def test_disabled_switches_named_paths_off_inside_its_block_only(mm):
    """``accel.disabled``: the named paths are None inside the block and only they (none named:
    nothing changes), nested blocks keep what the outer one switched off, and an unknown name
    is refused."""
    with accel.disabled():
        assert all(accel.function(n) is not None for n in accel.NAMES)
    with accel.disabled("int8_mm"):
        assert accel.function("int8_mm") is None
        assert accel.function("top_k_law") is not None
        with accel.disabled(*accel.NAMES):
            assert all(accel.function(n) is None for n in accel.NAMES)
        assert accel.function("int8_mm") is None and accel.function("top_k_law") is not None
    assert accel.function("int8_mm") is mm
    with pytest.raises(ValueError, match="no compiled path \\['int16_mm'\\]"):
        with accel.disabled("int16_mm"):
            pass
    with pytest.raises(ValueError, match="no compiled path 'int16_mm'"):
        accel.function("int16_mm")


def test_int8_layers_with_either_kernel_make_the_same_model_up_to_rounding(mm):
    """A tiny Llama quantized twice (compiled product, torch's kernel): the same int8 weights and
    logits within float rounding. (Only the projections are row-independent bit for bit: the
    attention kernel's sums may differ between calls of different lengths.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    import copy

    fast = int8.quantize_target_int8(copy.deepcopy(base))
    with accel.disabled("int8_mm"):
        slow = int8.quantize_target_int8(copy.deepcopy(base))
    assert fast.lm_head.kernel == "compiled" and slow.lm_head.kernel == "torch"
    ids = torch.tensor([[3, 9, 1, 40, 7, 22]])
    for mf, ms in zip(fast.modules(), slow.modules(), strict=True):
        if isinstance(mf, int8.Int8Linear):
            assert torch.equal(mf.qweight, ms.qweight) and torch.equal(mf.scale, ms.scale)
    with torch.no_grad():
        a, b = fast(ids).logits, slow(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_failed_build_falls_back_to_torchs_kernel_and_says_why(monkeypatch):
    """No compiler (simulated): every path is None, a RuntimeWarning and status() name the
    error, and Int8Linear runs torch's kernel; the next build attempt is not blocked."""
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
            assert accel.function("int8_mm") is None
        assert all(accel.function(name) is None for name in accel.NAMES)
        assert "c++: command not found" in accel.status()
        assert int8.Int8Linear.from_linear(torch.nn.Linear(32, 8)).kernel == "torch"
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


def test_status_follows_the_setting_back_and_forth(mm, monkeypatch):
    monkeypatch.setenv(accel.ENV, "off")
    assert accel.function("int8_mm") is None and accel.status().startswith("torch (")
    monkeypatch.setenv(accel.ENV, "auto")
    assert accel.function("int8_mm") is mm and accel.status() == "compiled"


@pytest.mark.parametrize("capability, loads", [(c, True) for c in accel.CAPABILITIES]
                         + [("DEFAULT", False)])
def test_auto_loads_the_extension_only_where_torch_reports_a_cpu_it_runs_on(mm, monkeypatch,
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
