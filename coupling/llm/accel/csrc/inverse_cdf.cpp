// Inverse-CDF draws, coupling.llm.sampling.sample_rows: the draws of
// coupling.torch_backend.sample_rows in one pass per row over the nonzero entries, instead of
// a float64 cumulative sum over the whole vocabulary and a search. It makes the default demo's
// best rule faster by more than 3% (python benchmarks/bench_accel.py --threads 1;
// docs/RESULTS.md).
#include "accel.h"

#include <algorithm>
#include <cmath>
#include <vector>

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
