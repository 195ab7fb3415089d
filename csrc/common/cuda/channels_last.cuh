// NCHW <-> channels-last copies: NCHW -> channels-last for the channels-last gathers (RiRoIAlign,
// RoIPool forward), channels-last -> NCHW for the channels-last backward scatters (their scratch
// accumulators become the (N, C, H, W) gradients, converted on the way).
// at::Tensor::contiguous(ChannelsLast) reaches only a fraction of the memory bandwidth on such
// maps; these tiled transposes move each (32 channels x 32 pixels) tile of an image through shared
// memory so that both the reads and the writes are coalesced.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <type_traits>

namespace redet {

constexpr int kTransposeTile = 32, kTransposeRows = 8;

// Block (32, 8) copies kTransposeTilesPerBlock tiles (channels c0.., 32 pixels each) of image
// blockIdx.z, adjacent along the pixels: all their loads first (16 per thread in flight), then all
// stores. One tile per block is instruction- and latency-bound: per element it recomputes 64-bit
// offsets and bounds checks, with 4 loads per thread in flight. Here the offsets are hoisted (an
// element is one add away) and full blocks skip the checks.
constexpr int kTransposeTilesPerBlock = 4;

template <typename scalar_t>
__global__ void __launch_bounds__(kTransposeTile * kTransposeRows)
nchw_to_channels_last_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                             int64_t channels, int64_t pixels) {
  constexpr int kTiles = kTransposeTilesPerBlock, kTile = kTransposeTile;
  __shared__ scalar_t tile[kTiles][kTile][kTile + 1];  // +1: no bank conflicts
  const int64_t n = blockIdx.z;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTiles * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  // reads: row j of tile t is channel c0 + j, pixels p0 + 32 t + tx; writes: pixel p0 + 32 t + j
  const scalar_t* src = in + (n * channels + c0 + ty) * pixels + p0 + tx;
  scalar_t* dst = out + (n * pixels + p0 + ty) * channels + c0 + tx;
  if (c0 + kTile <= channels && p0 + kTiles * kTile <= pixels) {  // (block-uniform)
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int j = 0; j < kTile; j += kTransposeRows) {
        tile[t][ty + j][tx] = src[t * kTile + j * pixels];
      }
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int j = 0; j < kTile; j += kTransposeRows) {
        dst[(t * kTile + j) * channels] = tile[t][tx][ty + j];
      }
    }
    return;
  }
  for (int t = 0; t < kTiles; ++t) {
    for (int j = 0; j < kTile; j += kTransposeRows) {
      if (c0 + ty + j < channels && p0 + t * kTile + tx < pixels) {
        tile[t][ty + j][tx] = src[t * kTile + j * pixels];
      }
    }
  }
  __syncthreads();
  for (int t = 0; t < kTiles; ++t) {
    for (int j = 0; j < kTile; j += kTransposeRows) {
      if (p0 + t * kTile + ty + j < pixels && c0 + tx < channels) {
        dst[(t * kTile + j) * channels] = tile[t][tx][ty + j];
      }
    }
  }
}

