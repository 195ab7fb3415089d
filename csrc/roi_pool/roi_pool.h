// RoIPool (Fast R-CNN max pooling, torchvision semantics): the functions registered for its ops
// (roi_pool.cpp) and the argument checks both backends share.
// The multi-level op pools RoI k from features[levels[k]] at spatial_scales[levels[k]]. Its argmax
// indexes the pixels of every level and image laid end to end, level by level and within a level
// image by image (pixel h * W_l + w of image n at level l is N * (sum of H_j W_j over j < l) +
// n * H_l W_l + h * W_l + w), so that its backward is the single-level backward onto one
// (1, C, 1, N * sum H_l W_l) map: channels-last, each level's slice of it is that level's
// channels-last gradient as it is, with no copy.
#pragma once
#include <tuple>
#include <vector>

#include "common/checks.h"
#include "common/feature_levels.h"

namespace redet {

inline void check_roi_pool_forward(const at::Tensor& input, const at::Tensor& rois,
                                   int64_t pooled_h, int64_t pooled_w, double spatial_scale) {
  constexpr const char* op = "roi_pool";
  check_feature_map(input, op);
  check_rois_layout(rois, input, 5, "(batch_index, x1, y1, x2, y2)", op);  // values: by backend
  check_output_size(pooled_h, pooled_w, op);
  check_positive(spatial_scale, "spatial_scale", op);
}

// The pixels of every level and image: the multi-level argmax's range.
inline int64_t total_pixels(at::TensorList features) {
  int64_t total = 0;
  for (const auto& f : features) total += f.size(0) * f.size(2) * f.size(3);
  return total;
}

inline void check_roi_pool_multilevel_forward(at::TensorList features, const at::Tensor& rois,
                                              const at::Tensor& levels,
                                              at::ArrayRef<double> spatial_scales,
                                              int64_t pooled_h, int64_t pooled_w) {
  constexpr const char* op = "roi_pool_multilevel";
  check_feature_levels(features, "features", op);
  check_rois_layout(rois, features[0], 5, "(batch_index, x1, y1, x2, y2)", op);  // values: by backend
  check_roi_levels(levels, rois, op);
  check_spatial_scales(spatial_scales, features.size(), op);
  check_output_size(pooled_h, pooled_w, op);
  TORCH_CHECK(total_pixels(features) < (int64_t(1) << 31), op, ": the levels' maps must hold "
              "fewer than 2^31 pixels together (N * H * W summed over levels), got ",
              total_pixels(features));
}

// Where each level's pixels start in the multi-level argmax: N * (sum of H_j W_j over j < l).
inline std::vector<int> level_pixel_starts(at::TensorList features) {
  std::vector<int> starts;
  int64_t pixel = 0;
  for (const auto& f : features) {
    starts.push_back(static_cast<int>(pixel));
    pixel += f.size(0) * f.size(2) * f.size(3);
  }
  return starts;
}

// The backward op does not check the values of rois and argmax (they come from the forward, which
// checked the rois; checking them on CUDA would cost a host wait): entries the kernels' guards
// reject (argmax outside the map, a row breaking common/roi_rows.h's rules) pass no gradient.
// The sizes it allocates are checked here.
inline void check_roi_pool_backward(const at::Tensor& grad, const at::Tensor& rois,
                                    const at::Tensor& argmax, int64_t batch_size, int64_t channels,
                                    int64_t height, int64_t width) {
  constexpr const char* op = "_roi_pool_backward";
  TORCH_CHECK(batch_size >= 0 && channels >= 0, op, ": batch_size and channels must be >= 0, got ",
              batch_size, " and ", channels);
  check_map_size(height, width, op);
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == 5, op,
              ": rois must have shape (K, 5) = (batch_index, x1, y1, x2, y2), got ", rois.sizes());
  TORCH_CHECK(at::isFloatingType(grad.scalar_type()) && rois.scalar_type() == grad.scalar_type(),
              op, ": grad_output must be floating and rois of its dtype, got ", grad.scalar_type(),
              " and ", rois.scalar_type());
  TORCH_CHECK(grad.dim() == 4 && grad.size(0) == rois.size(0) && grad.size(1) == channels, op,
              ": grad_output must have shape (K, C, pooled_h, pooled_w) = (", rois.size(0), ", ",
              channels, ", ...), got ", grad.sizes());
  TORCH_CHECK(argmax.sizes() == grad.sizes() && argmax.scalar_type() == at::kInt, op,
              ": argmax must be an int32 tensor shaped like grad_output");
  TORCH_CHECK(grad.device() == rois.device() && argmax.device() == rois.device(), op,
              ": grad_output, rois and argmax must be on one device");
}

using RoIPoolResult = std::tuple<at::Tensor, at::Tensor>;  // output, argmax

RoIPoolResult roi_pool_forward_cpu(const at::Tensor& input, const at::Tensor& rois,
                                   double spatial_scale, int64_t pooled_h, int64_t pooled_w);
at::Tensor roi_pool_backward_cpu(const at::Tensor& grad, const at::Tensor& rois,
                                 const at::Tensor& argmax, int64_t batch_size, int64_t channels,
                                 int64_t height, int64_t width, bool channels_last);

RoIPoolResult roi_pool_multilevel_forward_cpu(at::TensorList features, const at::Tensor& rois,
                                              const at::Tensor& levels,
                                              at::ArrayRef<double> spatial_scales,
                                              int64_t pooled_h, int64_t pooled_w);

RoIPoolResult roi_pool_forward_cuda(const at::Tensor& input, const at::Tensor& rois,
                                    double spatial_scale, int64_t pooled_h, int64_t pooled_w);
at::Tensor roi_pool_backward_cuda(const at::Tensor& grad, const at::Tensor& rois,
                                  const at::Tensor& argmax, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width, bool channels_last);

RoIPoolResult roi_pool_multilevel_forward_cuda(at::TensorList features, const at::Tensor& rois,
                                               const at::Tensor& levels,
                                               at::ArrayRef<double> spatial_scales,
                                               int64_t pooled_h, int64_t pooled_w);

RoIPoolResult roi_pool_forward_autograd(const at::Tensor& input, const at::Tensor& rois,
                                        double spatial_scale, c10::SymInt pooled_h,
                                        c10::SymInt pooled_w);
RoIPoolResult roi_pool_multilevel_forward_autograd(at::TensorList features,
                                                   const at::Tensor& rois,
                                                   const at::Tensor& levels,
                                                   at::ArrayRef<double> spatial_scales,
                                                   c10::SymInt pooled_h, c10::SymInt pooled_w);
at::Tensor roi_pool_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                      const at::Tensor& argmax, c10::SymInt batch_size,
                                      c10::SymInt channels, c10::SymInt height, c10::SymInt width,
                                      bool channels_last);

}  // namespace redet
