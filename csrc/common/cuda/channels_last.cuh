// NCHW -> channels-last copies for the channels-last gathers (RiRoIAlign, RoIPool forward).
// at::Tensor::contiguous(ChannelsLast) measured 0.24 ms for a (2, 256, 256, 256) float map on an
// H200 (about 1.1 TB/s); this tiled transpose moves each (32 channels x 32 pixels) tile of an image
// through shared memory so that both the reads and the writes are coalesced.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

namespace redet {

constexpr int kTransposeTile = 32, kTransposeRows = 8;

// Block (32, 8) copies tile (channels c0.., pixels p0..) of image blockIdx.z.
template <typename scalar_t>
__global__ void __launch_bounds__(kTransposeTile * kTransposeRows)
nchw_to_channels_last_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                             int64_t channels, int64_t pixels) {
  __shared__ scalar_t tile[kTransposeTile][kTransposeTile + 1];  // +1: no bank conflicts
  const int64_t n = blockIdx.z;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTransposeTile;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  const int tx = threadIdx.x;
  for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
    const int64_t c = c0 + j, p = p0 + tx;
    if (c < channels && p < pixels) tile[j][tx] = in[(n * channels + c) * pixels + p];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
    const int64_t p = p0 + j, c = c0 + tx;
    if (c < channels && p < pixels) out[(n * pixels + p) * channels + c] = tile[tx][j];
  }
}

// x (N, C, H, W) on a CUDA device in channels-last memory: x itself when it already is, else a copy.
inline at::Tensor to_channels_last(const at::Tensor& x) {
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast)) return x;
  const int64_t batch = x.size(0), channels = x.size(1), pixels = x.size(2) * x.size(3);
  const int64_t pixel_tiles = (pixels + kTransposeTile - 1) / kTransposeTile;
  const int64_t channel_tiles = (channels + kTransposeTile - 1) / kTransposeTile;
  if (!x.is_contiguous() || x.numel() == 0 || batch > 65535 || channel_tiles > 65535 ||
      pixel_tiles > 2147483647LL) {
    return x.contiguous(at::MemoryFormat::ChannelsLast);  // shapes the grid cannot cover
  }
  auto out = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  const dim3 grid(static_cast<unsigned>(pixel_tiles), static_cast<unsigned>(channel_tiles),
                  static_cast<unsigned>(batch));
  const dim3 block(kTransposeTile, kTransposeRows);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "to_channels_last", [&] {
    nchw_to_channels_last_kernel<scalar_t><<<grid, block, 0, stream>>>(
        x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), channels, pixels);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace redet
