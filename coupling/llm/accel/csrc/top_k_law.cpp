// The top-k (then top-p) law of logit rows, coupling.llm.sampling.probs's law, with AVX2.
//
// Why: the law of a few rows of V = 49152 logits under top-k / top-p is ~25 small tensor
// operations in torch (a torch.topk of k + 32 entries alone is ~100 us a row), computed for
// every drafted and verified position; here one pass per row with a running k-th largest value
// settles the top-k set (ties with the k-th value kept, as in the torch path), and the softmax,
// the nucleus and the output are O(k) work. It makes the default demo's best rule faster by
// more than 3% (python benchmarks/bench_accel.py --threads 1; docs/RESULTS.md).
#include "accel.h"

#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <vector>

namespace {

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
// holds a non-finite value (the caller falls back to the torch path, which has its own rules).
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
  // by an absolute step and logits below lo may land on kth: the torch path decides those
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

}  // namespace

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
