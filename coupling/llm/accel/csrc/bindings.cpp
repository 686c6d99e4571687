// The Python module of coupling.llm.accel: one entry per compiled path (accel.h).
#include "accel.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_mm", &int8_mm, "y = (x @ w.T) * scale for int8 w");
  m.def("feature_step", &feature_step, "the int8 feature draft's step");
  m.def("top_k_law", &top_k_law, "top-k / top-p laws of logit rows");
  m.def("inverse_cdf", &inverse_cdf, "inverse-CDF draws, float64 running sums");
  m.def("union_support", &union_support, "sorted ids where some row of some law is positive");
}
