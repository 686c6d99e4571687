"""The AVX2 weight-only int8 kernel (coupling.llm.int8_kernel) and Int8Linear's choice of path.

The kernel is checked against the float64 product of the dequantised weight, for row counts on
both sides of its 4-row groups and output counts that leave tails; a row's result must be bit
for bit the same whatever rows share its call. On a machine where the kernel cannot be built
(no AVX2, no compiler) those tests are skipped with the reason from ``int8_kernel.status()``;
the path selection and the errors are checked everywhere.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from coupling.llm import int8_kernel, models  # noqa: E402


@pytest.fixture(scope="module")
def mm():
    fn = int8_kernel.kernel()
    if fn is None:
        pytest.skip(f"AVX2 int8 kernel unavailable: {int8_kernel.status()}")
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


@pytest.mark.parametrize("activations", ["float", "int16"])
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 14), n=st.integers(1, 40), k16=st.integers(1, 8),
       row=st.integers(0, 10), seed=st.integers(0, 2**16))
def test_a_rows_result_does_not_depend_on_the_rows_it_is_scored_with(activations, m, n, k16,
                                                                      row, seed):
    """Bit for bit, for both products (float sums, and int16 rows with integer sums): a row
    alone, the same row among m others at any place, and under another thread count (the split
    over outputs changes, the sums must not)."""
    fn = int8_kernel.kernel(activations)
    if fn is None:
        pytest.skip(int8_kernel.status())
    k = 16 * k16
    w, s = quantized(n, k, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()
    if activations == "int16":
        x = heavy_tailed(m, k, seed).bfloat16()
    row = row % m
    alone = fn(x[row:row + 1], w, s)[0]
    assert torch.equal(fn(x, w, s)[row], alone)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(fn(x, w, s)[row], alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("activations", ["float", "int16"])
def test_kernel_refuses_bad_shapes_and_types_by_name(mm, activations):
    mm = int8_kernel.kernel(activations)                 # either product, the same checks
    w, s = quantized(8, 32, 0)
    x = torch.randn(2, 32)
    with pytest.raises(RuntimeError, match="not a multiple of 16"):
        mm(torch.randn(2, 24), torch.zeros(8, 24, dtype=torch.int8), s)
    name = {"float": "int8_mm", "int16": "int8_mm_i16"}[activations]
    with pytest.raises(RuntimeError, match=f"{name}: x has K = 16 columns, w has 32"):
        mm(torch.randn(2, 16), w, s)
    with pytest.raises(RuntimeError, match="contiguous int8"):
        mm(x, w.float(), s)
    with pytest.raises(RuntimeError, match="float32 \\[N\\]"):
        mm(x, w, s.bfloat16())
    with pytest.raises(RuntimeError, match="scale has 7 entries"):
        mm(x, w, s[:7].contiguous())
    with pytest.raises(RuntimeError, match=r"x must be \[M, K\]"):
        mm(x[None], w, s)


def test_int8_linear_takes_the_avx2_path_and_agrees_with_torchs_kernel(mm, monkeypatch):
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 40).bfloat16()
    fast = models.Int8Linear.from_linear(lin)
    monkeypatch.setenv(int8_kernel.ENV, "torch")
    slow = models.Int8Linear.from_linear(lin)
    assert (fast.kernel, slow.kernel) == ("avx2", "torch")
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


def test_the_kernel_setting_is_validated_and_torch_can_be_forced(monkeypatch):
    monkeypatch.setenv(int8_kernel.ENV, "fast-please")
    with pytest.raises(ValueError, match="COUPLING_INT8_KERNEL='fast-please': choose one of"):
        int8_kernel.kernel()
    monkeypatch.setenv(int8_kernel.ENV, "torch")
    assert int8_kernel.kernel() is None
    assert "COUPLING_INT8_KERNEL=torch" in int8_kernel.status()
    lin = torch.nn.Linear(32, 8)
    assert models.Int8Linear.from_linear(lin).kernel == "torch"
    assert models.Int8Linear.from_linear(torch.nn.Linear(5, 3)).kernel == "dense"


def test_int8_layers_with_either_kernel_make_the_same_model_up_to_rounding(mm, monkeypatch):
    """A tiny Llama quantized twice (AVX2 kernel, torch's kernel): the same int8 weights and
    logits within float rounding. (Only the projections are row-independent bit for bit: the
    attention kernel's sums may differ between calls of different lengths.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg).eval()
    import copy

    fast = models.quantize_target_int8(copy.deepcopy(base))
    monkeypatch.setenv(int8_kernel.ENV, "torch")
    slow = models.quantize_target_int8(copy.deepcopy(base))
    assert fast.lm_head.kernel == "avx2" and slow.lm_head.kernel == "torch"
    ids = torch.tensor([[3, 9, 1, 40, 7, 22]])
    for mf, ms in zip(fast.modules(), slow.modules(), strict=True):
        if isinstance(mf, models.Int8Linear):
            assert torch.equal(mf.qweight, ms.qweight) and torch.equal(mf.scale, ms.scale)
    with torch.no_grad():
        a, b = fast(ids).logits, slow(ids).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_failed_build_falls_back_to_torchs_kernel_and_says_why(monkeypatch):
    """No compiler (simulated): kernel() is None, a RuntimeWarning and status() name the error,
    and Int8Linear runs torch's kernel; the next build attempt is not blocked by the failure."""
    import torch.utils.cpp_extension as cpp

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: c++: command not found")

    monkeypatch.setenv(int8_kernel.ENV, "avx2")
    monkeypatch.setattr(cpp, "load", no_compiler)
    int8_kernel._compiled.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="building the AVX2 kernel failed"):
            assert int8_kernel.kernel() is None
        assert "c++: command not found" in int8_kernel.status()
        assert models.Int8Linear.from_linear(torch.nn.Linear(32, 8)).kernel == "torch"
    finally:
        int8_kernel._compiled.cache_clear()              # later tests load the real build


def test_the_ninja_wheel_is_put_on_path_when_none_is_there(monkeypatch):
    ninja = pytest.importorskip("ninja")
    monkeypatch.setattr(int8_kernel.shutil, "which", lambda name: None)
    monkeypatch.setenv("PATH", "/nowhere")
    int8_kernel._put_ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[0] == ninja.BIN_DIR


def test_the_build_directory_is_keyed_by_source_and_torch_not_the_checkout(monkeypatch,
                                                                           tmp_path):
    """Every checkout with the same kernel source and torch installation builds in (and loads
    from) one directory, compiling a copy of the source kept there: ninja would rebuild on a
    new source path; another torch installation (another venv) gets its own directory."""
    import hashlib
    from pathlib import Path

    monkeypatch.setenv("COUPLING_CACHE", str(tmp_path))
    first = int8_kernel._build_directory()
    home = str(Path(torch.__file__).resolve().parent).encode()
    digest = hashlib.sha256(int8_kernel.SOURCE.read_bytes() + b"\0" + home).hexdigest()[:16]
    assert first.parent == tmp_path / "torch_extensions" and digest in first.name
    copy = first / int8_kernel.SOURCE.name
    assert copy.read_bytes() == int8_kernel.SOURCE.read_bytes()
    copy.write_bytes(b"// stale")                       # a torn or older copy is replaced
    assert int8_kernel._build_directory() == first
    assert copy.read_bytes() == int8_kernel.SOURCE.read_bytes()
    assert sorted(p.name for p in first.iterdir()) == [int8_kernel.SOURCE.name]
    other = tmp_path / "torch_elsewhere" / "torch" / "__init__.py"
    monkeypatch.setattr(int8_kernel.torch, "__file__", str(other))
    assert int8_kernel._build_directory() != first


def test_status_follows_the_setting_back_and_forth(mm, monkeypatch):
    monkeypatch.setenv(int8_kernel.ENV, "torch")
    assert int8_kernel.kernel() is None and int8_kernel.status().startswith("torch (")
    monkeypatch.setenv(int8_kernel.ENV, "avx2")
    assert int8_kernel.kernel() is mm and int8_kernel.status() == "avx2"


@pytest.mark.parametrize("capability, loads", [("AVX2", True), ("AVX512", True),
                                               ("DEFAULT", False)])
def test_auto_uses_the_extension_on_avx2_and_avx512_cpus_only(mm, monkeypatch, capability,
                                                              loads):
    """An AVX-512 CPU runs the AVX2 code too, and there it was measured to win (stop 29); a CPU
    torch reports without AVX2 keeps torch's kernel and the Python steps, and says why."""
    monkeypatch.setenv(int8_kernel.ENV, "auto")
    monkeypatch.setattr(int8_kernel.torch.backends.cpu, "get_cpu_capability", lambda: capability)
    int8_kernel._compiled.cache_clear()
    try:
        assert (int8_kernel.kernel() is not None) == loads
        assert (int8_kernel.function("top_k_law") is not None) == loads
        assert (int8_kernel.status() == "avx2") == loads
        if not loads:
            assert "capability is DEFAULT; the kernel needs AVX2" in int8_kernel.status()
    finally:
        int8_kernel._compiled.cache_clear()              # later tests load the real build


# ---- int16 activations: int8_mm_i16, the w8a16 target's product ----

@pytest.fixture(scope="module")
def mm16():
    fn = int8_kernel.kernel("int16")
    if fn is None:
        pytest.skip(f"AVX2 int8 kernel unavailable: {int8_kernel.status()}")
    return fn


def integer_reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float32(exact sum of xq * w) * (t * s): int8_mm_i16 to the last bit (int16_rows' xq are
    integers below 2^15 and w's below 2^7, so the float64 product is exact)."""
    xq, t = int8_kernel.int16_rows(x)
    return (xq.double() @ w.double().T).float() * (t[:, None] * s[None, :])


def test_int16_levels_keep_every_sum_inside_int32():
    assert int8_kernel.int16_levels(576) == 29127 and int8_kernel.int16_levels(1536) == 10922
    assert int8_kernel.int16_levels(16) == 32767
    for k in (16, 576, 1152, 1536, 8192, 49152):
        assert k * 128 * int8_kernel.int16_levels(k) <= 2 ** 31 - 1
    with pytest.raises(ValueError, match="in_features=0"):
        int8_kernel.int16_levels(0)
    with pytest.raises(ValueError, match="activations='int4': choose one of float, int16"):
        int8_kernel.kernel("int4")


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), k16=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_int16_rows_round_each_row_on_its_own_scale(m, k16, seed):
    k = 16 * k16
    x = heavy_tailed(m, k, seed)
    x[0] = 0.0                                         # a zero row: t = 0, xq = 0
    xq, t = int8_kernel.int16_rows(x)
    A = int8_kernel.int16_levels(k)
    assert torch.equal(xq, torch.round(xq)) and float(xq.abs().max()) <= A
    assert float(t[0]) == 0.0 and not xq[0].any()
    assert torch.equal(xq[1:].abs().amax(1), torch.full((m - 1,), float(A)))  # the max hits A
    err = (xq * t[:, None] - x).abs()
    assert bool((err <= 0.5 * t[:, None] * (1 + 1e-5) + 1e-30).all())
    back = int8_kernel.round_rows_int16(x.bfloat16())
    assert back.dtype == torch.bfloat16
    bad = x.clone()
    bad[-1, 0] = float("inf")
    assert torch.isnan(int8_kernel.int16_rows(bad)[1][-1])
    assert torch.equal(int8_kernel.round_rows_int16(bad)[-1], bad[-1])


@pytest.mark.parametrize("n,k", [(1, 16), (7, 48), (13, 576), (192, 576), (61, 1536)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 7, 13])
def test_int16_kernel_equals_its_integer_reference_bit_for_bit(mm16, n, k, m):
    w, s = quantized(n, k, seed=n + k + m)
    x = heavy_tailed(m, k, seed=m)
    y = mm16(x, w, s)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert torch.equal(y, integer_reference(x, w, s))
    # and the float product up to the rounding of x, which moves it less than rounding x to
    # bf16 does (the demo's activations are bf16 before they reach the kernel)
    ref = reference(x, w, s)
    bf16_error = float((reference(x.bfloat16().float(), w, s) - ref).norm())
    assert float((y.double() - ref).norm()) <= 0.75 * bf16_error
    yb = mm16(x.bfloat16(), w, s)
    assert yb.dtype == torch.bfloat16
    assert torch.equal(yb, mm16(x.bfloat16().float(), w, s).bfloat16())


def test_int16_kernel_passes_nan_and_inf_on(mm16):
    w, s = quantized(8, 32, 0)
    x = torch.randn(3, 32)
    x[1, 5] = float("nan")
    y = mm16(x, w, s)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    x[1, 5] = float("inf")
    assert not torch.isfinite(mm16(x, w, s)[1]).any()
    x[1, 5], x[2, 31] = 1.0, float("-inf")            # the last column, a negative infinity
    y = mm16(x, w, s)
    assert not torch.isfinite(y[2]).any() and torch.isfinite(y[:2]).all()
    assert torch.equal(mm16(torch.zeros(2, 32), w, s), torch.zeros(2, 8))


def test_int16_layers_agree_with_the_fallback_and_name_their_activations(mm16, monkeypatch):
    """Int8Linear(activations="int16") on the AVX2 kernel and on torch's kernel after
    round_rows_int16: the same rounded rows, sums within float rounding; a tiny Llama quantized
    as w8a16 says so, and bad settings are refused by name."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(4)
    lin = torch.nn.Linear(64, 40)
    fast = models.Int8Linear.from_linear(lin, "int16")
    x = heavy_tailed(5, 64, 1)
    with torch.no_grad():
        a = fast(x)
        assert torch.equal(a, integer_reference(x, fast.qweight, fast._scale_f32) + lin.bias)
    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False)
    base = LlamaForCausalLM(cfg).eval()
    w8a16 = models.quantize_target_int8(copy.deepcopy(base), "int16")
    assert w8a16.coupling_target_quant == "w8a16" and w8a16.lm_head.activations == "int16"
    with pytest.raises(ValueError, match="already weight-only int8"):
        models.quantize_target_int8(w8a16)
    with pytest.raises(ValueError, match="activations='int8': choose one of float, int16"):
        models.quantize_target_int8(copy.deepcopy(base), "int8")
    with pytest.raises(ValueError, match="activations='half': choose one of float, int16"):
        models.Int8Linear.from_linear(lin, "half")
    monkeypatch.setenv(int8_kernel.ENV, "torch")
    slow = models.Int8Linear.from_linear(lin, "int16")
    assert (fast.kernel, slow.kernel) == ("avx2", "torch")
    with torch.no_grad():
        torch.testing.assert_close(slow(x), a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
    w8a16_torch = models.quantize_target_int8(copy.deepcopy(base), "int16")
    ids = torch.tensor([[3, 9, 1, 40, 7, 22]])
    with torch.no_grad():
        torch.testing.assert_close(w8a16(ids).logits, w8a16_torch(ids).logits,
                                   atol=1e-4, rtol=1e-4)
