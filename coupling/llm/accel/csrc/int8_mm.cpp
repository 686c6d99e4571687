// Weight-only int8 matrix product for a few rows (coupling.llm.int8.Int8Linear), AVX2 + FMA.
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
#include "accel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <type_traits>

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
// let FMA chains overlap.
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

// The product's arguments (x [M, K], w [N, K] int8, scale [N] float32), checked with messages
// that name it; returns {M, K, N}.
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

// The N outputs split over threads, each task's rows taken in groups (row_groups); calls
// block(m0, rows, n0, n1) for outputs [n0, n1) of one row group.
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
