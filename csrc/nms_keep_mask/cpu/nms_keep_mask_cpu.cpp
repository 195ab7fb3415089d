// Greedy NMS on the CPU: visit the boxes in nms_visit_order; each box not yet suppressed is kept
// and suppresses the later boxes of its label group. IoUs are computed only for pairs that
// still matter. Sequential: each decision depends on the ones before it.
#include <ATen/OpMathType.h>

#include <vector>

#include "nms_keep_mask/nms_keep_mask.h"
#include "nms_keep_mask/nms_keep_mask_math.h"

namespace redet {
namespace {

template <int kDim, typename scalar_t>
void greedy_nms(const scalar_t* boxes, const int64_t* order, const int64_t* labels, int64_t n,
                double iou_threshold, bool* keep) {
  using acc_t = at::opmath_type<scalar_t>;
  // the boxes in visiting order, in the accumulation type
  std::vector<acc_t> sorted(n * kDim);
  std::vector<int64_t> sorted_labels(n, 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int d = 0; d < kDim; ++d) {
      sorted[r * kDim + d] = static_cast<acc_t>(boxes[order[r] * kDim + d]);
    }
    if (labels != nullptr) sorted_labels[r] = labels[order[r]];
  }
  const acc_t threshold = static_cast<acc_t>(iou_threshold);
  std::vector<char> removed(n, 0);
  for (int64_t r = 0; r < n; ++r) {
    keep[order[r]] = !removed[r];
    if (removed[r]) continue;
    const acc_t* kept = &sorted[r * kDim];
    // the group of r's label ends at the first other label (nms_visit_order groups them)
    for (int64_t q = r + 1; q < n && sorted_labels[q] == sorted_labels[r]; ++q) {
      if (!removed[q] && suppresses<kDim>(kept, &sorted[q * kDim], sorted_labels[r],
                                          sorted_labels[q], threshold)) {
        removed[q] = 1;
      }
    }
  }
}

}  // namespace

at::Tensor nms_keep_mask_cpu(const at::Tensor& boxes_, const at::Tensor& scores,
                             double iou_threshold, const std::optional<at::Tensor>& labels_) {
  check_nms_keep_mask(boxes_, scores, iou_threshold, labels_);
  const int64_t n = boxes_.size(0);
  auto keep = at::empty({n}, boxes_.options().dtype(at::kBool));
  if (n == 0) return keep;
  const auto boxes = boxes_.contiguous();
  const auto order = nms_visit_order(scores, labels_).contiguous();
  const auto labels = labels_.has_value() ? labels_->contiguous() : at::Tensor();
  const int64_t* label_data = labels.defined() ? labels.data_ptr<int64_t>() : nullptr;
  const auto type = boxes.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, type, "nms_keep_mask_cpu", [&] {
    const auto run = [&](auto dim) {
      greedy_nms<decltype(dim)::value, scalar_t>(boxes.data_ptr<scalar_t>(),
                                                 order.data_ptr<int64_t>(), label_data, n,
                                                 iou_threshold, keep.data_ptr<bool>());
    };
    boxes.size(1) == 5 ? run(std::integral_constant<int, 5>{})
                       : run(std::integral_constant<int, 4>{});
  });
  return keep;
}

}  // namespace redet
