// RoIPool's backward on CUDA: every output gradient is added onto its argmax pixel of its RoI's
// image (one thread per output bin); a bin with argmax -1 or a RoI row that breaks the rules of
// common/roi_rows.h passes no gradient. The input's gradient is written in the layout asked for
// (NCHW or channels-last): the flat argmax h * W + w addresses either through a pixel stride.
#include <ATen/OpMathType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"
#include "roi_pool/roi_pool.h"

namespace redet {
namespace {

// How the backward sums: `Add`. Fast path: atomics straight into grad_input, in its own type, as
// torchvision adds (a float32 buffer would cost a conversion pass). Lone 16-bit atomics are slow,
// so a 16-bit value is added as one lane of a 32-bit f16x2/bf16x2 atomic (native on sm_90) whose
// other lane adds +0. Exact sums: the deterministic path below.
template <typename pair_t, typename half_t>
__device__ void add_as_pair_lane(half_t* base, int64_t i, int64_t numel, half_t value,
                                 half_t zero) {
  half_t* target = base + i;
  const bool low_lane = reinterpret_cast<std::uintptr_t>(target) % sizeof(pair_t) == 0;
  if (low_lane && i + 1 < numel) {
    atomicAdd(reinterpret_cast<pair_t*>(target), pair_t{value, zero});
  } else if (!low_lane && i > 0) {
    atomicAdd(reinterpret_cast<pair_t*>(target - 1), pair_t{zero, value});
  } else {  // the tensor's first or last element, with no partner inside it
    atomicAdd(target, value);
  }
}

template <typename scalar_t>
struct AtomicAdd {
  scalar_t* target;
  int64_t numel;
  __device__ void prepare() {}
  __device__ void operator()(int64_t i, at::opmath_type<scalar_t> value) const {
    if constexpr (std::is_same_v<scalar_t, c10::Half>) {
      add_as_pair_lane<__half2>(reinterpret_cast<__half*>(target), i, numel,
                                __float2half_rn(value), __float2half_rn(0.f));
    } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
      add_as_pair_lane<__nv_bfloat162>(reinterpret_cast<__nv_bfloat16*>(target), i, numel,
                                       __float2bfloat16_rn(value), __float2bfloat16_rn(0.f));
    } else {
      atomicAdd(target + i, value);
    }
  }
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
                                         int64_t batch_size, int64_t channels, int64_t plane_size,
                                         int64_t bins, int64_t channel_stride,
                                         int64_t pixel_stride, Add add) {
  add.prepare();
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int64_t bin = i % bins;
    const int64_t k = (i / bins) % num_rois;
    const int64_t c = i / (bins * num_rois);
    const int64_t o = (k * channels + c) * bins + bin;
    const int index = argmax[o];
    // guards: argmax from the forward is in [-1, plane_size), its rois follow the rules of
    // common/roi_rows.h (a raw call may pass anything: such entries pass no gradient)
    int64_t n;
    if (index < 0 || index >= plane_size) continue;
    if (!roi_row_image(rois + k * 5, 5, batch_size, 0, 1, &n)) continue;
    add(n * channels * plane_size + c * channel_stride + index * pixel_stride,
        static_cast<at::opmath_type<scalar_t>>(grad[o]));
  }
}

}  // namespace

at::Tensor roi_pool_backward_cuda(const at::Tensor& grad_, const at::Tensor& rois_,
                                  const at::Tensor& argmax_, int64_t batch_size, int64_t channels,
                                  int64_t height, int64_t width, bool channels_last) {
  check_roi_pool_backward(grad_, rois_, argmax_, batch_size, channels, height, width);
  c10::cuda::CUDAGuard guard(grad_.device());
  const auto grad = grad_.contiguous();  // the peers read a non-contiguous grad wrongly
  const auto rois = rois_.contiguous();
  const auto argmax = argmax_.contiguous();
  const int64_t num_rois = rois.size(0);
  const int64_t bins = num_rois * channels == 0 ? 0 : grad.numel() / (num_rois * channels);
  const int64_t total = grad.numel(), plane = height * width;
  const int64_t channel_stride = channels_last ? 1 : plane, pixel_stride = channels_last ? channels : 1;
  const auto format = gradient_format(channels_last);
  auto stream = c10::cuda::getCurrentCUDAStream();
  if (at::globalContext().deterministicAlgorithms()) {
    // fixed and grad_input share one layout: the conversion between them is elementwise
    // (at::zeros takes no memory format: empty + zero_)
    auto fixed = at::empty({batch_size, channels, height, width},
                           grad.options().dtype(at::kLong).memory_format(format)).zero_();
    auto bound = grad.abs().sum(at::kDouble);
    auto grad_input = at::empty({batch_size, channels, height, width}, grad.options().memory_format(format));
    if (total > 0) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward_det", [&] {
        const FixedPointAdd add{reinterpret_cast<long long*>(fixed.data_ptr<int64_t>()),
                                bound.data_ptr<double>()};
        roi_pool_backward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
            grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
            batch_size, channels, plane, bins, channel_stride, pixel_stride, add);
      });
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    fixed_point_to_tensor(fixed, bound, grad_input);
    return grad_input;
  }
  auto grad_input =
      at::empty({batch_size, channels, height, width}, grad.options().memory_format(format)).zero_();
  if (total > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward_cuda", [&] {
      const AtomicAdd<scalar_t> add{grad_input.data_ptr<scalar_t>(), grad_input.numel()};
      roi_pool_backward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(), argmax.data_ptr<int>(), num_rois,
          batch_size, channels, plane, bins, channel_stride, pixel_stride, add);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return grad_input;
}

}  // namespace redet
