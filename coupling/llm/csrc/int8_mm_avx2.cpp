// Weight-only int8 matrix product for a few rows on an AVX2 CPU (coupling.llm.int8_kernel).
//
//   y[m, n] = s[n] * sum_k x[m, k] * w[n, k]      x: [M, K] float/bf16, w: [N, K] int8, s: [N] f32
//
// Why: speculative verification scores gamma + 1 rows where plain sampling scores one, and it
// pays only if those rows cost about what one row costs. Each int8 weight is widened to float
// once per group of up to 6 rows of x, so 2-6 rows stream the weights once (a row beyond the
// first few then costs its FMAs at about the CPU's peak rate: the stream hides the rest).
// Every (row, output) sum runs the same sequence of FMAs whatever M and the thread split are, so
// a row's result is bit for bit the same in a call of 1 row or of 50 (a token's projections do
// not depend on the tokens it is verified with).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  s = _mm_add_ss(s, _mm_movehl_ps(sh, s));
  return _mm_cvtss_f32(s);
}

inline __m256 widen8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Output n for M rows of x: the int8 row w[n, :] is widened to float once per 8 columns and
// feeds one FMA per row of x. Two partial sums per (row, output), over alternate 8-blocks of k,
// let FMA chains overlap. (Interleaving several weight rows, tried with 2 and 4, was slower:
// 1.1-1.7x here, streams from memory seem to prefetch best one at a time.)
template <int M>
inline void output(const float* x, const int8_t* wn, float s, float* y, int64_t K, int64_t N) {
  __m256 a[M][2];
  for (int m = 0; m < M; ++m) a[m][0] = a[m][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m256 w0 = widen8(wn + k), w1 = widen8(wn + k + 8);
    for (int m = 0; m < M; ++m) {
      a[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k), w0, a[m][0]);
      a[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * K + k + 8), w1, a[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) y[m * N] = s * hsum(_mm256_add_ps(a[m][0], a[m][1]));
}

template <int M>
void outputs(const float* x, const int8_t* w, const float* s, float* y, int64_t K, int64_t N,
             int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) output<M>(x, w + n * K, s[n], y + n, K, N);
}

}  // namespace

