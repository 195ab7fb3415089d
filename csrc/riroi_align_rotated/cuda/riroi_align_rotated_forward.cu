// RiRoIAlignRotated's forward on CUDA (single- and multi-level share these kernels; single = one
// level). The backward: riroi_align_rotated_backward.cu.
//
// Forward (nO <= 32): a channels-last gather. The features are read as (N, H, W, C) (the host
// passes each level through to_channels_last, common/cuda/channels_last.cuh: free when the caller
// already passes channels-last, one tiled transpose otherwise), so the C channels of a pixel are
// adjacent words. One warp handles one (RoI, channel chunk); a chunk is `lanes = (32 / nO) * nO`
// consecutive channels, i.e. whole orientation groups (nO = 8: 32 lanes = 4 groups; nO = 6: 30
// lanes), and lane i owns channel chunk_start + i. All lanes share the RoI's sample points, so
// every bilinear tap is one coalesced request: 32 adjacent channels of one pixel. (On NCHW maps one
// thread per bin makes the 32 lanes of a warp read 32 different bins: ~32 sectors per request, 4
// useful bytes each.) With num_samples == 2 the lanes compute the taps of 8 bins at once (one
// sample each) and share them through shared memory instead of each lane repeating the geometry,
// then issue two bins' 32 loads before using any (fixed_grid_bin_sums: the kernel is
// latency-bound); any other grid is walked by every lane (warp-uniform). A warp takes at most 32
// of a RoI's bins (bin_parts). The orientation alignment needs two other channels of the lane's
// own group: two warp shuffles per bin. Outputs are (K, C, bins) with bins contiguous: a
// ChannelTile (common/cuda/channel_tile.cuh) transposes them in shared memory so that the stores
// are coalesced too. nO > 32 (a group wider than a warp) uses a plain NCHW kernel, one thread per
// output.
// Bad rows: the RoI check (common/cuda/roi_checks.cuh) is enqueued before the kernels and read
// after them, or skipped in a CUDA graph; every kernel tests each row (roi_level_and_image): the
// forward writes zeros for a row that breaks the rules.
#include <ATen/OpMathType.h>

#include <vector>

#include "common/cuda/channel_tile.cuh"
#include "common/cuda/channels_last.cuh"
#include "common/cuda/roi_checks.cuh"
#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"
#include "riroi_align_rotated/cuda/kernel_common.cuh"
#include "riroi_align_rotated/riroi_align_rotated.h"
#include "riroi_align_rotated/riroi_align_rotated_math.h"

