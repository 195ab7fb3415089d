// RiRoIAlignRotated: the functions registered for its ops (riroi_align_rotated.cpp), and the
// argument checks both backends share (the per-level feature table: common/feature_levels.h). Every backend function is
// multi-level; the single-level ops are its one-level case (levels undefined).
#pragma once
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/feature_levels.h"
#include "riroi_align_rotated/riroi_align_rotated_math.h"

namespace redet {

struct RiRoIOptions {
  int64_t out_h, out_w, num_samples, num_orientations;
  bool clockwise, legacy_orientation;
};

inline void check_riroi_options(const RiRoIOptions& o, const char* op) {
  check_output_size(o.out_h, o.out_w, op);
  TORCH_CHECK(o.num_samples >= 0 && o.num_samples <= kMaxSamples, op,
              ": num_samples must be in [0, ", kMaxSamples, "] (0 = adaptive), got ",
              o.num_samples);
  TORCH_CHECK(o.num_orientations >= 1, op, ": num_orientations must be >= 1, got ",
              o.num_orientations);
}

// features: as check_feature_levels, with C a multiple of num_orientations.
inline void check_riroi_features(at::TensorList features, int64_t num_orientations,
                                 const std::string& name, const char* op) {
  check_feature_levels(features, name, op);
  const auto& first = features[0];
  TORCH_CHECK(first.size(1) % num_orientations == 0, op, ": the channels of ", name, " (",
              first.size(1), ") must be a multiple of num_orientations (", num_orientations, ")");
}

inline void check_riroi_grad(const at::Tensor& grad, const at::Tensor& rois, int64_t channels,
                             const RiRoIOptions& o, const char* op) {
  TORCH_CHECK(grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(1) == channels &&
                  grad.size(2) == o.out_h && grad.size(3) == o.out_w,
              op, ": grad_output must have shape (K, C, out_h, out_w) = (", rois.size(0), ", ",
              channels, ", ", o.out_h, ", ", o.out_w, "), got ", grad.sizes());
  TORCH_CHECK(grad.device() == rois.device() && grad.scalar_type() == rois.scalar_type() &&
                  at::isFloatingType(grad.scalar_type()),
              op, ": grad_output and rois must have one floating dtype and one device, got ",
              grad.scalar_type(), " on ", grad.device(), " and ", rois.scalar_type(), " on ",
              rois.device());
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == 6, op, ": rois must have shape (K, 6), got ",
              rois.sizes());
  TORCH_CHECK(channels % o.num_orientations == 0, op, ": channels (", channels,
              ") must be a multiple of num_orientations (", o.num_orientations, ")");
  TORCH_CHECK(channels < (int64_t(1) << 31), op, ": too many channels (", channels,
              "), expected < 2^31");
}

// Forward entry checks (both backends) but for the values of rois and levels. levels may be
// undefined (single level).
inline void check_riroi_forward(at::TensorList features, const at::Tensor& rois,
                                const at::Tensor& levels, at::ArrayRef<double> scales,
                                const RiRoIOptions& o, const char* name, const char* op) {
  check_riroi_options(o, op);
  check_riroi_features(features, o.num_orientations, name, op);
  check_rois_layout(rois, features[0], 6, "(batch_index, cx, cy, w, h, theta)", op);
  check_spatial_scales(scales, features.size(), op);
  if (levels.defined()) check_roi_levels(levels, rois, op);
}

// The backward ops' levels and input sizes (of the gradients they allocate).
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

// Backward entry checks (both backends). They check grad_output, the options (the output size is
// grad_output's) and the sizes they allocate, not the values of rois and levels: those come from
// the forward, which checked them, and checking them again on CUDA would cost a host wait; the
// kernels give a row that breaks the rules (common/roi_rows.h) no gradient. levels may be
// undefined (single level).
inline void check_riroi_backward(const at::Tensor& grad, const at::Tensor& rois,
                                 const at::Tensor& levels, at::ArrayRef<double> scales,
                                 const RiRoIOptions& o, int64_t batch_size, int64_t channels,
                                 at::IntArrayRef heights, at::IntArrayRef widths, const char* op) {
  check_riroi_options(o, op);
  check_riroi_grad(grad, rois, channels, o, op);
  if (levels.defined()) check_roi_levels(levels, rois, op);
  check_riroi_input_sizes(batch_size, heights, widths, scales, op);
}

// One backend's kernels. The forward pools RoI k from features[levels[k]] with
// spatial_scales[levels[k]] (levels undefined: one level); `name` is what the user calls the
// features ("input" or "features") and `op` the op's name, for messages. The backward returns one
// gradient per level, channels-last in memory when channels_last.
at::Tensor riroi_align_rotated_forward_cpu(at::TensorList features, const at::Tensor& rois,
                                           const at::Tensor& levels,
                                           at::ArrayRef<double> spatial_scales,
                                           const RiRoIOptions& options, const char* name,
                                           const char* op);
std::vector<at::Tensor> riroi_align_rotated_backward_cpu(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, const RiRoIOptions& options, int64_t batch_size,
    int64_t channels, at::IntArrayRef heights, at::IntArrayRef widths, bool channels_last,
    const char* op);

at::Tensor riroi_align_rotated_forward_cuda(at::TensorList features, const at::Tensor& rois,
                                            const at::Tensor& levels,
                                            at::ArrayRef<double> spatial_scales,
                                            const RiRoIOptions& options, const char* name,
                                            const char* op);
std::vector<at::Tensor> riroi_align_rotated_backward_cuda(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, const RiRoIOptions& options, int64_t batch_size,
    int64_t channels, at::IntArrayRef heights, at::IntArrayRef widths, bool channels_last,
    const char* op);

// The Autograd-key functions of the four ops (riroi_align_rotated_autograd.cpp), with the schemas'
// signatures.
at::Tensor riroi_align_rotated_forward_autograd(const at::Tensor& input, const at::Tensor& rois,
                                                double spatial_scale, c10::SymInt out_h,
                                                c10::SymInt out_w, int64_t num_samples,
                                                int64_t num_orientations, bool clockwise,
                                                bool legacy);
at::Tensor riroi_align_rotated_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                                 double spatial_scale, int64_t num_samples,
                                                 int64_t num_orientations, bool clockwise,
                                                 bool legacy, c10::SymInt batch_size,
                                                 c10::SymInt channels, c10::SymInt height,
                                                 c10::SymInt width, bool channels_last);
at::Tensor riroi_align_rotated_multilevel_forward_autograd(
    at::TensorList features, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, c10::SymInt out_h, c10::SymInt out_w,
    int64_t num_samples, int64_t num_orientations, bool clockwise, bool legacy);
std::vector<at::Tensor> riroi_align_rotated_multilevel_backward_autograd(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
    bool clockwise, bool legacy, c10::SymInt batch_size, c10::SymInt channels,
    c10::SymIntArrayRef heights, c10::SymIntArrayRef widths, bool channels_last);

}  // namespace redet
