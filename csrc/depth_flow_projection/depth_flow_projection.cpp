// Depth-aware flow projection (DAIN): the schemas of the op and of its backward, and the functions
// that implement them on each dispatch key (declared in depth_flow_projection.h). Per-pixel math:
// depth_flow_projection_math.h, depth_flow_projection_backward_math.h.
#include <torch/library.h>

#include "depth_flow_projection/depth_flow_projection.h"

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // flow F0->1 (B, 2, H, W); depth D0 (B, 1, H, W), or 1/D0 when inverse_depth; t in [0, 1].
  // Returns the projected flow F_t->0 (B, 2, H, W) (holes filled when fill_holes) and count
  // (B, 1, H, W; float32, float64 for float64 input): the weight sum at each pixel, or at a hole
  // −(number of directions the hole filling used). The backward needs both.
  m.def("depth_flow_projection(Tensor flow, Tensor depth, float t, bool inverse_depth=False, "
        "bool fill_holes=True, bool check_depth=True) -> (Tensor, Tensor)");
  // Returns (grad_flow, grad_depth); grad_depth is with respect to the depth input as given
  // (1/D0 when inverse_depth).
  m.def("_depth_flow_projection_backward(Tensor grad_output, Tensor flow, Tensor depth, "
        "Tensor output, Tensor count, float t, bool inverse_depth, bool fill_holes) "
        "-> (Tensor, Tensor)");
}

namespace redet {

TORCH_LIBRARY_IMPL(redet, CPU, m) {  // cpu/depth_flow_projection_cpu.cpp
  m.impl("depth_flow_projection", &depth_flow_projection_forward_cpu);
  m.impl("_depth_flow_projection_backward", &depth_flow_projection_backward_cpu);
}

#ifdef REDET_WITH_CUDA
TORCH_LIBRARY_IMPL(redet, CUDA, m) {  // cuda/depth_flow_projection_{forward,backward}.cu
  m.impl("depth_flow_projection", &depth_flow_projection_forward_cuda);
  m.impl("_depth_flow_projection_backward", &depth_flow_projection_backward_cuda);
}
#endif

TORCH_LIBRARY_IMPL(redet, Autograd, m) {  // depth_flow_projection_autograd.cpp
  m.impl("depth_flow_projection", &depth_flow_projection_forward_autograd);
  m.impl("_depth_flow_projection_backward", &depth_flow_projection_backward_autograd);
}

}  // namespace redet
