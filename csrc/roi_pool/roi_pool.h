// RoIPool (Fast R-CNN max pooling, torchvision semantics): the functions registered for its ops
// (roi_pool.cpp) and the argument checks both backends share.
#pragma once
#include <tuple>

#include "common/checks.h"

namespace redet {

inline void check_roi_pool_forward(const at::Tensor& input, const at::Tensor& rois,
                                   int64_t pooled_h, int64_t pooled_w, double spatial_scale) {
  constexpr const char* op = "roi_pool";
  check_feature_map(input, op);
  check_rois_layout(rois, input, 5, "(batch_index, x1, y1, x2, y2)", op);  // values: by backend
  check_output_size(pooled_h, pooled_w, op);
  check_positive(spatial_scale, "spatial_scale", op);
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

RoIPoolResult roi_pool_forward_cuda(const at::Tensor& input, const at::Tensor& rois,
                                    double spatial_scale, int64_t pooled_h, int64_t pooled_w);
at::Tensor roi_pool_backward_cuda(const at::Tensor& grad, const at::Tensor& rois,
                                  const at::Tensor& argmax, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width, bool channels_last);

RoIPoolResult roi_pool_forward_autograd(const at::Tensor& input, const at::Tensor& rois,
                                        double spatial_scale, c10::SymInt pooled_h,
                                        c10::SymInt pooled_w);
at::Tensor roi_pool_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                      const at::Tensor& argmax, c10::SymInt batch_size,
                                      c10::SymInt channels, c10::SymInt height, c10::SymInt width,
                                      bool channels_last);

}  // namespace redet
