// DeferredRoiCheck (common/cuda/roi_checks.cuh): one kernel, one small copy, one wait.
#include "common/cuda/roi_checks.cuh"
#include "common/cuda_utils.cuh"

namespace redet {
namespace {

// first_bad[0..2]: the first row with a NaN/inf value, with a bad batch index, with a bad level
// (num_rois when none), as in find_bad_rois_cpu.
template <typename scalar_t>
__global__ void find_bad_rois_kernel(const scalar_t* __restrict__ rois, int64_t num_rois,
                                     int64_t ncols, double num_images,
                                     const int64_t* __restrict__ levels, int64_t num_levels,
                                     unsigned long long* __restrict__ first_bad) {
  REDET_CUDA_GRID_STRIDE(k, num_rois) {
    bool finite = true;
    for (int64_t j = 0; j < ncols; ++j) finite = finite && isfinite(static_cast<double>(rois[k * ncols + j]));
    const double b = static_cast<double>(rois[k * ncols]);
    const bool index_ok = b == floor(b) && b >= 0 && b < num_images;
    if (!finite) atomicMin(first_bad, static_cast<unsigned long long>(k));
    else if (!index_ok) atomicMin(first_bad + 1, static_cast<unsigned long long>(k));
    if (levels != nullptr && !(levels[k] >= 0 && levels[k] < num_levels)) {
      atomicMin(first_bad + 2, static_cast<unsigned long long>(k));
    }
  }
}

}  // namespace

DeferredRoiCheck::DeferredRoiCheck(const at::Tensor& rois, int64_t num_images,
                                   const at::Tensor& levels, int64_t num_levels)
    : rois_(rois.contiguous()),
      levels_(levels.defined() ? levels.contiguous() : levels),
      num_images_(num_images),
      num_levels_(num_levels) {
  const int64_t num_rois = rois_.size(0);
  if (num_rois == 0) return;
  c10::cuda::CUDAGuard guard(rois_.device());
  first_bad_ = at::full({3}, num_rois, rois_.options().dtype(at::kLong));
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois_.scalar_type(), "find_bad_rois", [&] {
    find_bad_rois_kernel<scalar_t><<<blocks_for(num_rois), kThreads, 0, stream>>>(
        rois_.data_ptr<scalar_t>(), num_rois, rois_.size(1), static_cast<double>(num_images),
        levels_.defined() ? levels_.data_ptr<int64_t>() : nullptr, num_levels,
        reinterpret_cast<unsigned long long*>(first_bad_.data_ptr<int64_t>()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  readback_.start(first_bad_.data_ptr(), 3 * sizeof(int64_t), stream);
}

void DeferredRoiCheck::raise_if_bad(const char* op) {
  if (!readback_.started()) return;
  const auto* rows = static_cast<const int64_t*>(readback_.wait());
  const int64_t num_rois = rois_.size(0);
  BadRois bad;
  bad.non_finite_row = rows[0] < num_rois ? rows[0] : -1;
  bad.bad_index_row = rows[1] < num_rois ? rows[1] : -1;
  bad.bad_level_row = rows[2] < num_rois ? rows[2] : -1;
  raise_if_bad_rois(bad, rois_, num_images_, levels_, num_levels_, op);
}

}  // namespace redet