namespace redet {
namespace {

template <typename scalar_t>
using acc_of_t = at::opmath_type<scalar_t>;

// Feature reads through the read-only data cache (the table of levels hides __restrict__).
__device__ __forceinline__ float load_feature(const float* p) { return __ldg(p); }
__device__ __forceinline__ double load_feature(const double* p) { return __ldg(p); }
__device__ __forceinline__ c10::Half load_feature(const c10::Half* p) {
  return c10::Half(__ldg(reinterpret_cast<const unsigned short*>(p)), c10::Half::from_bits());
}
__device__ __forceinline__ c10::BFloat16 load_feature(const c10::BFloat16* p) {
  return c10::BFloat16(__ldg(reinterpret_cast<const unsigned short*>(p)),
                       c10::BFloat16::from_bits());
}

// Sum over the samples of bin (ph, pw) of the bilinear value of one channel; `map` points at the
// lane's channel of pixel 0 of its image, pixels `channels` words apart. Inactive lanes (past the
// channel count) read nothing and return 0. Samples off the map read nothing (warp-uniform).
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ acc_t any_grid_bin_sum(const RiRoIGeometry<acc_t>& g, int ph, int pw,
                                                  int height, int width,
                                                  const scalar_t* __restrict__ map,
                                                  int64_t channels, bool active) {
  acc_t sum = acc_t(0);
  for (int iy = 0; iy < g.grid_h; ++iy) {
    for (int ix = 0; ix < g.grid_w; ++ix) {
      BilinearTaps<acc_t> t;
      if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
      acc_t v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        v[q] = active ? static_cast<acc_t>(load_feature(map + t.offset[q] * channels)) : acc_t(0);
      }
      // the CPU kernel's expression and order
      sum += t.weight[0] * v[0] + t.weight[1] * v[1] + t.weight[2] * v[2] + t.weight[3] * v[3];
    }
  }
  return sum;
}

// The fixed-grid forward's taps of one sample, computed by one lane and read by the whole warp
// (shared memory: one 16-byte read for the offsets, one for the float weights). The offsets are
// 32-bit byte offsets into the image (the host checks that an image is under 4 GB): a load then
// costs one 32 + 64-bit add, and a sample half the registers of the backward's 64-bit SharedTaps.
constexpr uint32_t kOffMap = 0xffffffffu;  // byte_offset[0]: the sample reads nothing

template <typename acc_t>
struct alignas(16) ByteTaps {
  uint32_t byte_offset[4];
  acc_t weight[4];
};

// Lane `lane` computes sample lane % kSamples (row-major in the bin's grid) of bin
// first + lane / kSamples; lanes of bins from `end` on (past the warp's bins) write an off-map
// entry, which the forward's bin steps (fixed_grid_bin_sums) read when a pass has an odd number of
// bins. pixel_bytes: channels * element size.
template <int kGrid, typename acc_t>
__device__ __forceinline__ void compute_byte_taps(const RiRoIGeometry<acc_t>& g, int first,
                                                  int end, int out_w, int height, int width,
                                                  uint32_t pixel_bytes, int lane,
                                                  ByteTaps<acc_t>* taps) {
  constexpr int kSamples = kGrid * kGrid;
  if (lane >= (kWarp / kSamples) * kSamples) return;
  const int bin = first + lane / kSamples, s = lane % kSamples;
  BilinearTaps<acc_t> t;
  ByteTaps<acc_t> entry{};
  if (bin < end &&
      sample_taps(g, bin / out_w, bin % out_w, s / kGrid, s % kGrid, height, width, &t)) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      entry.byte_offset[q] = static_cast<uint32_t>(t.offset[q]) * pixel_bytes;
      entry.weight[q] = t.weight[q];
    }
  } else {
    entry.byte_offset[0] = kOffMap;
  }
  taps[lane] = entry;
}

template <typename scalar_t>
__device__ __forceinline__ acc_of_t<scalar_t> load_at(const char* lane_map, uint32_t byte_offset) {
  return static_cast<acc_of_t<scalar_t>>(
      load_feature(reinterpret_cast<const scalar_t*>(lane_map + byte_offset)));
}

// Sums of kBins consecutive bins (kSamples taps each, from compute_byte_taps) of the lane's
// channel. All their loads are issued before any is used: the kernel is latency-bound (one bin at
// a time keeps 16 loads in flight per warp, under one eligible warp per scheduler), so kBins = 2
// doubles the loads in flight. Off-map samples
// are skipped (warp-uniform) as in the CPU kernel, whose expression and order each bin's sum keeps.
template <int kBins, int kSamples, typename scalar_t, typename acc_t>
__device__ __forceinline__ void fixed_grid_bin_sums(const ByteTaps<acc_t>* taps,
                                                    const char* lane_map, acc_t (&sums)[kBins]) {
  constexpr int kTaps = kBins * kSamples;
  acc_t v[kTaps][4];
  bool on_map[kTaps];
#pragma unroll
  for (int s = 0; s < kTaps; ++s) {
    const uint4 offset = *reinterpret_cast<const uint4*>(taps[s].byte_offset);
    on_map[s] = offset.x != kOffMap;
    if (on_map[s]) {
      v[s][0] = load_at<scalar_t>(lane_map, offset.x);
      v[s][1] = load_at<scalar_t>(lane_map, offset.y);
      v[s][2] = load_at<scalar_t>(lane_map, offset.z);
      v[s][3] = load_at<scalar_t>(lane_map, offset.w);
    }
  }
#pragma unroll
  for (int b = 0; b < kBins; ++b) {
    acc_t sum = acc_t(0);
#pragma unroll
    for (int i = 0; i < kSamples; ++i) {
      const int s = b * kSamples + i;
      if (!on_map[s]) continue;
      const ByteTaps<acc_t>& t = taps[s];
      sum += t.weight[0] * v[s][0] + t.weight[1] * v[s][1] + t.weight[2] * v[s][2] +
             t.weight[3] * v[s][3];
    }
    sums[b] = sum;
  }
}

