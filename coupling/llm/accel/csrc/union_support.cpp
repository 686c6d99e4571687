// The union support of a rule's laws (coupling.llm.rules_adapter.checked_support) in one pass.
#include "accel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

// Sorted ids of the columns where some row of some law [R_j, V] (float32, contiguous) is
// positive: rules_adapter.support's amax(0) > 0 over every row. An empty tensor and false when
// an entry is NaN, infinite or negative (the caller then takes the torch path).
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
