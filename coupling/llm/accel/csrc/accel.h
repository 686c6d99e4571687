// The compiled paths of coupling.llm.accel, one concern per source file; bindings.cpp exports
// them to Python. Every function here has a pure-torch counterpart at its caller.
#pragma once

#include <torch/extension.h>

#include <tuple>
#include <vector>

// int8_mm.cpp: y = (x @ w.T) * scale for int8 w (coupling.llm.int8.Int8Linear)
torch::Tensor int8_mm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& scale);

// feature_step.cpp: the int8 feature draft's whole step (coupling.llm.feature_draft)
std::vector<at::Tensor> feature_step(
    const at::Tensor& ids, const at::Tensor& feats, const at::Tensor& embed,
    const std::vector<at::Tensor>& lin, const std::vector<at::Tensor>& norms,
    const std::vector<double>& eps, const at::Tensor& cos, const at::Tensor& sin,
    at::Tensor k_cache, at::Tensor v_cache, int64_t start, std::vector<int64_t> qkv_sizes,
    int64_t head_dim, double scaling, double logit_scale);

// top_k_law.cpp: top-k / top-p laws of logit rows (coupling.llm.sampling.probs)
at::Tensor top_k_law(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                     const at::Tensor& columns, int64_t vocab);

// inverse_cdf.cpp: inverse-CDF draws with float64 running sums (coupling.llm.sampling)
at::Tensor inverse_cdf(const at::Tensor& weights, const at::Tensor& u);

// union_support.cpp: sorted ids where some row of some law is positive
std::tuple<at::Tensor, bool> union_support(const std::vector<at::Tensor>& laws);