// The forward splits a (RoI, chunk)'s bins into parts of at most 32 (one ChannelTile), as equal
// as can be: 7 x 7 bins -> 25 + 24. With all 49 bins per warp, the training shape (2 x 256^2 x 256
// map, 1024 RoIs) has 8192 items on 3168 warp slots, so the last round leaves most slots idle for a
// large part of the kernel's time, and a block holds its slot until its slowest warp is done.
// Parts of half the length halve that tail for one more RoI geometry per part.
REDET_HOST_DEVICE int bin_parts(int bins) { return (bins + kWarp - 1) / kWarp; }

// One warp per (RoI, channel chunk, bin part), flattened chunk-major (chunk_of_item) with the part
// fastest, grid-stride over warps. Every branch on the work item is warp-uniform, so the full-warp
// shuffles and __syncwarp see all 32 lanes.
// kGrid: 2 when num_samples == 2 (fixed grid, taps shared through shared memory), 0 for any other
// (or adaptive) grid, where every lane walks the samples itself. The fixed grid needs every
// image under 4 GB (32-bit byte offsets, ByteTaps); the host checks.
template <typename scalar_t, int kGrid>
__global__ void __launch_bounds__(kWarp * channels_last_warps_per_block<scalar_t>(), 3)
forward_channels_last_kernel(FeatureLevels<scalar_t, at::opmath_type<scalar_t>> levels,
                             const scalar_t* __restrict__ rois,
                             const int64_t* __restrict__ roi_levels, int64_t num_rois,
                             int channels, int batch_size, KernelOptions opt,
                             scalar_t* __restrict__ output) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int kWarps = channels_last_warps_per_block<scalar_t>();
  constexpr int kSamples = kGrid * kGrid;
  __shared__ __align__(16) unsigned char tile_memory[channels_last_tile_bytes<scalar_t>()];
  __shared__ ByteTaps<acc_t> shared_taps[kWarps][kGrid > 0 ? kWarp : 1];
  const ChunkLane c = chunk_lane(channels, opt.num_orientations);
  const int lane = c.lane;
  ChannelTile<scalar_t> tile = warp_tile<scalar_t>(tile_memory, c.warp);
  ByteTaps<acc_t>* taps = shared_taps[c.warp];
  const int num_o = opt.num_orientations, bins = opt.out_h * opt.out_w;
  const uint32_t pixel_bytes = static_cast<uint32_t>(channels * sizeof(scalar_t));  // kGrid > 0
  const int parts = bin_parts(bins), part_bins = (bins + parts - 1) / parts;
  const int64_t items = num_rois * c.chunks * parts;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + c.warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const ChunkItem it = chunk_item(item / parts, num_rois, channels, c);
    // this warp's bins: [begin, end), at most 32 (parts of <= 32 bins; never empty)
    const int begin = static_cast<int>(item % parts) * part_bins;
    const int end = min(bins, begin + part_bins);
    scalar_t* out = output + (it.k * channels + it.chunk_start) * bins;
    LevelRoi<acc_t> r;
    if (!level_roi<kGrid>(levels, rois, roi_levels, it.k, batch_size, opt, &r)) {
      for (int slot = 0; slot < end - begin; ++slot) tile.put(lane, slot, scalar_t(0));
      tile.store(out + begin, it.chunk_channels, end - begin, bins, lane);  // zeros (warp-uniform)
      continue;
    }
    const RiRoIGeometry<acc_t>& g = r.g;
    // The lanes holding this output's two source orientations (lanes of the same group).
    const int main_lane = c.group_lane + main_source(c.orientation, g.shift, num_o);
    const int side_lane =
        c.group_lane + neighbour_source(c.orientation, g.shift, num_o, opt.legacy);
    const acc_t keep = acc_t(1) - g.frac;
    const scalar_t* chunk_map = levels.data[r.level] +
                                static_cast<int64_t>(r.image) * r.height * r.width * channels +
                                it.chunk_start;
    const scalar_t* map = chunk_map + lane;
    // v: this lane's channel summed over the bin's samples -> orientation alignment -> tile
    auto emit = [&](int bin, acc_t v) {
      const acc_t main = __shfl_sync(kFullWarpMask, v, main_lane);
      const acc_t side = __shfl_sync(kFullWarpMask, v, side_lane);
      const int slot = bin - begin;  // < 32: the part fits the tile
      tile.put(lane, slot, static_cast<scalar_t>((keep * main + g.frac * side) / g.count));
      if (bin == end - 1) tile.store(out + begin, it.chunk_channels, slot + 1, bins, lane);
    };
    if constexpr (kGrid > 0) {
      constexpr int kBinsPerPass = kWarp / kSamples, kBinsPerStep = 2;
      static_assert(kBinsPerPass % kBinsPerStep == 0, "a step's bins lie in one pass");
      // Lanes past the chunk's channels read their chunk's last channel (loads need no lane
      // predicate; the same 128-byte line): their results only reach lanes of their own
      // (inactive) groups or of no group, and the tile stores only chunk_channels rows.
      const char* lane_map =
          reinterpret_cast<const char*>(chunk_map + min(lane, it.chunk_channels - 1));
      for (int first = begin; first < end; first += kBinsPerPass) {
        compute_byte_taps<kGrid>(g, first, end, opt.out_w, r.height, r.width, pixel_bytes, lane,
                                 taps);
        __syncwarp();
        const int pass_bins = min(kBinsPerPass, end - first);
        for (int j = 0; j < pass_bins; j += kBinsPerStep) {
          acc_t sums[kBinsPerStep];
          fixed_grid_bin_sums<kBinsPerStep, kSamples, scalar_t>(taps + j * kSamples, lane_map,
                                                                sums);
#pragma unroll
          for (int b = 0; b < kBinsPerStep; ++b) {
            if (j + b < pass_bins) emit(first + j + b, sums[b]);
          }
        }
        __syncwarp();  // the next pass rewrites the taps
      }
    } else {
      for (int bin = begin; bin < end; ++bin) {
        emit(bin, any_grid_bin_sum(g, bin / opt.out_w, bin % opt.out_w, r.height, r.width, map,
                                   channels, it.active));
      }
    }
  }
}

