// Greedy NMS with a fixed-size output: keep (N,) bool in input order. The functions registered
// for the op (nms_keep_mask.cpp), its argument checks and the visiting order both backends share.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <optional>

namespace redet {

// The CUDA scan holds one 64-bit "removed" word per 64 boxes in shared memory: 6000 words fit
// in the 48 KiB a block gets without opting in, with room for the kernel's other variables.
constexpr int64_t kNmsMaxBoxesCuda = int64_t(6000) * 64;

inline void check_nms_keep_mask(const at::Tensor& boxes, const at::Tensor& scores,
                                double iou_threshold, const std::optional<at::Tensor>& labels) {
  constexpr const char* op = "nms_keep_mask";
  TORCH_CHECK(boxes.dim() == 2 && (boxes.size(1) == 5 || boxes.size(1) == 4), op,
              ": boxes must have shape (N, 5) = (cx, cy, w, h, theta) or (N, 4) = "
              "(x1, y1, x2, y2), got ", boxes.sizes());
  TORCH_CHECK(at::isFloatingType(boxes.scalar_type()), op,
              ": boxes must be float16, bfloat16, float32 or float64, got ", boxes.scalar_type());
  TORCH_CHECK(scores.dim() == 1 && scores.size(0) == boxes.size(0), op,
              ": scores must have shape (N,) = (", boxes.size(0), ",), got ", scores.sizes());
  TORCH_CHECK(scores.scalar_type() == boxes.scalar_type(), op,
              ": scores must have the dtype of boxes (", boxes.scalar_type(), "), got ",
              scores.scalar_type());
  TORCH_CHECK(scores.device() == boxes.device(), op, ": scores must be on the device of boxes (",
              boxes.device(), "), got ", scores.device());
  TORCH_CHECK(std::isfinite(iou_threshold), op, ": iou_threshold must be a finite number, got ",
              iou_threshold);
  if (labels.has_value()) {
    TORCH_CHECK(labels->dim() == 1 && labels->size(0) == boxes.size(0), op,
                ": labels must have shape (N,) = (", boxes.size(0), ",), got ", labels->sizes());
    TORCH_CHECK(labels->scalar_type() == at::kLong, op, ": labels must be int64, got ",
                labels->scalar_type());
    TORCH_CHECK(labels->device() == boxes.device(), op,
                ": labels must be on the device of boxes (", boxes.device(), "), got ",
                labels->device());
  }
  TORCH_CHECK(!boxes.is_cuda() || boxes.size(0) <= kNmsMaxBoxesCuda, op,
              ": at most ", kNmsMaxBoxesCuda, " boxes on CUDA, got ", boxes.size(0));
}

// The order greedy NMS visits the boxes in: by score, highest first, equal scores by index (a
// stable sort; mmcv sorts without asking for stability, so its order among equal scores is
// torch's choice, which on the CPU is the stable one for small N only). NaN scores come first, as
// torch sorts them. With labels the
// boxes are grouped by label, ascending, each group still in that order: boxes of different
// labels never suppress each other, so the keep set is the same, and each box meets only its own
// group (the kernels stop at the group's end). Device-agnostic, no host synchronisation.
inline at::Tensor nms_visit_order(const at::Tensor& scores,
                                  const std::optional<at::Tensor>& labels) {
  auto order = std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  if (labels.has_value()) {
    const auto by_label =
        std::get<1>(labels->index_select(0, order).sort(/*stable=*/true, 0, /*descending=*/false));
    order = order.index_select(0, by_label);
  }
  return order;
}

at::Tensor nms_keep_mask_cpu(const at::Tensor& boxes, const at::Tensor& scores,
                             double iou_threshold, const std::optional<at::Tensor>& labels);
at::Tensor nms_keep_mask_cuda(const at::Tensor& boxes, const at::Tensor& scores,
                              double iou_threshold, const std::optional<at::Tensor>& labels);

}  // namespace redet
