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
//
// Also here, for the same reason (a CPU step's small tensor operations cost more than their
// arithmetic): the int8 feature draft's step (feature_step) and the sampling laws (top_k_law,
// inverse_cdf, union_support; coupling.llm.sampling).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

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

// The arguments both products take (x [M, K], w [N, K] int8, scale [N] float32), checked
// with messages that name the product; returns {M, K, N}.
std::array<int64_t, 3> checked_shapes(const char* name, const torch::Tensor& x,
                                      const torch::Tensor& w, const torch::Tensor& scale) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && scale.device().is_cpu(),
              name, ": CPU tensors only");
  TORCH_CHECK(x.dim() == 2, name, ": x must be [M, K], got ", x.sizes());
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kChar && w.is_contiguous(),
              name, ": w must be a contiguous int8 [N, K] tensor");
  TORCH_CHECK(scale.dim() == 1 && scale.scalar_type() == at::kFloat && scale.is_contiguous(),
              name, ": scale must be a contiguous float32 [N] tensor");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, name, ": x has K = ", K, " columns, w has ", w.size(1));
  TORCH_CHECK(K % 16 == 0, name, ": K = ", K, " is not a multiple of 16");
  TORCH_CHECK(scale.size(0) == N, name, ": scale has ", scale.size(0), " entries, w has N = ", N);
  return {M, K, N};
}

// Calls group(m0, std::integral_constant<int, R>()) for each group of up to 6 rows of an
// [M, K] input, R its row count: 6 rows' accumulators (12) and the 2 widened weight vectors
// fill 14 of AVX2's 16 registers.
template <typename Group>
void row_groups(int64_t M, Group&& group) {
  for (int64_t m0 = 0; m0 < M; m0 += 6) {
    switch (std::min<int64_t>(6, M - m0)) {
      case 1: group(m0, std::integral_constant<int, 1>()); break;
      case 2: group(m0, std::integral_constant<int, 2>()); break;
      case 3: group(m0, std::integral_constant<int, 3>()); break;
      case 4: group(m0, std::integral_constant<int, 4>()); break;
      case 5: group(m0, std::integral_constant<int, 5>()); break;
      default: group(m0, std::integral_constant<int, 6>()); break;
    }
  }
}

// Both products' loop: the N outputs split over threads, each task's rows taken in groups
// (row_groups); calls block(m0, rows, n0, n1) for outputs [n0, n1) of one row group.
template <typename Block>
void output_blocks(int64_t M, int64_t K, int64_t N, Block&& block) {
  // about 128 KB of weights per task: small products stay on one thread
  const int64_t grain = std::max<int64_t>(8, (int64_t(1) << 17) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    row_groups(M, [&](int64_t m0, auto rows) { block(m0, rows, n0, n1); });
  });
}

}  // namespace