// x (N, C, H, W) on a CUDA device in channels-last memory: x itself when it already is, else a copy.
inline at::Tensor to_channels_last(const at::Tensor& x) {
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast)) return x;
  const int64_t batch = x.size(0), channels = x.size(1), pixels = x.size(2) * x.size(3);
  const int64_t pixel_tiles = (pixels + kTransposeTile - 1) / kTransposeTile;
  const int64_t pixel_blocks = (pixel_tiles + kTransposeTilesPerBlock - 1) / kTransposeTilesPerBlock;
  const int64_t channel_tiles = (channels + kTransposeTile - 1) / kTransposeTile;
  if (!x.is_contiguous() || x.numel() == 0 || batch > 65535 || channel_tiles > 65535 ||
      pixel_blocks > 2147483647LL) {
    return x.contiguous(at::MemoryFormat::ChannelsLast);  // shapes the grid cannot cover
  }
  auto out = at::empty_like(x, at::MemoryFormat::ChannelsLast);
  const dim3 grid(static_cast<unsigned>(pixel_blocks), static_cast<unsigned>(channel_tiles),
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

// Plain conversion of the values channels_last_to_nchw moves. A converter's prepare() runs once per
// thread before any conversion (FixedPointTo in cuda_utils.cuh reads its scale from device memory).
template <typename out_t>
struct CastTo {
  __device__ void prepare() {}
  template <typename in_t>
  __device__ out_t operator()(in_t value) const {
    return static_cast<out_t>(value);
  }
};

// Block (32, 8) copies tile (pixels p0.., channels c0..) of image n: reads 32 adjacent channels of
// a pixel, writes 32 adjacent pixels of a channel, converting each value on the way. The batch and
// channel tiles are walked by grid stride (the grid's y and z are capped at 65535).
template <typename in_t, typename out_t, typename Convert>
__global__ void __launch_bounds__(kTransposeTile * kTransposeRows)
channels_last_to_nchw_kernel(const in_t* __restrict__ in, out_t* __restrict__ out, int64_t batch,
                             int64_t channels, int64_t pixels, Convert convert) {
  static_assert(std::is_trivially_default_constructible_v<in_t>, "in_t must fit a __shared__ array");
  __shared__ in_t tile[kTransposeTile][kTransposeTile + 1];  // +1: no bank conflicts
  convert.prepare();
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * kTransposeTile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int64_t n = blockIdx.z; n < batch; n += gridDim.z) {
    for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTransposeTile; c0 < channels;
         c0 += static_cast<int64_t>(gridDim.y) * kTransposeTile) {
      // reads: row j of the tile is pixel p0 + j, channels c0 + tx; writes: row j is channel c0 + j
      // (offsets hoisted and full tiles unchecked, as in nchw_to_channels_last_kernel)
      const in_t* src = in + (n * pixels + p0 + ty) * channels + c0 + tx;
      out_t* dst = out + (n * channels + c0 + ty) * pixels + p0 + tx;
      if (c0 + kTransposeTile <= channels && p0 + kTransposeTile <= pixels) {
#pragma unroll
        for (int j = 0; j < kTransposeTile; j += kTransposeRows) {
          tile[ty + j][tx] = src[j * channels];
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kTransposeTile; j += kTransposeRows) {
          dst[j * pixels] = convert(tile[tx][ty + j]);
        }
      } else {
        for (int j = 0; j < kTransposeTile; j += kTransposeRows) {
          if (p0 + ty + j < pixels && c0 + tx < channels) tile[ty + j][tx] = src[j * channels];
        }
        __syncthreads();
        for (int j = 0; j < kTransposeTile; j += kTransposeRows) {
          if (c0 + ty + j < channels && p0 + tx < pixels) dst[j * pixels] = convert(tile[tx][ty + j]);
        }
      }
      __syncthreads();  // the tile is refilled for the next (image, channel tile)
    }
  }
}

// in: a channels-last (N, H, W, C) buffer of `out`'s shape; out: (N, C, H, W) contiguous of
// element type out_t, written as convert(in) (e.g. float or fixed-point accumulators -> the
// gradient's dtype).
template <typename out_t, typename in_t, typename Convert>
void channels_last_to_nchw(const in_t* in, const at::Tensor& out, Convert convert,
                           cudaStream_t stream) {
  TORCH_CHECK(out.dim() == 4 && out.is_contiguous(), "channels_last_to_nchw: out must be a "
              "contiguous (N, C, H, W) tensor, got ", out.sizes());
  if (out.numel() == 0) return;
  const int64_t batch = out.size(0), channels = out.size(1), pixels = out.size(2) * out.size(3);
  const int64_t pixel_tiles = (pixels + kTransposeTile - 1) / kTransposeTile;
  const int64_t channel_tiles = (channels + kTransposeTile - 1) / kTransposeTile;
  TORCH_CHECK(pixel_tiles <= 2147483647LL, "channels_last_to_nchw: too many pixels (", pixels, ")");
  const dim3 grid(static_cast<unsigned>(pixel_tiles),
                  static_cast<unsigned>(std::min<int64_t>(channel_tiles, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  const dim3 block(kTransposeTile, kTransposeRows);
  channels_last_to_nchw_kernel<in_t, out_t, Convert><<<grid, block, 0, stream>>>(
      in, out.data_ptr<out_t>(), batch, channels, pixels, convert);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace redet