// nO > 32 (NCHW): one thread per output, reading its two source channels at every sample.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
forward_any_orientations_kernel(FeatureLevels<scalar_t, at::opmath_type<scalar_t>> levels,
                                const scalar_t* __restrict__ rois,
                                const int64_t* __restrict__ roi_levels, int64_t num_rois,
                                int64_t channels, int batch_size, KernelOptions opt,
                                scalar_t* __restrict__ output) {
  using acc_t = at::opmath_type<scalar_t>;
  const int bins = opt.out_h * opt.out_w, num_o = opt.num_orientations;
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int bin = static_cast<int>(i % bins);
    const int o = static_cast<int>((i / bins) % num_o);
    const int64_t k = (i / (bins * num_o)) % num_rois;
    const int64_t c = i / (static_cast<int64_t>(bins) * num_o * num_rois);  // group
    LevelRoi<acc_t> r;
    if (!level_roi<0>(levels, rois, roi_levels, k, batch_size, opt, &r)) {
      output[(k * channels + c * num_o + o) * bins + bin] = scalar_t(0);
      continue;
    }
    const int height = r.height, width = r.width;
    const int64_t plane = static_cast<int64_t>(height) * width;
    const RiRoIGeometry<acc_t>& g = r.g;
    const scalar_t* planes = levels.data[r.level] + (r.image * channels + c * num_o) * plane;
    const scalar_t* main = planes + main_source(o, g.shift, num_o) * plane;
    const scalar_t* side = planes + neighbour_source(o, g.shift, num_o, opt.legacy) * plane;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    acc_t main_sum = 0, side_sum = 0;
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        BilinearTaps<acc_t> t;
        if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          main_sum += t.weight[q] * static_cast<acc_t>(main[t.offset[q]]);
          side_sum += t.weight[q] * static_cast<acc_t>(side[t.offset[q]]);
        }
      }
    }
    output[(k * channels + c * num_o + o) * bins + bin] =
        static_cast<scalar_t>(((acc_t(1) - g.frac) * main_sum + g.frac * side_sum) / g.count);
  }
}

