// RiRoIAlignRotated: the four op entry points (schemas in riroi_align_rotated.cpp), written once
// for both backends. A backend supplies only its multi-level implementation, forward_levels and
// backward_levels; the single-level ops are their one-level case (levels undefined). The backward
// entry points check grad_output, the options (they derive the output size from grad_output) and
// the sizes they allocate, not the values of rois and levels: those come from the forward, which
// checked them, and checking them again on CUDA would cost a host wait; the kernels give a row
// that breaks the rules (common/roi_rows.h) no gradient.
#pragma once
#include <torch/library.h>

#include <vector>

#include "riroi_align_rotated/riroi_align_rotated.h"

namespace redet {

// features, rois, levels (undefined = single level), scales, options, what the user calls the
// features ("input" or "features"), op name for messages.
using RiRoIForwardLevels = at::Tensor (*)(at::TensorList, const at::Tensor&, const at::Tensor&,
                                          at::ArrayRef<double>, const RiRoIOptions&, const char*,
                                          const char*);
// grad_output, rois, levels, scales, options, batch_size, channels, heights, widths, op name.
using RiRoIBackwardLevels = std::vector<at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, at::ArrayRef<double>,
                                                        const RiRoIOptions&, int64_t, int64_t,
                                                        at::IntArrayRef, at::IntArrayRef,
                                                        const char*);

// The backward ops take the output size from grad_output (0 when its rank is wrong, which
// check_riroi_grad then reports).
inline RiRoIOptions riroi_backward_options(const at::Tensor& grad, int64_t num_samples,
                                           int64_t num_orientations, bool clockwise,
                                           bool legacy_orientation) {
  return {grad.dim() == 4 ? grad.size(2) : 0, grad.dim() == 4 ? grad.size(3) : 0,
          num_samples, num_orientations, clockwise, legacy_orientation};
}

// Checks of both backward ops, before the backend's backward_levels.
inline void check_riroi_backward(const at::Tensor& grad, const at::Tensor& rois, int64_t channels,
                                 const RiRoIOptions& opt, const char* op) {
  check_riroi_options(opt, op);
  check_riroi_grad(grad, rois, channels, opt, op);
}

// The backward ops' levels and input sizes (of the gradients they allocate), for both backends.
inline void check_riroi_input_sizes(int64_t batch_size, at::IntArrayRef heights,
                                    at::IntArrayRef widths, at::ArrayRef<double> scales,
                                    const char* op) {
  TORCH_CHECK(batch_size >= 0, op, ": batch_size must be >= 0, got ", batch_size);
  const size_t num_levels = heights.size();
  TORCH_CHECK(widths.size() == num_levels && scales.size() == num_levels && num_levels >= 1 &&
                  num_levels <= kMaxFeatureLevels,
              op, ": heights, widths and spatial_scales must have one entry per level (1 to ",
              kMaxFeatureLevels, " levels), got ", heights.size(), ", ", widths.size(), " and ",
              scales.size());
  for (size_t l = 0; l < num_levels; ++l) check_map_size(heights[l], widths[l], op, l);
  check_spatial_scales(scales, num_levels, op);
}

template <RiRoIForwardLevels forward_levels>
at::Tensor riroi_align_rotated_op(const at::Tensor& input, const at::Tensor& rois,
                                  double spatial_scale, int64_t out_h, int64_t out_w,
                                  int64_t num_samples, int64_t num_orientations, bool clockwise,
                                  bool legacy_orientation) {
  const RiRoIOptions opt{out_h, out_w, num_samples, num_orientations, clockwise, legacy_orientation};
  return forward_levels({input}, rois, at::Tensor(), {spatial_scale}, opt, "input",
                        "riroi_align_rotated");
}

template <RiRoIBackwardLevels backward_levels>
at::Tensor riroi_align_rotated_backward_op(const at::Tensor& grad, const at::Tensor& rois,
                                           double spatial_scale, int64_t num_samples,
                                           int64_t num_orientations, bool clockwise,
                                           bool legacy_orientation, int64_t batch_size,
                                           int64_t channels, int64_t height, int64_t width) {
  const auto opt =
      riroi_backward_options(grad, num_samples, num_orientations, clockwise, legacy_orientation);
  check_riroi_backward(grad, rois, channels, opt, "_riroi_align_rotated_backward");
  check_riroi_input_sizes(batch_size, {height}, {width}, {spatial_scale},
                          "_riroi_align_rotated_backward");
  return backward_levels(grad, rois, at::Tensor(), {spatial_scale}, opt, batch_size, channels,
                         {height}, {width}, "_riroi_align_rotated_backward")[0];
}

template <RiRoIForwardLevels forward_levels>
at::Tensor riroi_align_rotated_multilevel_op(at::TensorList features, const at::Tensor& rois,
                                             const at::Tensor& levels,
                                             at::ArrayRef<double> spatial_scales, int64_t out_h,
                                             int64_t out_w, int64_t num_samples,
                                             int64_t num_orientations, bool clockwise,
                                             bool legacy_orientation) {
  const RiRoIOptions opt{out_h, out_w, num_samples, num_orientations, clockwise, legacy_orientation};
  return forward_levels(features, rois, levels, spatial_scales, opt, "features",
                        "riroi_align_rotated_multilevel");
}

template <RiRoIBackwardLevels backward_levels>
std::vector<at::Tensor> riroi_align_rotated_multilevel_backward_op(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
    bool clockwise, bool legacy_orientation, int64_t batch_size, int64_t channels,
    at::IntArrayRef heights, at::IntArrayRef widths) {
  constexpr const char* op = "_riroi_align_rotated_multilevel_backward";
  const auto opt =
      riroi_backward_options(grad, num_samples, num_orientations, clockwise, legacy_orientation);
  check_riroi_backward(grad, rois, channels, opt, op);
  check_roi_levels(levels, rois, op);
  check_riroi_input_sizes(batch_size, heights, widths, spatial_scales, op);
  return backward_levels(grad, rois, levels, spatial_scales, opt, batch_size, channels, heights,
                         widths, op);
}

// Call inside a backend's TORCH_LIBRARY_IMPL(redet, <key>, m).
template <RiRoIForwardLevels forward_levels, RiRoIBackwardLevels backward_levels>
void register_riroi_kernels(torch::Library& m) {
  m.impl("riroi_align_rotated", &riroi_align_rotated_op<forward_levels>);
  m.impl("_riroi_align_rotated_backward", &riroi_align_rotated_backward_op<backward_levels>);
  m.impl("riroi_align_rotated_multilevel", &riroi_align_rotated_multilevel_op<forward_levels>);
  m.impl("_riroi_align_rotated_multilevel_backward",
         &riroi_align_rotated_multilevel_backward_op<backward_levels>);
}

}  // namespace redet
