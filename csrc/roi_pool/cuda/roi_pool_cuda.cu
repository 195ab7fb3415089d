// RoIPool on CUDA: one thread per output bin, ordered channel-major (all RoIs of one channel run
// together). A variant that gave each block one (image, channel) plane and all its RoIs measured
// slower in float32 on an H200 (0.67 vs 0.58 ms, benchmarks/results/roi_pool_h200.json) and was dropped.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "common/cuda_utils.cuh"
#include "common/roi_pool_geometry.h"
#include "roi_pool/roi_pool.h"

namespace redet {
namespace {

template <typename scalar_t>
__global__ void roi_pool_forward_kernel(const scalar_t* __restrict__ input,
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

// The backward scatters each output gradient onto its argmax pixel; `Add` says how it is summed.
// Fast path: float atomics into an fp32 (fp64 for double) accumulator.
template <typename acc_t>
struct FloatAtomicAdd {
  acc_t* target;
  __device__ void prepare() {}
  __device__ void operator()(int64_t i, acc_t value) const { atomicAdd(target + i, value); }
};

// Deterministic path: 64-bit fixed point with integer atomics (order-independent sums).
struct FixedPointAdd {
  long long* target;
  const double* bound;
  double scale = 1.0;
  __device__ void prepare() { scale = fixed_point_scale(*bound); }
  __device__ void operator()(int64_t i, double value) const {
    atomic_add_fixed_point(target + i, value, scale);
  }
};

template <typename scalar_t, typename Add>
__global__ void roi_pool_backward_kernel(const scalar_t* __restrict__ grad,
                                         const scalar_t* __restrict__ rois,
                                         const int* __restrict__ argmax, int64_t num_rois,
                                         int64_t channels, int64_t plane_size, int64_t bins,
                                         Add add) {
  add.prepare();
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int64_t bin = i % bins;
    const int64_t k = (i / bins) % num_rois;
    const int64_t c = i / (bins * num_rois);
    const int64_t o = (k * channels + c) * bins + bin;
    const int index = argmax[o];
    if (index < 0) continue;
    const int64_t n = static_cast<int64_t>(rois[k * 5]);
    add((n * channels + c) * plane_size + index, static_cast<at::opmath_type<scalar_t>>(grad[o]));
  }
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
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "roi_pool_cuda", [&] {
    roi_pool_forward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
        input.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), num_rois, channels, input.size(2),
        input.size(3), pooled_h, pooled_w, static_cast<at::opmath_type<scalar_t>>(spatial_scale),
        output.data_ptr<scalar_t>(), argmax.data_ptr<int>());
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
        const FixedPointAdd add{reinterpret_cast<long long*>(fixed.data_ptr<int64_t>()),
                                bound.data_ptr<double>()};
        roi_pool_backward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
            grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
            channels, plane, bins, add);
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
      roi_pool_backward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
          channels, plane, bins, FloatAtomicAdd<acc_t>{acc.data_ptr<acc_t>()});
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
