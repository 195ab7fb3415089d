// Schemas of RiRoIAlignRotated (single- and multi-level) and their backward ops.
// Kernels: cpu/riroi_align_rotated_cpu.cpp, cuda/riroi_align_rotated_cuda.cu.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // input (N, C*nO, H, W), rois (K, 6) = (batch_index, cx, cy, w, h, theta) -> (K, C*nO, out_h, out_w)
  m.def("riroi_align_rotated(Tensor input, Tensor rois, float spatial_scale, SymInt output_height, "
        "SymInt output_width, int num_samples, int num_orientations, bool clockwise, "
        "bool legacy_orientation) -> Tensor");
  m.def("_riroi_align_rotated_backward(Tensor grad_output, Tensor rois, float spatial_scale, "
        "int num_samples, int num_orientations, bool clockwise, bool legacy_orientation, "
        "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor");
  // The same over several feature levels in one launch: RoI k reads features[levels[k]] with
  // spatial_scales[levels[k]].
  m.def("riroi_align_rotated_multilevel(Tensor[] features, Tensor rois, Tensor levels, "
        "float[] spatial_scales, SymInt output_height, SymInt output_width, int num_samples, "
        "int num_orientations, bool clockwise, bool legacy_orientation) -> Tensor");
  m.def("_riroi_align_rotated_multilevel_backward(Tensor grad_output, Tensor rois, Tensor levels, "
        "float[] spatial_scales, int num_samples, int num_orientations, bool clockwise, "
        "bool legacy_orientation, SymInt batch_size, SymInt channels, SymInt[] heights, "
        "SymInt[] widths) -> Tensor[]");
}
