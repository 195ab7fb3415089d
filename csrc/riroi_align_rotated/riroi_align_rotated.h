// RiRoIAlignRotated: argument checks and the per-level feature table shared by both backends.
// Every entry point is multi-level; the single-level op is the one-level case (levels undefined).
#pragma once
#include <string>
#include <vector>

#include "common/checks.h"
#include "riroi_align_rotated/riroi_geometry.h"

namespace redet {

constexpr int kMaxFeatureLevels = 16;

// Up to kMaxFeatureLevels feature maps of one batch (same N and C), passed by value to kernels.
template <typename scalar_t, typename acc_t>
struct FeatureLevels {
  int count;
  const scalar_t* data[kMaxFeatureLevels];
  int height[kMaxFeatureLevels];
  int width[kMaxFeatureLevels];
  acc_t spatial_scale[kMaxFeatureLevels];
};

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

// features: non-empty list of (N, C, H_l, W_l) maps with one dtype, device, N and C, where C is
// a multiple of num_orientations. `name` is how the user calls them ("input" or "features").
inline void check_riroi_features(at::TensorList features, int64_t num_orientations,
                                 const std::string& name, const char* op) {
  TORCH_CHECK(!features.empty(), op, ": ", name, " must hold at least one feature map");
  TORCH_CHECK(features.size() <= kMaxFeatureLevels, op, ": at most ", kMaxFeatureLevels,
              " feature levels are supported, got ", features.size());
  const auto& first = features[0];
  for (size_t l = 0; l < features.size(); ++l) {
    const auto& f = features[l];
    check_feature_map(f, op, features.size() == 1 ? name : name + ("[" + std::to_string(l) + "]"));
    TORCH_CHECK(f.scalar_type() == first.scalar_type() && f.device() == first.device(), op, ": ",
                name, "[", l, "] must have the dtype and device of ", name, "[0] (",
                first.scalar_type(), ", ", first.device(), "), got ", f.scalar_type(), ", ",
                f.device());
    TORCH_CHECK(f.size(0) == first.size(0) && f.size(1) == first.size(1), op, ": ", name, "[", l,
                "] must have the batch size and channels of ", name, "[0] (", first.size(0),
                ", ", first.size(1), "), got shape ", f.sizes());
  }
  TORCH_CHECK(first.size(1) % num_orientations == 0, op, ": the channels of ", name, " (",
              first.size(1), ") must be a multiple of num_orientations (", num_orientations, ")");
  TORCH_CHECK(first.size(1) < (int64_t(1) << 31), op, ": ", name, " has too many channels (",
              first.size(1), "), expected < 2^31");
}

inline void check_spatial_scales(at::ArrayRef<double> scales, size_t num_levels, const char* op) {
  TORCH_CHECK(scales.size() == num_levels, op, ": spatial_scales must hold one scale per feature "
              "level (", num_levels, "), got ", scales.size());
  for (double s : scales) check_positive(s, "spatial_scale", op);
}

// levels: (K,) int64 level index of each RoI; its values, in [0, num_levels), are checked with the
// rois' (common/roi_rows.h).
inline void check_roi_levels(const at::Tensor& levels, const at::Tensor& rois, const char* op) {
  TORCH_CHECK(levels.dim() == 1 && levels.size(0) == rois.size(0), op,
              ": levels must have shape (K,) = (", rois.size(0), ",), got ", levels.sizes());
  TORCH_CHECK(levels.scalar_type() == at::kLong, op, ": levels must be int64, got ",
              levels.scalar_type());
  TORCH_CHECK(levels.device() == rois.device(), op, ": levels must be on the device of rois (",
              rois.device(), "), got ", levels.device());
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

template <typename scalar_t, typename acc_t>
FeatureLevels<scalar_t, acc_t> feature_levels(const std::vector<at::Tensor>& contiguous,
                                              at::ArrayRef<double> scales) {
  FeatureLevels<scalar_t, acc_t> table{};
  table.count = static_cast<int>(contiguous.size());
  for (int l = 0; l < table.count; ++l) {
    table.data[l] = contiguous[l].data_ptr<scalar_t>();
    table.height[l] = static_cast<int>(contiguous[l].size(2));
    table.width[l] = static_cast<int>(contiguous[l].size(3));
    table.spatial_scale[l] = static_cast<acc_t>(scales[l]);
  }
  return table;
}

inline std::vector<at::Tensor> contiguous_all(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.contiguous());
  return out;
}

}  // namespace redet
