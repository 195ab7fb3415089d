// RoIPool on CUDA. The main forward kernel gives each block one (image, channel) plane and all the
// RoIs of that image: the RoIs overlap heavily, so the plane is read from memory about once and then
// served from L1, instead of every (RoI, channel) pair fetching its window through L2.
// When there are too few planes to fill the GPU, a flat kernel (one thread per output) is used.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cstdlib>
#include <cstring>

#include "common/cuda_utils.cuh"
#include "common/roi_pool_geometry.h"
#include "roi_pool/roi_pool.h"

namespace redet {
namespace {

constexpr int kPlaneThreads = 512;

template <typename scalar_t>
__global__ void __launch_bounds__(kPlaneThreads) roi_pool_forward_plane_kernel(
    const scalar_t* __restrict__ input, const scalar_t* __restrict__ rois, int64_t num_rois,
    int64_t num_images, int64_t channels, int height, int width, int pooled_h, int pooled_w,
    at::opmath_type<scalar_t> spatial_scale, scalar_t* __restrict__ output, int* __restrict__ argmax) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ int roi_list[kPlaneThreads];
  __shared__ int list_size;
  const int bins = pooled_h * pooled_w;
  for (int64_t plane_id = blockIdx.x; plane_id < num_images * channels; plane_id += gridDim.x) {
    const int64_t n = plane_id / channels, c = plane_id % channels;
    const scalar_t* plane = input + plane_id * height * width;
    for (int64_t chunk = 0; chunk < num_rois; chunk += blockDim.x) {
      // Collect this chunk's RoIs of image n (their order does not matter: outputs are disjoint).
      if (threadIdx.x == 0) list_size = 0;
      __syncthreads();
      const int64_t k = chunk + threadIdx.x;
      if (k < num_rois && static_cast<int64_t>(rois[k * 5]) == n) roi_list[atomicAdd(&list_size, 1)] = k;
      __syncthreads();
      const int count = list_size;
      for (int j = threadIdx.x; j < count * bins; j += blockDim.x) {
        const int64_t roi_index = roi_list[j / bins];
        const int bin = j % bins;
        const PoolBin b = roi_pool_bin<scalar_t, acc_t>(rois + roi_index * 5, spatial_scale,
                                                        bin / pooled_w, bin % pooled_w, pooled_h,
                                                        pooled_w, height, width);
        acc_t value;
        const int index = bin_max<scalar_t, acc_t>(plane, width, b, &value);
        const int64_t o = (roi_index * channels + c) * bins + bin;
        output[o] = static_cast<scalar_t>(value);
        argmax[o] = index;
      }
      __syncthreads();
    }
  }
}

template <typename scalar_t>
__global__ void roi_pool_forward_flat_kernel(const scalar_t* __restrict__ input,
                                        const scalar_t* __restrict__ rois, int64_t num_rois,
                                        int64_t channels, int height, int width, int pooled_h,
                                        int pooled_w, at::opmath_type<scalar_t> spatial_scale,
                                        scalar_t* __restrict__ output, int* __restrict__ argmax) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t bins = (int64_t)pooled_h * pooled_w;
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int64_t bin = i % bins;
    const int64_t k = (i / bins) % num_rois;
    const int64_t c = i / (bins * num_rois);
    const int ph = bin / pooled_w, pw = bin % pooled_w;
    const scalar_t* roi = rois + k * 5;
    const int64_t n = static_cast<int64_t>(roi[0]);
    const PoolBin b = roi_pool_bin<scalar_t, acc_t>(roi, spatial_scale, ph, pw, pooled_h, pooled_w,
                                                    height, width);
    acc_t value;
    const int index = bin_max<scalar_t, acc_t>(input + (n * channels + c) * height * width, width,
                                               b, &value);
    const int64_t o = (k * channels + c) * bins + bin;
    output[o] = static_cast<scalar_t>(value);
    argmax[o] = index;
  }
}

// Fast path: float atomics into an fp32 (fp64 for double) accumulator.
template <typename scalar_t, typename acc_t>
__global__ void roi_pool_backward_kernel(const scalar_t* __restrict__ grad,
                                         const scalar_t* __restrict__ rois,
                                         const int* __restrict__ argmax, int64_t num_rois,
                                         int64_t channels, int64_t plane_size, int64_t bins,
                                         acc_t* __restrict__ grad_input) {
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int64_t bin = i % bins;
    const int64_t k = (i / bins) % num_rois;
    const int64_t c = i / (bins * num_rois);
    const int64_t o = (k * channels + c) * bins + bin;
    const int index = argmax[o];
    if (index < 0) continue;
    const int64_t n = static_cast<int64_t>(rois[k * 5]);
    atomicAdd(grad_input + (n * channels + c) * plane_size + index, static_cast<acc_t>(grad[o]));
  }
}

