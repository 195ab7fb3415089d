// Schemas of RoIPool and its backward. Kernels: cpu/roi_pool_cpu.cpp, cuda/roi_pool_cuda.cu.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // output (K, C, pooled_h, pooled_w) and argmax (int32 flat h * W + w of the max, -1 if empty)
  m.def("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)");
  m.def("_roi_pool_backward(Tensor grad_output, Tensor rois, Tensor argmax, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width) -> Tensor");
}
