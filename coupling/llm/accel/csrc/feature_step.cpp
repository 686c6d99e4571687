// The int8 feature draft's step (coupling.llm.feature_draft.FeatureDraft, its lean layer, fc
// and head) as one call. Why: the step is ~55 small tensor operations, and from Python each
// pays ~10 us of dispatch, ~0.5 ms a step, about what its weights cost to read. Here the same
// ATen operations run in the same order on the same dtypes (and the products are the same
// int8_mm), so the result is bit for bit the Python path's (tests/test_feature_draft.py).
#include "accel.h"

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