// Deterministic path: the same scatter into 64-bit fixed point with integer atomics.
template <typename scalar_t>
__global__ void roi_pool_backward_fixed_kernel(const scalar_t* __restrict__ grad,
                                               const scalar_t* __restrict__ rois,
                                               const int* __restrict__ argmax, int64_t num_rois,
                                               int64_t channels, int64_t plane_size, int64_t bins,
                                               const double* __restrict__ bound,
                                               long long* __restrict__ grad_input) {
  const double scale = fixed_point_scale(*bound);
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int64_t bin = i % bins;
    const int64_t k = (i / bins) % num_rois;
    const int64_t c = i / (bins * num_rois);
    const int64_t o = (k * channels + c) * bins + bin;
    const int index = argmax[o];
    if (index < 0) continue;
    const int64_t n = static_cast<int64_t>(rois[k * 5]);
    atomic_add_fixed_point(grad_input + (n * channels + c) * plane_size + index,
                           static_cast<double>(grad[o]), scale);
  }
}

// The plane kernel needs enough (image, channel) planes to occupy every multiprocessor.
// REDET_ROI_POOL_KERNEL=plane|flat overrides the choice (for benchmarks).
bool choose_plane_kernel(int64_t planes) {
  const char* forced = std::getenv("REDET_ROI_POOL_KERNEL");
  if (forced != nullptr && std::strcmp(forced, "plane") == 0) return true;
  if (forced != nullptr && std::strcmp(forced, "flat") == 0) return false;
  return planes >= 2 * multiprocessor_count();
}

std::tuple<at::Tensor, at::Tensor> roi_pool_forward_cuda(const at::Tensor& input_,
                                                         const at::Tensor& rois_,
                                                         double spatial_scale, int64_t pooled_h,
                                                         int64_t pooled_w) {
  check_roi_pool_forward(input_, rois_, pooled_h, pooled_w, spatial_scale);
  c10::cuda::CUDAGuard guard(input_.device());
  const auto input = input_.contiguous();
  const auto rois = rois_.contiguous();
  const int64_t num_rois = rois.size(0), channels = input.size(1);
  auto output = at::empty({num_rois, channels, pooled_h, pooled_w}, input.options());
  auto argmax = at::empty({num_rois, channels, pooled_h, pooled_w}, input.options().dtype(at::kInt));
  const int64_t total = output.numel();
  if (total == 0) return {output, argmax};
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t planes = input.size(0) * channels;
  const bool use_plane_kernel = choose_plane_kernel(planes);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_pool_cuda", [&] {
    const auto scale = static_cast<at::opmath_type<scalar_t>>(spatial_scale);
    if (use_plane_kernel) {
      const int blocks = static_cast<int>(std::min<int64_t>(planes, 65535));
      roi_pool_forward_plane_kernel<scalar_t><<<blocks, kPlaneThreads, 0, stream>>>(
          input.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), num_rois, input.size(0), channels,
          input.size(2), input.size(3), pooled_h, pooled_w, scale, output.data_ptr<scalar_t>(),
          argmax.data_ptr<int>());
    } else {
      roi_pool_forward_flat_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
          input.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), num_rois, channels, input.size(2),
          input.size(3), pooled_h, pooled_w, scale, output.data_ptr<scalar_t>(),
          argmax.data_ptr<int>());
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {output, argmax};
}

at::Tensor roi_pool_backward_cuda(const at::Tensor& grad_, const at::Tensor& rois_,
                                  const at::Tensor& argmax_, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width) {
  check_roi_pool_backward(grad_, rois_, argmax_, channels);
  c10::cuda::CUDAGuard guard(grad_.device());
  const auto grad = grad_.contiguous();  // the peers read a non-contiguous grad wrongly
  const auto rois = rois_.contiguous();
  const auto argmax = argmax_.contiguous();
  const int64_t num_rois = rois.size(0);
  const int64_t bins = num_rois * channels == 0 ? 0 : grad.numel() / (num_rois * channels);
  const int64_t total = grad.numel(), plane = height * width;
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (at::globalContext().deterministicAlgorithms()) {
    auto fixed = at::zeros({batch_size, channels, height, width}, grad.options().dtype(at::kLong));
    auto bound = grad.abs().sum(at::kDouble);
    auto grad_input = at::empty({batch_size, channels, height, width}, grad.options());
    if (total > 0) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward_det", [&] {
        roi_pool_backward_fixed_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
            grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
            channels, plane, bins, bound.data_ptr<double>(),
            reinterpret_cast<long long*>(fixed.data_ptr<int64_t>()));
      });
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    fixed_point_to_tensor(fixed, bound, grad_input);
    return grad_input;
  }
  const bool is_double = grad.scalar_type() == at::kDouble;
  auto acc = at::zeros({batch_size, channels, height, width},
                       grad.options().dtype(is_double ? at::kDouble : at::kFloat));
  if (total > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      roi_pool_backward_kernel<scalar_t, acc_t><<<blocks_for(total), kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
          channels, plane, bins, acc.data_ptr<acc_t>());
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return acc.scalar_type() == grad.scalar_type() ? acc : acc.to(grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, CUDA, m) {
  m.impl("roi_pool", &roi_pool_forward_cuda);
  m.impl("_roi_pool_backward", &roi_pool_backward_cuda);
}

}  // namespace redet