torch::Tensor int8_mm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale) {
  const auto shape = checked_shapes("int8_mm", x, w, scale);   // lambdas capture no bindings
  const int64_t M = shape[0], K = shape[1], N = shape[2];
  const auto xf = x.to(at::kFloat).contiguous();
  auto y = torch::empty({M, N}, xf.options());
  const float* xp = xf.data_ptr<float>();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  output_blocks(M, K, N, [&](int64_t m0, auto rows, int64_t n0, int64_t n1) {
    outputs<decltype(rows)::value>(xp + m0 * K, wp, sp, yp + m0 * N, K, N, n0, n1);
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

// The same product with integer arithmetic: each row of x is rounded to int16 on its own scale,
//
//   xq[m, k] = round(x[m, k] / t[m]),  t[m] = max_k |x[m, k]| / A,  A = min(32767, (2^31 - 1) / (128 K))
//   y[m, n]  = float(sum_k xq[m, k] * w[n, k]) * (t[m] * s[n])
//
// and the sums are exact in int32 (A keeps |sum| < 2^31 for any int8 w). Why: a row beyond the
// first costs the float kernel 8 FMAs per 64 weights, at the two cores' FMA peak; here it costs
// 2 vpmaddwd (16 products each) and 2 vpaddd, which AVX2 issues about twice as fast (a scratch
// loop here: 16 int16 products per 0.43 ns against 8 float products per 0.47 ns). The rounding
// is finer than bf16's for every entry above max|x| / 2^7 of its row (SmolLM2's inputs have
// A >= 10922), and the target's next-token laws stay as far from the float32 target's as the
// float kernel's (docs/RESULTS.md, stop 28). One row also gets cheaper (no float widening of
// the weights): a whole target call costs 0.97x the float kernel's for 1 token and 0.92-0.95x
// for 2-3. Integer sums are exact, so a row's result is bit for bit the same in a call of any
// size and any thread split. A row with a NaN or an infinity sends the call to the float
// kernel, which propagates it.
namespace {

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

inline __m256i widen16(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256i load16(const int16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Output n for M rows: the int8 row w[n, :] is widened to int16 once per 16 columns and feeds
// one vpmaddwd per row; two int32 partial sums per (row, output), as in output<M>.
template <int M>
inline void output_i16(const int16_t* xq, const float* t, const int8_t* wn, float s, float* y,
                       int64_t K, int64_t N) {
  __m256i a[M][2];
  for (int m = 0; m < M; ++m) a[m][0] = a[m][1] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m256i w0 = widen16(wn + k), w1 = widen16(wn + k + 16);
    for (int m = 0; m < M; ++m) {
      a[m][0] = _mm256_add_epi32(a[m][0], _mm256_madd_epi16(load16(xq + m * K + k), w0));
      a[m][1] = _mm256_add_epi32(a[m][1], _mm256_madd_epi16(load16(xq + m * K + k + 16), w1));
    }
  }
  if (k < K) {                                   // K = 32 j + 16
    const __m256i w0 = widen16(wn + k);
    for (int m = 0; m < M; ++m)
      a[m][0] = _mm256_add_epi32(a[m][0], _mm256_madd_epi16(load16(xq + m * K + k), w0));
  }
  for (int m = 0; m < M; ++m)
    y[m * N] = static_cast<float>(hsum_epi32(_mm256_add_epi32(a[m][0], a[m][1]))) * (t[m] * s);
}

template <int M>
void outputs_i16(const int16_t* xq, const float* t, const int8_t* w, const float* s, float* y,
                 int64_t K, int64_t N, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) output_i16<M>(xq, t, w + n * K, s[n], y + n, K, N);
}

// Row m of x -> xq[m, :] (round to nearest even, as _mm256_cvtps_epi32 does) and its scale
// t[m]; false where the row holds a NaN or an infinity.
bool quantize_row(const float* x, int16_t* xq, float* t, int64_t K, float A) {
  __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + k), abs_mask);
    mx = _mm256_max_ps(mx, a);
    // max_ps drops NaNs, so flag them here: "not less than inf" holds for inf and NaN alike
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
  }
  if (_mm256_movemask_ps(bad)) return false;
  float amax = 0.f;
  for (int i = 0; i < 8; ++i) amax = std::max(amax, mx[i]);
  if (amax == 0.f) {
    std::fill(xq, xq + K, int16_t(0));
    *t = 0.f;
    return true;
  }
  const float inv = A / amax;
  *t = amax / A;
  const __m256 lim = _mm256_set1_ps(A);
  for (int64_t k = 0; k < K; k += 16) {
    const __m256 lo = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k),
        _mm256_set1_ps(inv)), -lim), lim);
    const __m256 hi = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8),
        _mm256_set1_ps(inv)), -lim), lim);
    // packs interleaves 128-bit lanes: [lo0 hi0 lo1 hi1] -> permute to [lo0 lo1 hi0 hi1]
    const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(lo), _mm256_cvtps_epi32(hi));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + k),
                        _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
  }
  return true;
}

}  // namespace

