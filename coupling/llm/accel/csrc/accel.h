// The compiled paths of coupling.llm.accel, one concern per source file; bindings.cpp exports
// them to Python. Every function here has a pure-torch counterpart at its caller.
#pragma once

#include <torch/extension.h>

// top_k_law.cpp: top-k / top-p laws of logit rows (coupling.llm.sampling.probs)
at::Tensor top_k_law(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                     const at::Tensor& columns, int64_t vocab);

// inverse_cdf.cpp: inverse-CDF draws with float64 running sums (coupling.llm.sampling)
at::Tensor inverse_cdf(const at::Tensor& weights, const at::Tensor& u);