template <typename scalar_t>
void launch_forward_channels_last(const FeatureLevels<scalar_t, at::opmath_type<scalar_t>>& table,
                                  const scalar_t* rois, const int64_t* roi_levels,
                                  int64_t num_rois, int channels, int batch_size,
                                  const KernelOptions& opt, scalar_t* out, cudaStream_t stream) {
  constexpr int threads = kWarp * channels_last_warps_per_block<scalar_t>();
  const int lanes = chunk_lanes(opt.num_orientations);
  const int64_t warps =
      num_rois * ((channels + lanes - 1) / lanes) * bin_parts(opt.out_h * opt.out_w);
  const int blocks = blocks_for(warps * kWarp, threads);
  // ReDet's setting: the unrolled 2 x 2 grid, whose 32-bit byte offsets need every image under
  // 4 GB (any real map; the general kernel computes the same values otherwise).
  bool images_fit_32_bits = true;
  for (int l = 0; l < table.count; ++l) {
    const uint64_t image_bytes = static_cast<uint64_t>(table.height[l]) * table.width[l] *
                                 static_cast<uint64_t>(channels) * sizeof(scalar_t);
    images_fit_32_bits = images_fit_32_bits && image_bytes <= UINT32_MAX;
  }
  if (opt.num_samples == 2 && images_fit_32_bits) {
    forward_channels_last_kernel<scalar_t, 2><<<blocks, threads, 0, stream>>>(
        table, rois, roi_levels, num_rois, channels, batch_size, opt, out);
  } else {
    forward_channels_last_kernel<scalar_t, 0><<<blocks, threads, 0, stream>>>(
        table, rois, roi_levels, num_rois, channels, batch_size, opt, out);
  }
}

}  // namespace

at::Tensor riroi_align_rotated_forward_cuda(at::TensorList features_, const at::Tensor& rois_,
                                            const at::Tensor& levels_,
                                            at::ArrayRef<double> scales, const RiRoIOptions& opt,
                                            const char* name, const char* op) {
  check_riroi_forward(features_, rois_, levels_, scales, opt, name, op);
  c10::cuda::CUDAGuard guard(features_[0].device());
  DeferredRoiCheck roi_check(rois_, features_[0].size(0), levels_, features_.size());
  // nO <= 32: the channels-last gather; a wider group does not fit a warp (NCHW kernel).
  const bool channels_last = opt.num_orientations <= kWarp;
  std::vector<at::Tensor> features;
  for (const auto& f : features_) features.push_back(channels_last ? to_channels_last(f) : f.contiguous());
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_rois = rois.size(0), channels = features[0].size(1);
  const int batch_size = static_cast<int>(features[0].size(0));
  // (K, C, out_h, out_w) contiguous whatever the features' layout
  auto output = at::empty({num_rois, channels, opt.out_h, opt.out_w}, features[0].options());
  if (output.numel() == 0) {
    roi_check.raise_if_bad(op);
    return output;
  }
  const auto kopt = kernel_options(opt);
  const int64_t* roi_levels = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, features[0].scalar_type(),
                                  "riroi_align_rotated_cuda", [&] {
    const auto table = feature_levels<scalar_t, at::opmath_type<scalar_t>>(features, scales);
    const scalar_t* roi_data = rois.data_ptr<scalar_t>();
    scalar_t* out = output.data_ptr<scalar_t>();
    if (channels_last) {
      launch_forward_channels_last<scalar_t>(table, roi_data, roi_levels, num_rois,
                                             static_cast<int>(channels), batch_size, kopt, out,
                                             stream);
    } else {
      const int64_t outputs = channels * num_rois * opt.out_h * opt.out_w;
      forward_any_orientations_kernel<scalar_t><<<blocks_for(outputs), kThreads, 0, stream>>>(
          table, roi_data, roi_levels, num_rois, channels, batch_size, kopt, out);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  roi_check.raise_if_bad(op);  // waits for the check only; the kernels above run on
  return output;
}

}  // namespace redet