torch::Tensor int8_mm_i16(const torch::Tensor& x, const torch::Tensor& w,
                          const torch::Tensor& scale) {
  const auto shape = checked_shapes("int8_mm_i16", x, w, scale);   // lambdas capture no bindings
  const int64_t M = shape[0], K = shape[1], N = shape[2];
  const auto xf = x.to(at::kFloat).contiguous();
  // int16_levels in int8_kernel.py
  const float A = static_cast<float>(
      std::min<int64_t>(32767, ((int64_t(1) << 31) - 1) / (128 * K)));
  std::vector<int16_t> xq(M * K);
  std::vector<float> t(M);
  for (int64_t m = 0; m < M; ++m)
    if (!quantize_row(xf.data_ptr<float>() + m * K, xq.data() + m * K, t.data() + m, K, A))
      return int8_mm(x, w, scale);
  auto y = torch::empty({M, N}, xf.options());
  const int16_t* xp = xq.data();
  const float* tp = t.data();
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  output_blocks(M, K, N, [&](int64_t m0, auto rows, int64_t n0, int64_t n1) {
    outputs_i16<decltype(rows)::value>(xp + m0 * K, tp + m0, wp, sp, yp + m0 * N, K, N, n0, n1);
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

namespace {

// ---- Sampling laws (coupling.llm.sampling.probs, the inverse-CDF draws of the engine) ----
// Why: the law of a few rows of V = 49152 logits under top-k / top-p is ~25 small tensor
// operations in Python (a torch.topk of k + 32 entries alone is ~100 us a row), 0.6-1.1 ms for
// a 3-row verification call and 0.3 ms for a draft row, about 4% of a step here. One pass per
// row with a running k-th largest value settles the top-k set (ties with the k-th value kept,
// as in the Python path); the softmax, the nucleus and the output are then O(k) work.

inline float load_val(const float* p, int64_t i) { return p[i]; }
inline float load_val(const at::BFloat16* p, int64_t i) { return static_cast<float>(p[i]); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {  // bf16 -> float32 is exact: the high 16 bits
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Lanes of v above thr, or not finite (NaN compares unordered, +-inf equals inf in magnitude).
inline int flagged(__m256 v, __m256 thr) {
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 mag = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
  __m256 m = _mm256_or_ps(_mm256_cmp_ps(v, thr, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_movemask_ps(_mm256_or_ps(m, _mm256_cmp_ps(mag, inf, _CMP_EQ_OQ)));
}

// The law of one row into out (zeroed), at out[col(i)] for kept column i. False when the row
// holds a non-finite value (the caller falls back to the Python path, which has its own rules).
//
// The kept set is {i : x_i >= x_(k)}, x = float32(logit) / temperature and x_(k) its k-th
// largest value. Division by t > 0 is monotone, so x_(k) = l_(k) / t for the logits' own k-th
// largest l_(k), found on the logits with a min-heap of the k largest (the vector pass skips
// blocks of 8 at or below the heap's least). Rounding can only tie an l_i < l_(k) with it when
// l_i lies within float32 rounding of l_(k) (never for bf16 logits, 2^-8 apart), so the kept
// set is read from the divided values of the logits above l_(k) (1 - 1e-6).
template <typename T>
bool row_law(const T* row, int64_t n, float temperature, int64_t k, double top_p,
             const int64_t* col, float* out, std::vector<float>& heap,
             std::vector<int64_t>& kept, std::vector<double>& pk, std::vector<int64_t>& order) {
  heap.resize(k);
  for (int64_t i = 0; i < k; ++i) {
    heap[i] = load_val(row, i);
    if (!std::isfinite(heap[i])) return false;
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<float>());
  auto offer = [&](int64_t i) {
    const float v = load_val(row, i);
    if (!std::isfinite(v)) return false;
    if (v > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
      heap.back() = v;
      std::push_heap(heap.begin(), heap.end(), std::greater<float>());
    }
    return true;
  };
  int64_t i = k;
  for (; i < n && (i & 7); ++i) if (!offer(i)) return false;   // up to a multiple of 8
  for (; i + 8 <= n; i += 8) {
    if (flagged(load8(row + i), _mm256_set1_ps(heap.front()))) {
      for (int64_t j = i; j < i + 8; ++j) if (!offer(j)) return false;
    }
  }
  for (; i < n; ++i) if (!offer(i)) return false;
  const float lk = heap.front();
  const float kth = lk / temperature;
  // a temperature above 1 can push logits / T into the subnormal range, where division rounds
  // by an absolute step and logits below lo may land on kth: the Python path decides those
  if (temperature > 1.0f && std::fabs(kth) < FLT_MIN) return false;
  const float lo = lk - std::fabs(lk) * 1e-6f - 1e-30f;
  kept.clear();
  const __m256 vlo = _mm256_set1_ps(lo);
  auto take = [&](int64_t j) {
    const float v = load_val(row, j);
    if (v > lo && v / temperature >= kth) kept.push_back(j);
  };
  for (i = 0; i + 8 <= n; i += 8) {
    if (_mm256_movemask_ps(_mm256_cmp_ps(load8(row + i), vlo, _CMP_GT_OQ))) {
      for (int64_t j = i; j < i + 8; ++j) take(j);
    }
  }
  for (; i < n; ++i) take(i);
  const size_t m = kept.size();
  float mx = kth;
  for (size_t j = 0; j < m; ++j) mx = std::max(mx, load_val(row, kept[j]) / temperature);
  if (!std::isfinite(mx)) return false;           // a logit overflowing when divided
  pk.resize(m);
  double total = 0.0;
  for (size_t j = 0; j < m; ++j) {
    pk[j] = std::exp(static_cast<double>(load_val(row, kept[j]) / temperature - mx));
    total += pk[j];
  }
  for (size_t j = 0; j < m; ++j) pk[j] /= total;
  if (top_p < 1.0) {
    // the nucleus: most likely first, ties in column order; an entry stays while the mass
    // strictly above it is below top_p (so the one that crosses the threshold is kept)
    order.resize(m);
    for (size_t j = 0; j < m; ++j) order[j] = static_cast<int64_t>(j);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return pk[a] > pk[b]; });
    double before = 0.0, keep = 0.0;
    for (size_t r = 0; r < m; ++r) {
      const int64_t j = order[r];
      const double pj = pk[j];
      if (before >= top_p) pk[j] = 0.0; else keep += pj;
      before += pj;
    }
    for (size_t j = 0; j < m; ++j) pk[j] /= keep;
  }
  for (size_t j = 0; j < m; ++j) {
    const int64_t c = col ? col[kept[j]] : kept[j];
    out[c] = static_cast<float>(pk[j]);
  }
  return true;
}

// logits [R, n] float32 or bfloat16 (contiguous); columns: [n] int64 vocabulary ids of the n
// columns (an empty tensor: column i is token i); vocab: the output's width. Returns the laws
// [R, vocab] float32, or an empty tensor when a row is not finite.
at::Tensor top_k_law(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                     const at::Tensor& columns, int64_t vocab) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous() && logits.device().is_cpu(),
              "logits must be a contiguous CPU matrix [R, n]");
  const int64_t R = logits.size(0), n = logits.size(1);
  TORCH_CHECK(top_k >= 1 && top_k < n, "top_k must lie in [1, n)");
  TORCH_CHECK(temperature > 0.0 && top_p > 0.0 && top_p <= 1.0,
              "temperature must be > 0 and top_p in (0, 1]");
  const int64_t* col = nullptr;
  if (columns.numel()) {
    TORCH_CHECK(columns.scalar_type() == at::kLong && columns.is_contiguous() &&
                columns.numel() == n, "columns must be n contiguous int64 ids");
    col = columns.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)       // the law is written at these ids: check them all
      TORCH_CHECK(col[i] >= 0 && col[i] < vocab, "columns must lie in [0, vocab)");
  } else {
    TORCH_CHECK(vocab == n, "without columns the output has the logits' width");
  }
  auto out = at::zeros({R, vocab}, logits.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  std::vector<float> heap;
  std::vector<int64_t> kept, order;
  std::vector<double> pk;
  const float t = static_cast<float>(temperature);
  for (int64_t r = 0; r < R; ++r) {
    bool ok;
    if (logits.scalar_type() == at::kFloat) {
      ok = row_law(logits.data_ptr<float>() + r * n, n, t, top_k, top_p, col, o + r * vocab,
                   heap, kept, pk, order);
    } else {
      TORCH_CHECK(logits.scalar_type() == at::kBFloat16, "logits must be float32 or bfloat16");
      ok = row_law(logits.data_ptr<at::BFloat16>() + r * n, n, t, top_k, top_p, col,
                   o + r * vocab, heap, kept, pk, order);
    }
    if (!ok) return at::empty({0}, out.options());
  }
  return out;
}

// One draw per row of weights [R, V] float32 (non-negative, contiguous) with uniforms u [R]
// float64: the first i with cdf[i] > min(u * cdf[V-1], nextafter(cdf[V-1], 0)), cdf the float64
// running sum in column order, which is what torch's cumsum + searchsorted return (zeros add
// nothing to a sum exactly, so they are skipped). -1 for a row of total 0.
at::Tensor inverse_cdf(const at::Tensor& weights, const at::Tensor& u) {
  TORCH_CHECK(weights.dim() == 2 && weights.is_contiguous() && weights.scalar_type() == at::kFloat
              && weights.device().is_cpu(), "weights must be a contiguous float32 CPU matrix");
  TORCH_CHECK(u.dim() == 1 && u.scalar_type() == at::kDouble && u.size(0) == weights.size(0),
              "u must be float64 [R]");
  const int64_t R = weights.size(0), V = weights.size(1);
  auto out = at::empty({R}, weights.options().dtype(at::kLong));
  auto uc = u.contiguous();
  const double* up = uc.data_ptr<double>();
  std::vector<int64_t> nz;
  for (int64_t r = 0; r < R; ++r) {
    const float* w = weights.data_ptr<float>() + r * V;
    nz.clear();
    double total = 0.0;
    for (int64_t i = 0; i < V; ++i) {
      if (w[i] != 0.0f) { nz.push_back(i); total += static_cast<double>(w[i]); }
    }
    int64_t pick = -1;
    if (total > 0.0) {
      const double target = std::min(up[r] * total, std::nextafter(total, 0.0));
      double c = 0.0;
      pick = nz.back();
      for (int64_t i : nz) {
        c += static_cast<double>(w[i]);
        if (c > target) { pick = i; break; }
      }
    }
    out.data_ptr<int64_t>()[r] = pick;
  }
  return out;
}

// Sorted ids of the columns where some row of some law [R_j, V] (float32, contiguous) is
// positive: rules_adapter.support's amax(0) > 0 over every row. An empty tensor and false when
// an entry is NaN, infinite or negative (the caller then takes the Python path).
std::tuple<at::Tensor, bool> union_support(const std::vector<at::Tensor>& laws) {
  TORCH_CHECK(!laws.empty(), "union_support needs at least one law");
  const int64_t V = laws[0].size(-1);
  std::vector<int64_t> ids;
  const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY);
  for (const auto& law : laws) {
    TORCH_CHECK(law.scalar_type() == at::kFloat && law.is_contiguous() && law.device().is_cpu()
                && law.size(-1) == V, "laws must be contiguous float32 CPU tensors [.., V]");
    const float* w = law.data_ptr<float>();
    const int64_t rows = V ? law.numel() / V : 0;
    for (int64_t r = 0; r < rows; ++r, w += V) {
      int64_t i = 0;
      for (; i + 8 <= V; i += 8) {
        const __m256 v = _mm256_loadu_ps(w + i);
        // positive, negative, NaN or infinite lanes: anything but +-0
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_NEQ_UQ))) {
          if (_mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v, zero, _CMP_NGE_UQ),
                                              _mm256_cmp_ps(v, inf, _CMP_EQ_OQ))))
            return {at::empty({0}, law.options().dtype(at::kLong)), false};
          for (int64_t j = i; j < i + 8; ++j) if (w[j] > 0.0f) ids.push_back(j);
        }
      }
      for (; i < V; ++i) {
        if (!(w[i] >= 0.0f) || std::isinf(w[i]))
          return {at::empty({0}, law.options().dtype(at::kLong)), false};
        if (w[i] > 0.0f) ids.push_back(i);
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  auto out = at::empty({static_cast<int64_t>(ids.size())}, laws[0].options().dtype(at::kLong));
  std::copy(ids.begin(), ids.end(), out.data_ptr<int64_t>());
  return {out, true};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("union_support", &union_support, "sorted ids where some row of some law is positive");
  m.def("top_k_law", &top_k_law, "top-k / top-p laws of logit rows (sampling.probs)");
  m.def("inverse_cdf", &inverse_cdf, "inverse-CDF draws, float64 running sums");
  m.def("int8_mm", &int8_mm, "y = (x @ w.T) * scale for int8 w, AVX2");
  m.def("int8_mm_i16", &int8_mm_i16, "int8_mm with x rounded to int16 per row, integer sums");
  m.def("feature_step", &feature_step, "the int8 feature draft's step (feature_draft.py)");
}
