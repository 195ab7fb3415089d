// The CUDA side of check_rois (common/checks.h): one kernel finds the first bad rows, one small copy
// brings them back, instead of a chain of reductions each followed by a host sync.
#include "common/checks.h"
#include "common/cuda_utils.cuh"

namespace redet {
namespace {

template <typename scalar_t>
__global__ void find_bad_rois_kernel(const scalar_t* __restrict__ rois, int64_t num_rois,
                                     int64_t ncols, double num_images,
                                     unsigned long long* __restrict__ first_bad) {
  REDET_CUDA_GRID_STRIDE(k, num_rois) {
    bool finite = true;
    for (int64_t j = 0; j < ncols; ++j) finite = finite && isfinite(static_cast<double>(rois[k * ncols + j]));
    const double b = static_cast<double>(rois[k * ncols]);
    const bool index_ok = b == floor(b) && b >= 0 && b < num_images;
    if (!finite) atomicMin(first_bad, static_cast<unsigned long long>(k));
    else if (!index_ok) atomicMin(first_bad + 1, static_cast<unsigned long long>(k));
  }
}

}  // namespace

BadRois find_bad_rois_cuda(const at::Tensor& rois_, int64_t num_images) {
  c10::cuda::CUDAGuard guard(rois_.device());
  const auto rois = rois_.contiguous();
  const int64_t num_rois = rois.size(0);
  auto first_bad = at::full({2}, num_rois, rois.options().dtype(at::kLong));
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, rois.scalar_type(), "find_bad_rois", [&] {
    find_bad_rois_kernel<scalar_t><<<blocks_for(num_rois), kThreads, 0, stream>>>(
        rois.data_ptr<scalar_t>(), num_rois, rois.size(1), static_cast<double>(num_images),
        reinterpret_cast<unsigned long long*>(first_bad.data_ptr<int64_t>()));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto host = first_bad.cpu();
  const int64_t* rows = host.data_ptr<int64_t>();
  BadRois bad;
  bad.non_finite_row = rows[0] < num_rois ? rows[0] : -1;
  bad.bad_index_row = rows[1] < num_rois ? rows[1] : -1;
  return bad;
}

}  // namespace redet
