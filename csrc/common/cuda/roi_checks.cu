// DeferredRoiCheck (common/cuda/roi_checks.cuh): one kernel, one event wait; the rows are looked
// up on the host only when the kernel found something. Nothing while a CUDA graph is captured.
#include "common/cuda/roi_checks.cuh"
#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"

namespace redet {
namespace {

// Sets *any_bad when a row breaks a rule of common/roi_rows.h (find_bad_rois_cpu then names the
// first such rows).
template <typename scalar_t>
__global__ void find_bad_rois_kernel(const scalar_t* __restrict__ rois, int64_t num_rois,
                                     int ncols, int64_t num_images,
                                     const int64_t* __restrict__ levels, int64_t num_levels,
                                     int* any_bad) {
  REDET_CUDA_GRID_STRIDE(k, num_rois) {
    const int64_t level = levels ? levels[k] : 0;
    if (roi_row_fault(rois + k * ncols, ncols, num_images, level, levels ? num_levels : 1) !=
        RoiRowFault::kNone) {
      *any_bad = 1;
    }
  }
}

}  // namespace

DeferredRoiCheck::DeferredRoiCheck(const at::Tensor& rois, int64_t num_images,
                                   const at::Tensor& levels, int64_t num_levels)
    : num_images_(num_images), num_levels_(num_levels) {
  if (rois.size(0) == 0 || capturing_cuda_graph() || !roi_value_checks_enabled()) return;
  rois_ = rois.contiguous();
  levels_ = levels.defined() ? levels.contiguous() : levels;
  const int64_t num_rois = rois_.size(0);
  c10::cuda::CUDAGuard guard(rois_.device());
  any_bad_.emplace(rois_.device().index());
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois_.scalar_type(), "find_bad_rois", [&] {
    find_bad_rois_kernel<scalar_t><<<blocks_for(num_rois), kThreads, 0, stream>>>(
        rois_.data_ptr<scalar_t>(), num_rois, static_cast<int>(rois_.size(1)), num_images,
        levels_.defined() ? levels_.data_ptr<int64_t>() : nullptr, num_levels,
        any_bad_->device_word());
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  any_bad_->arm(stream);
}

void DeferredRoiCheck::raise_if_bad(const char* op) {
  if (!any_bad_ || !any_bad_->is_set()) return;
  const auto levels = levels_.defined() ? levels_.cpu() : levels_;
  const auto rois = rois_.cpu();
  raise_if_bad_rois(find_bad_rois_cpu(rois, num_images_, levels, num_levels_), rois, num_images_,
                    levels, num_levels_, op);
}

}  // namespace redet
