// Argument checks at the op boundary: every message names the argument and says what was expected.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "common/roi_rows.h"

namespace redet {

// A feature map: (N, C, H, W), floating, at least 1 x 1 (the kernels clamp reads onto the border
// pixels, so an empty map would put them at pixel -1) and H * W < 2^31 (they index a plane with
// int). `name` is how the user calls it.
inline void check_feature_map(const at::Tensor& input, const char* op,
                              const std::string& name = "input") {
  TORCH_CHECK(input.dim() == 4, op, ": ", name, " must be a 4-D (N, C, H, W) tensor, got ",
              input.dim(), "-D with shape ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": ", name,
              " must be float16, bfloat16, float32 or float64, got ", input.scalar_type());
  TORCH_CHECK(input.size(2) >= 1 && input.size(3) >= 1 &&
                  input.size(2) * input.size(3) < (int64_t(1) << 31),
              op, ": ", name, " must be at least 1 x 1 with height * width < 2^31, got shape ",
              input.sizes());
}

// First RoI rows that break the rules of common/roi_rows.h (-1 when none), by the rule broken: a
// NaN/inf value, a batch index that is not an integer in [0, num_images), a level index
// (multi-level ops) outside [0, num_levels).
struct BadRois {
  int64_t non_finite_row = -1;
  int64_t bad_index_row = -1;
  int64_t bad_level_row = -1;
};

// rois: (K, ncols) with column 0 the batch index, on input's device and of its dtype. Only the
// layout: the values are checked by check_roi_values_cpu here, or on the GPU by
// common/cuda/roi_checks.cuh, both reported by raise_if_bad_rois.
inline void check_rois_layout(const at::Tensor& rois, const at::Tensor& input, int64_t ncols,
                              const char* layout, const char* op) {
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == ncols, op, ": rois must have shape (K, ", ncols,
              ") = ", layout, ", got ", rois.sizes());
  TORCH_CHECK(rois.device() == input.device(), op, ": rois must be on the same device as input (",
              input.device(), "), got ", rois.device());
  TORCH_CHECK(rois.scalar_type() == input.scalar_type(), op,
              ": rois must have the same dtype as input (", input.scalar_type(), "), got ",
              rois.scalar_type());
}

// rois and levels on the host. levels undefined: a single-level op.
inline BadRois find_bad_rois_cpu(const at::Tensor& rois, int64_t num_images,
                                 const at::Tensor& levels = at::Tensor(), int64_t num_levels = 0) {
  const auto r = rois.to(at::kDouble).contiguous();
  const double* p = r.data_ptr<double>();
  const auto l = levels.defined() ? levels.contiguous() : levels;
  const int64_t* level = l.defined() ? l.data_ptr<int64_t>() : nullptr;
  const int ncols = static_cast<int>(r.size(1));
  BadRois bad;
  for (int64_t k = 0; k < r.size(0); ++k) {
    const auto fault = roi_row_fault(p + k * ncols, ncols, num_images, level ? level[k] : 0,
                                     level ? num_levels : 1);
    int64_t* first = fault == RoiRowFault::kNonFinite ? &bad.non_finite_row
                     : fault == RoiRowFault::kBadIndex ? &bad.bad_index_row
                     : fault == RoiRowFault::kBadLevel ? &bad.bad_level_row
                                                       : nullptr;
    if (first != nullptr && *first < 0) *first = k;
  }
  return bad;
}

inline void raise_if_bad_rois(const BadRois& bad, const at::Tensor& rois, int64_t num_images,
                              const at::Tensor& levels, int64_t num_levels, const char* op) {
  TORCH_CHECK(bad.non_finite_row < 0, op, ": rois contain NaN or infinite values (row ",
              bad.non_finite_row, ")");
  TORCH_CHECK(bad.bad_index_row < 0, op, ": rois[:, 0] must hold integer batch indices in [0, ",
              num_images, ") (input has ", num_images, " images); row ", bad.bad_index_row,
              " has ", bad.bad_index_row < 0 ? 0.0 : rois[bad.bad_index_row][0].item<double>());
  TORCH_CHECK(bad.bad_level_row < 0, op, ": levels must be in [0, ", num_levels, "); row ",
              bad.bad_level_row, " has ",
              bad.bad_level_row < 0 ? 0 : levels[bad.bad_level_row].item<int64_t>());
}

// The CPU backends' check of the values of rois (and levels).
inline void check_roi_values_cpu(const at::Tensor& rois, int64_t num_images, const char* op,
                                 const at::Tensor& levels = at::Tensor(), int64_t num_levels = 0) {
  raise_if_bad_rois(find_bad_rois_cpu(rois, num_images, levels, num_levels), rois, num_images,
                    levels, num_levels, op);
}

// The size of a map a backward op allocates (its gradient): an empty map would put border-clamped
// reads at pixel -1, and the kernels index a plane with int. `level` >= 0 names a pyramid level.
inline void check_map_size(int64_t height, int64_t width, const char* op, int64_t level = -1) {
  TORCH_CHECK(height >= 1 && width >= 1 && height * width < (int64_t(1) << 31), op,
              ": the input map", level >= 0 ? "s" : "", " must be at least 1 x 1 with height * width "
              "< 2^31, got height ", height, " and width ", width,
              level >= 0 ? " at level " + std::to_string(level) : std::string());
}

// The layout a backward op writes a feature map's gradient in: the map's own (channels-last when
// its strides are), so that the layer that made the map (a channels-last convolution) takes its
// gradient without a conversion.
inline bool is_channels_last_map(const at::Tensor& map) {
  return map.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

inline at::MemoryFormat gradient_format(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

inline void check_output_size(int64_t h, int64_t w, const char* op) {
  TORCH_CHECK(h > 0 && w > 0, op, ": output_size must be positive, got (", h, ", ", w, ")");
}

inline void check_positive(double value, const char* name, const char* op) {
  TORCH_CHECK(std::isfinite(value) && value > 0, op, ": ", name,
              " must be a positive finite number, got ", value);
}

}  // namespace redet
