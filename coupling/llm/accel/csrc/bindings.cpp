// The Python module of coupling.llm.accel: one entry per compiled path (accel.h).
#include "accel.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("top_k_law", &top_k_law, "top-k / top-p laws of logit rows");
  m.def("inverse_cdf", &inverse_cdf, "inverse-CDF draws, float64 running sums");
}
