// Schemas of the depth-aware flow projection (DAIN) and its backward.
// Kernels: cpu/depth_flow_projection_cpu.cpp, cuda/depth_flow_projection_cuda.cu;
// per-pixel math: flow_projection.h.
#include <torch/library.h>

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
