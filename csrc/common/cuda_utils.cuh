// Small CUDA helpers shared by the ops' kernels. Only c10/cuda headers (not ATen/cuda, which
// pulls cuBLAS/cuSPARSE headers), so scripts/check_cuda_compile.sh can compile kernels on a CPU
// machine.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "common/fixed_point.h"

namespace redet {

constexpr int kThreads = 256;

#define REDET_CUDA_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)blockDim.x * gridDim.x)

// The same with a warp per work item: i is warp-uniform, so the warp may shuffle and ballot.
#define REDET_CUDA_WARP_STRIDE(i, n) \
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; i < (n); \
       i += (int64_t)(blockDim.x / 32) * gridDim.x)

inline int multiprocessor_count() {
  int device = 0, count = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

inline int blocks_for(int64_t n, int threads = kThreads) {
  const int64_t wanted = (n + threads - 1) / threads;
  const int64_t cap = 32LL * multiprocessor_count();
  return static_cast<int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

__device__ __forceinline__ void atomic_add_fixed_point(long long* target, double value,
                                                       double scale) {
  atomicAdd(reinterpret_cast<unsigned long long*>(target),
            static_cast<unsigned long long>(to_fixed_point(value, scale)));
}

template <typename scalar_t>
__global__ void fixed_point_to_scalar_kernel(const long long* __restrict__ fixed,
                                             const double* __restrict__ bound,
                                             scalar_t* __restrict__ out, int64_t n) {
  const double scale = fixed_point_scale(*bound);
  REDET_CUDA_GRID_STRIDE(i, n) {
    out[i] = static_cast<scalar_t>(from_fixed_point(fixed[i], scale));
  }
}

// Converter of fixed-point accumulators for channels_last_to_nchw (common/cuda/channels_last.cuh):
// the scale is derived on the device from `bound` (no host sync), once per thread in prepare().
template <typename out_t>
struct FixedPointTo {
  const double* bound;
  double scale = 1.0;
  __device__ void prepare() { scale = fixed_point_scale(*bound); }
  __device__ out_t operator()(long long value) const {
    return static_cast<out_t>(from_fixed_point(value, scale));
  }
};

// Writes fixed (int64) accumulators into `out`: the same number of elements in the same dense
// layout (the copy is flat).
inline void fixed_point_to_tensor(const at::Tensor& fixed, const at::Tensor& bound,
                                  at::Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "fixed_point_to", [&] {
    fixed_point_to_scalar_kernel<scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
        reinterpret_cast<const long long*>(fixed.data_ptr<int64_t>()),
        bound.data_ptr<double>(), out.data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace redet
