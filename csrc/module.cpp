// The Python module redet_plugin._C. Ops are registered with TORCH_LIBRARY in their own files;
// this module only tells Python how the library was built.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#ifdef REDET_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