torch::Tensor int8_mm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && scale.device().is_cpu(),
              "int8_mm: CPU tensors only");
  TORCH_CHECK(x.dim() == 2, "int8_mm: x must be [M, K], got ", x.sizes());
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous(),
              "int8_mm: w must be a contiguous int8 [N, K] tensor");
  TORCH_CHECK(scale.dim() == 1 && scale.scalar_type() == at::kFloat && scale.is_contiguous(),
              "int8_mm: scale must be a contiguous float32 [N] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "int8_mm: x has K = ", K, " columns, w has ", w.size(1));
  TORCH_CHECK(K % 16 == 0, "int8_mm: K = ", K, " is not a multiple of 16");
  TORCH_CHECK(scale.size(0) == N, "int8_mm: scale has ", scale.size(0), " entries, w has N = ", N);
  const auto xf = x.to(at::kFloat).contiguous();
  auto y = torch::empty({M, N}, xf.options());
  const float* xp = xf.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // about 128 KB of weights per task: small products stay on one thread
  const int64_t grain = std::max<int64_t>(8, (int64_t(1) << 17) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    // 6 rows: 12 accumulators and the 2 widened weight vectors fill 14 of AVX2's 16 registers
    for (int64_t m0 = 0; m0 < M; m0 += 6) {
      const float* xm = xp + m0 * K;
      float* ym = yp + m0 * N;
      switch (std::min<int64_t>(6, M - m0)) {
        case 1: outputs<1>(xm, wp, sp, ym, K, N, n0, n1); break;
        case 2: outputs<2>(xm, wp, sp, ym, K, N, n0, n1); break;
        case 3: outputs<3>(xm, wp, sp, ym, K, N, n0, n1); break;
        case 4: outputs<4>(xm, wp, sp, ym, K, N, n0, n1); break;
        case 5: outputs<5>(xm, wp, sp, ym, K, N, n0, n1); break;
        default: outputs<6>(xm, wp, sp, ym, K, N, n0, n1); break;
      }
    }
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// The feature draft's step (coupling.llm.feature_draft.FeatureDraft._features_lean, its fc and
// its head) as one call. Why: the step is ~55 small tensor operations, and from Python each
// pays ~10 us of dispatch, ~0.5 ms a step, about what its weights cost to read. Here the same
// ATen operations run in the same order on the same dtypes (and the products are the same
// int8_mm), so the result is bit for bit the Python path's (tests/test_llm.py).
namespace {

struct Int8Lin {
  at::Tensor qweight, scale_f32, scale, bias;   // bias undefined when absent
};

Int8Lin int8_lin(const std::vector<at::Tensor>& t, size_t i) {
  return {t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]};
}

// Int8Linear.forward: x.reshape(-1, in).to(scale.dtype), the product, + bias, reshape back
at::Tensor apply(const Int8Lin& l, const at::Tensor& x) {
  auto lead = x.sizes().vec();
  const int64_t in = l.qweight.size(1), out = l.qweight.size(0);
  auto y = int8_mm(x.reshape({-1, in}).to(l.scale.scalar_type()), l.qweight, l.scale_f32);
  if (l.bias.defined() && l.bias.numel()) y = y + l.bias;
  lead.back() = out;
  return y.reshape(lead);
}

// feature_draft._rms_norm: F.rms_norm in float32, cast back, times the weight
at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto y = at::rms_norm(x.to(at::kFloat), {x.size(-1)}, c10::nullopt, eps);
  return w * y.to(x.scalar_type());
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

}  // namespace

// ids [B, n] int64, feats [B, n, d]; lin: (qweight, scale_f32, scale, bias) for fc, qkv, o,
// gate_up, down, head (the head's scale multiplies its logits after it, as _scaled does);
// norms: input, post-attention, final; cos / sin [n, hd] of the n new positions; the caches
// [B, Hkv, capacity, hd] receive the new keys and values at [start, start + n).
// Returns (predicted features [B, n, d], head logits of the last position [B, S]).
std::vector<at::Tensor> feature_step(
    const at::Tensor& ids, const at::Tensor& feats, const at::Tensor& embed,
    const std::vector<at::Tensor>& lin, const std::vector<at::Tensor>& norms,
    const std::vector<double>& eps, const at::Tensor& cos, const at::Tensor& sin,
    at::Tensor k_cache, at::Tensor v_cache, int64_t start, std::vector<int64_t> qkv_sizes,
    int64_t head_dim, double scaling, double logit_scale) {
  TORCH_CHECK(lin.size() == 24 && norms.size() == 3 && eps.size() == 3 && qkv_sizes.size() == 3,
              "feature_step: 6 linears x 4 tensors, 3 norms, 3 eps, 3 qkv sizes");
  at::NoGradGuard no_grad;
  const int64_t B = ids.size(0), n = ids.size(1), end = start + n;
  TORCH_CHECK(end <= k_cache.size(2), "feature_step: the cache holds ", k_cache.size(2),
              " positions, the step needs ", end);
  auto e = at::embedding(embed, ids);
  auto x = apply(int8_lin(lin, 0), at::cat({e, feats.to(e.scalar_type())}, -1));
  auto h = rms(x, norms[0], eps[0]);
  auto qkv = at::split_with_sizes(apply(int8_lin(lin, 1), h), qkv_sizes, -1);
  auto q = qkv[0].view({B, n, -1, head_dim}).transpose(1, 2);
  auto k = qkv[1].view({B, n, -1, head_dim}).transpose(1, 2);
  auto v = qkv[2].view({B, n, -1, head_dim}).transpose(1, 2);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  k_cache.slice(2, start, end).copy_(k);
  v_cache.slice(2, start, end).copy_(v);
  auto keys = k_cache.slice(2, 0, end), values = v_cache.slice(2, 0, end);
  c10::optional<at::Tensor> mask;
  if (n > 1) {
    auto opts = at::TensorOptions().dtype(at::kLong).device(x.device());
    mask = at::arange(end, opts).unsqueeze(0) <= at::arange(end - n, end, opts).unsqueeze(1);
  }
  auto o = at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, scaling, true);
  x = x + apply(int8_lin(lin, 2), o.transpose(1, 2).reshape({B, n, -1}));
  h = rms(x, norms[1], eps[1]);
  auto gu = apply(int8_lin(lin, 3), h).chunk(2, -1);
  x = x + apply(int8_lin(lin, 4), at::silu(gu[0]) * gu[1]);
  auto f = rms(x, norms[2], eps[2]);
  auto logits = apply(int8_lin(lin, 5), f.select(1, n - 1));
  if (logit_scale != 1.0) logits = logits * logit_scale;
  return {f, logits};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_mm", &int8_mm, "y = (x @ w.T) * scale for int8 w, AVX2");
  m.def("feature_step", &feature_step, "the int8 feature draft's step (feature_draft.py)");
}
