// The Python module redet_plugin._C. Ops are registered with TORCH_LIBRARY in their own files;
// this module tells Python how the library was built and holds the per-thread switch of the CUDA
// RoI ops' value checks (common/roi_value_checks.h).
#include <torch/extension.h>

#include "common/roi_value_checks.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef REDET_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.def("set_roi_value_checks_enabled", &redet::set_roi_value_checks_enabled,
        "Switch the calling thread's CUDA RoI value checks; returns the previous setting.");
}
