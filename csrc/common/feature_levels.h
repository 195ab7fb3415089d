// Several feature maps of one batch (an FPN's levels), as the multi-level ops take them: the
// argument checks, and the table of the levels that kernels take by value.
#pragma once
#include <string>
#include <vector>

#include "common/checks.h"

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

// features: non-empty list of at most kMaxFeatureLevels (N, C, H_l, W_l) maps with one dtype,
// device, N and C. `name` is how the user calls them ("input" or "features").
inline void check_feature_levels(at::TensorList features, const std::string& name,
                                 const char* op) {
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
