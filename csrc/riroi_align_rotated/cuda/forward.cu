// RiRoIAlignRotated on CUDA (single- and multi-level share these kernels; single = one level).
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
// own group: two warp shuffles per bin. Outputs are (K, C, bins) with bins
// contiguous: a ChannelTile (csrc/common/cuda/channel_tile.cuh) transposes them in shared memory so
// that the stores are coalesced too. nO > 32 (a group wider than a warp) keeps a plain NCHW kernel,
// one thread per output.
//
// Backward (nO <= 32): the forward's mapping run backwards, a channels-last scatter. One warp per
// (RoI, channel chunk), lane = channel, as above. Per bin, input orientation j (the lane's) feeds
// two outputs of its group, main_target(j) with weight 1 - frac and neighbour_target(j) with
// weight frac (riroi_geometry.h); the warp loads the chunk's grad_output once per 32 bins through
// a ChannelTile (coalesced: grad_output is (K, C, bins), bins contiguous) and each lane takes its
// two outputs from its group's lanes by shuffles. Then every tap is one atomic request of 32
// adjacent words: the chunk's channels of one pixel of a scratch laid out [level][n][pixel][C].
// Why: the older one-thread-per-(group, RoI, bin, j) scatter (three times the forward's time at
// the training shape) spread a warp's request over the pixels of 4 bins (nO = 8: 4 lines, 8 words
// each), recomputed the RoI geometry and the sample taps in every thread, and read grad_output at
// 2 scattered words per thread; here the geometry is computed
// once per warp (with num_samples == 2 the taps of 8 bins at once, shared through shared memory,
// as in the forward), the reads are coalesced, and a float request is one 128-byte line. Then
// one tiled transpose per level (channels_last_to_nchw, common/cuda/channels_last.cuh) turns the
// scratch into the level's (N, C, H, W) gradient, converting to its dtype on the way. nO > 32
// keeps the older scatter, its scratch [level][n][group][pixel][j] (nO adjacent words per bin).
// Fast path: float atomics (double for double). Deterministic mode: the same mappings with 64-bit
// fixed point and integer atomics (order-independent sums, bitwise repeatable), scaled by
// sum |grad_output|, which bounds every input's total since each output's weights onto the input
// sum to <= 1.
// Bad rows: the RoI check (common/cuda/roi_checks.cuh) is enqueued before the kernels and read
// after them, or skipped in a CUDA graph; every kernel tests each row (roi_level_and_image): the
// forward writes zeros for a row that breaks the rules, the backward skips it.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#include "common/cuda/channel_tile.cuh"
#include "common/cuda/channels_last.cuh"
#include "common/cuda/roi_checks.cuh"
#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"
#include "riroi_align_rotated/riroi_align_rotated.h"
#include "riroi_align_rotated/riroi_align_rotated_ops.h"
#include "riroi_align_rotated/riroi_geometry.h"

namespace redet {
namespace {

struct KernelOptions {
  int out_h, out_w, num_samples, num_orientations;
  bool clockwise, legacy;
};

KernelOptions kernel_options(const RiRoIOptions& o) {
  return {static_cast<int>(o.out_h), static_cast<int>(o.out_w), static_cast<int>(o.num_samples),
          static_cast<int>(o.num_orientations), o.clockwise, o.legacy_orientation};
}

// Level and image of RoI k; false for rows that break the rules of common/roi_rows.h (a bad level
// or batch index, a NaN/inf value: an infinite size would ask the adaptive sampling grid for ~2^31
// samples). The op's check (DeferredRoiCheck) raises for them after the kernels ran, or not at all
// in a CUDA graph: the forward writes zeros for such a row, the backward passes it no gradient.
template <typename scalar_t>
__device__ __forceinline__ bool roi_level_and_image(const scalar_t* roi, const int64_t* roi_levels,
                                                    int64_t k, int num_levels, int batch_size,
                                                    int* level, int* image) {
  const int64_t l = roi_levels ? roi_levels[k] : 0;
  int64_t n;
  if (!roi_row_image(roi, 6, batch_size, l, num_levels, &n)) return false;
  *level = static_cast<int>(l);
  *image = static_cast<int>(n);
  return true;
}

// ------------------------------------------ forward ------------------------------------------
// Work items (RoI, channel chunk) of the channels-last kernels go chunk-major: item = chunk *
// num_rois + RoI. The warps in flight then share one chunk's channels of every pixel (training
// shape: 2 x 256^2 pixels x 128 B = 17 MB, L2-resident) instead of all channels of the RoIs in
// flight, whose footprints far exceed L2 (RoI-major, the forward read the map from DRAM several
// times over). The backward's atomics gained most; the forward, bound by its L1/L2 requests rather
// than by DRAM, about the same either way.
__device__ __forceinline__ int chunk_of_item(int64_t item, int64_t num_rois) {
  return static_cast<int>(item / num_rois);
}

// Blocks of the channels-last forward and backward: 8 warps (4 for double, whose tiles are twice as
// large), so that each warp's ChannelTile and shared taps stay under the 48 KB of static shared
// memory per block (float 45 KB, double 41 KB).
template <typename scalar_t>
constexpr int channels_last_warps_per_block() {
  return sizeof(scalar_t) == 8 ? 4 : 8;
}

// Channels of one warp: whole orientation groups, as many as fit in 32 lanes.
REDET_HOST_DEVICE int chunk_lanes(int num_orientations) {
  return (kWarp / num_orientations) * num_orientations;
}

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

// One sample's bilinear taps, computed by one lane and read by the whole warp (shared memory).
// The offsets are in bytes of the channels-last map (pixel offset * channels * element size),
// multiplied once here: a load then costs one 64-bit add.
template <typename acc_t>
struct alignas(16) SharedTaps {
  int64_t byte_offset[4];  // byte_offset[0] < 0: the sample is off the map and reads nothing
  acc_t weight[4];
};

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
// channel. All their loads are issued before any is used: the one-bin-at-a-time loop was
// latency-bound (16 loads in flight per warp, under one eligible warp per scheduler; a float16 map,
// half the bytes, was hardly faster), so kBins = 2 doubles the loads in flight. Off-map samples
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

// The backward's taps (the forward's fixed grid has compute_byte_taps): lane `lane` computes
// sample lane % kSamples (row-major in the bin's grid) of bin first + lane / kSamples. element_t:
// the words of the channels-last scratch the byte offsets address.
template <int kGrid, typename element_t, typename acc_t>
__device__ __forceinline__ void compute_shared_taps(const RiRoIGeometry<acc_t>& g, int first,
                                                    int bins, int out_w, int height, int width,
                                                    int channels, int lane,
                                                    SharedTaps<acc_t>* taps) {
  constexpr int kSamples = kGrid * kGrid;
  const int bin = first + lane / kSamples, s = lane % kSamples;
  if (lane >= (kWarp / kSamples) * kSamples || bin >= bins) return;
  BilinearTaps<acc_t> t;
  SharedTaps<acc_t> entry{};
  if (sample_taps(g, bin / out_w, bin % out_w, s / kGrid, s % kGrid, height, width, &t)) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      entry.byte_offset[q] = static_cast<int64_t>(t.offset[q]) * channels *
                             static_cast<int64_t>(sizeof(element_t));
      entry.weight[q] = t.weight[q];
    }
  } else {
    entry.byte_offset[0] = -1;
  }
  taps[lane] = entry;
}

// The forward splits a (RoI, chunk)'s bins into parts of at most 32 (one ChannelTile), as equal
// as can be: 7 x 7 bins -> 25 + 24. With all 49 bins per warp, the training shape (2 x 256^2 x 256
// map, 1024 RoIs) has 8192 items on 3168 warp slots, so the last round left most slots idle for a
// large part of the kernel's time, and a block holds its slot until its slowest warp is done. Parts of
// half the length halve that tail for one more RoI geometry per part.
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
  // raw bytes: c10::Half / BFloat16 have constructors, which __shared__ arrays may not have
  __shared__ __align__(16) unsigned char tile_memory[kWarps * ChannelTile<scalar_t>::elements() *
                                                     sizeof(scalar_t)];
  __shared__ ByteTaps<acc_t> shared_taps[kWarps][kGrid > 0 ? kWarp : 1];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  ChannelTile<scalar_t> tile(reinterpret_cast<scalar_t*>(tile_memory) +
                             warp * ChannelTile<scalar_t>::elements());
  ByteTaps<acc_t>* taps = shared_taps[warp];
  const int num_o = opt.num_orientations, bins = opt.out_h * opt.out_w;
  const int lanes = chunk_lanes(num_o);
  const int chunks = (channels + lanes - 1) / lanes;
  const int orientation = lane % num_o, group_lane = lane - orientation;  // lane of orientation 0
  const uint32_t pixel_bytes = static_cast<uint32_t>(channels * sizeof(scalar_t));  // kGrid > 0
  const int parts = bin_parts(bins), part_bins = (bins + parts - 1) / parts;
  const int64_t items = num_rois * chunks * parts;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t roi_item = item / parts;
    const int64_t k = roi_item % num_rois;  // chunk-major: see chunk_of_item
    const int chunk_start = chunk_of_item(roi_item, num_rois) * lanes;
    const int chunk_channels = min(lanes, channels - chunk_start);
    const bool active = lane < chunk_channels;
    // this warp's bins: [begin, end), at most 32 (parts of <= 32 bins; never empty)
    const int begin = static_cast<int>(item % parts) * part_bins;
    const int end = min(bins, begin + part_bins);
    const scalar_t* roi = rois + k * 6;
    int l, n;
    scalar_t* out = output + (k * channels + chunk_start) * bins;
    if (!roi_level_and_image(roi, roi_levels, k, levels.count, batch_size, &l, &n)) {
      for (int slot = 0; slot < end - begin; ++slot) tile.put(lane, slot, scalar_t(0));
      tile.store(out + begin, chunk_channels, end - begin, bins, lane);  // zeros (warp-uniform)
      continue;
    }
    const int height = levels.height[l], width = levels.width[l];
    auto g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[l], opt.out_h, opt.out_w,
                                             opt.num_samples, num_o, opt.clockwise);
    if constexpr (kGrid > 0) {
      // Equal already (num_samples == kGrid); as compile-time constants they let the compiler
      // fold the divisions by the grid into exact multiplications.
      g.grid_h = g.grid_w = kGrid;
      g.count = acc_t(kGrid * kGrid);
    }
    // The lanes holding this output's two source orientations (lanes of the same group).
    const int main_lane = group_lane + main_source(orientation, g.shift, num_o);
    const int side_lane = group_lane + neighbour_source(orientation, g.shift, num_o, opt.legacy);
    const acc_t keep = acc_t(1) - g.frac;
    const scalar_t* chunk_map =
        levels.data[l] + static_cast<int64_t>(n) * height * width * channels + chunk_start;
    const scalar_t* map = chunk_map + lane;
    // v: this lane's channel summed over the bin's samples -> orientation alignment -> tile
    auto emit = [&](int bin, acc_t v) {
      const acc_t main = __shfl_sync(kFullWarpMask, v, main_lane);
      const acc_t side = __shfl_sync(kFullWarpMask, v, side_lane);
      const int slot = bin - begin;  // < 32: the part fits the tile
      tile.put(lane, slot, static_cast<scalar_t>((keep * main + g.frac * side) / g.count));
      if (bin == end - 1) tile.store(out + begin, chunk_channels, slot + 1, bins, lane);
    };
    if constexpr (kGrid > 0) {
      constexpr int kBinsPerPass = kWarp / kSamples, kBinsPerStep = 2;
      static_assert(kBinsPerPass % kBinsPerStep == 0, "a step's bins lie in one pass");
      // Lanes past the chunk's channels read their chunk's last channel (loads need no lane
      // predicate; the same 128-byte line): their results only reach lanes of their own
      // (inactive) groups or of no group, and the tile stores only chunk_channels rows.
      const char* lane_map =
          reinterpret_cast<const char*>(chunk_map + min(lane, chunk_channels - 1));
      for (int first = begin; first < end; first += kBinsPerPass) {
        compute_byte_taps<kGrid>(g, first, end, opt.out_w, height, width, pixel_bytes, lane,
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
        emit(bin, any_grid_bin_sum(g, bin / opt.out_w, bin % opt.out_w, height, width, map,
                                   channels, active));
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
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, levels.count, batch_size, &l, &n)) {
      output[(k * channels + c * num_o + o) * bins + bin] = scalar_t(0);
      continue;
    }
    const int height = levels.height[l], width = levels.width[l];
    const int64_t plane = static_cast<int64_t>(height) * width;
    const auto g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[l], opt.out_h,
                                                   opt.out_w, opt.num_samples, num_o, opt.clockwise);
    const scalar_t* planes = levels.data[l] + (n * channels + c * num_o) * plane;
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

// ------------------------------------------ backward ------------------------------------------
// Shapes of every level and where its block starts in the scratch buffer. Both scratch layouts
// hold N * C * H * W words per level: [n][pixel][C] (channels-last kernel) or [n][group][pixel][nO]
// (nO > 32).
template <typename acc_t>
struct LevelLayout {
  int count;
  int height[kMaxFeatureLevels];
  int width[kMaxFeatureLevels];
  acc_t spatial_scale[kMaxFeatureLevels];
  int64_t word_offset[kMaxFeatureLevels + 1];  // scratch words before each level
};

template <typename scalar_t>
struct GradientLevels {
  scalar_t* data[kMaxFeatureLevels];
};

// Scratch accumulators: float (double for double), or int64 fixed point in deterministic mode.
template <typename scalar_t, bool kFixedPoint>
using ScratchType = std::conditional_t<kFixedPoint, long long, at::opmath_type<scalar_t>>;

__device__ __forceinline__ void scratch_add(float* word, float value, double) {
  atomicAdd(word, value);
}
__device__ __forceinline__ void scratch_add(double* word, double value, double) {
  atomicAdd(word, value);
}
template <typename acc_t>
__device__ __forceinline__ void scratch_add(long long* word, acc_t value, double scale) {
  atomic_add_fixed_point(word, static_cast<double>(value), scale);
}

// Scatters one bin's gradient `grad` of the lane's channel onto the taps of its samples (any grid,
// walked by every lane; warp-uniform). `lane_scratch` points at the lane's channel of pixel 0 of
// the image, pixels `channels` words apart. Zero weights (border clamps) and lanes with
// write == false add nothing.
template <typename scratch_t, typename acc_t>
__device__ __forceinline__ void any_grid_bin_scatter(const RiRoIGeometry<acc_t>& g, int ph, int pw,
                                                     int height, int width,
                                                     scratch_t* __restrict__ lane_scratch,
                                                     int64_t channels, acc_t grad, bool write,
                                                     double scale) {
  for (int iy = 0; iy < g.grid_h; ++iy) {
    for (int ix = 0; ix < g.grid_w; ++ix) {
      BilinearTaps<acc_t> t;
      if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (write && t.weight[q] != acc_t(0)) {
          scratch_add(lane_scratch + t.offset[q] * channels, t.weight[q] * grad, scale);
        }
      }
    }
  }
}

// The same with the bin's kSamples taps computed once for the warp (compute_shared_taps, byte
// offsets into the scratch).
template <int kSamples, typename scratch_t, typename acc_t>
__device__ __forceinline__ void shared_taps_bin_scatter(const SharedTaps<acc_t>* taps,
                                                        scratch_t* __restrict__ lane_scratch,
                                                        acc_t grad, bool write, double scale) {
  char* lane_bytes = reinterpret_cast<char*>(lane_scratch);
#pragma unroll
  for (int s = 0; s < kSamples; ++s) {
    const SharedTaps<acc_t> t = taps[s];
    if (t.byte_offset[0] < 0) continue;  // off the map (warp-uniform)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (write && t.weight[q] != acc_t(0)) {
        scratch_add(reinterpret_cast<scratch_t*>(lane_bytes + t.byte_offset[q]),
                    t.weight[q] * grad, scale);
      }
    }
  }
}

// The forward's mapping run backwards: one warp per (RoI, channel chunk), lane = channel. Per tile
// of up to 32 bins the warp loads the chunk's grad_output rows coalesced (ChannelTile::load); per
// bin each lane (input orientation j of its group) takes the two outputs that read it from its
// group's lanes by shuffles, then adds its share at every tap: one atomic request covers the
// chunk's adjacent channels of one pixel of the channels-last scratch [level][n][pixel][C].
// kGrid as in the forward (2: the taps of 8 bins shared through shared memory; 0: any grid).
template <typename scalar_t, bool kFixedPoint, int kGrid>
__global__ void __launch_bounds__(kWarp * channels_last_warps_per_block<scalar_t>(), 3)
backward_channels_last_kernel(const scalar_t* __restrict__ grad,
                              const scalar_t* __restrict__ rois,
                              const int64_t* __restrict__ roi_levels, int64_t num_rois,
                              int channels, int batch_size,
                              LevelLayout<at::opmath_type<scalar_t>> layout, KernelOptions opt,
                              ScratchType<scalar_t, kFixedPoint>* __restrict__ scratch,
                              const double* __restrict__ bound) {
  using acc_t = at::opmath_type<scalar_t>;
  using scratch_t = ScratchType<scalar_t, kFixedPoint>;
  constexpr int kWarps = channels_last_warps_per_block<scalar_t>();
  constexpr int kSamples = kGrid * kGrid;
  __shared__ __align__(16) unsigned char tile_memory[kWarps * ChannelTile<scalar_t>::elements() *
                                                     sizeof(scalar_t)];
  __shared__ SharedTaps<acc_t> shared_taps[kWarps][kGrid > 0 ? kWarp : 1];
  const double scale = kFixedPoint ? fixed_point_scale(*bound) : 1.0;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  ChannelTile<scalar_t> tile(reinterpret_cast<scalar_t*>(tile_memory) +
                             warp * ChannelTile<scalar_t>::elements());
  SharedTaps<acc_t>* taps = shared_taps[warp];
  const int num_o = opt.num_orientations, bins = opt.out_h * opt.out_w;
  const int lanes = chunk_lanes(num_o);
  const int chunks = (channels + lanes - 1) / lanes;
  const int orientation = lane % num_o, group_lane = lane - orientation;  // lane of orientation 0
  const int64_t items = num_rois * chunks;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t k = item % num_rois;  // chunk-major: see chunk_of_item
    const int chunk_start = chunk_of_item(item, num_rois) * lanes;
    const int chunk_channels = min(lanes, channels - chunk_start);
    const bool active = lane < chunk_channels;
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, layout.count, batch_size, &l, &n)) continue;
    const int height = layout.height[l], width = layout.width[l];
    auto g = riroi_geometry<scalar_t, acc_t>(roi, layout.spatial_scale[l], opt.out_h, opt.out_w,
                                             opt.num_samples, num_o, opt.clockwise);
    if constexpr (kGrid > 0) {  // compile-time constants, as in the forward
      g.grid_h = g.grid_w = kGrid;
      g.count = acc_t(kGrid * kGrid);
    }
    // The lanes holding the two outputs that read this lane's input orientation.
    const int main_lane = group_lane + main_target(orientation, g.shift, num_o);
    const int side_lane = group_lane + neighbour_target(orientation, g.shift, num_o, opt.legacy);
    const acc_t keep = acc_t(1) - g.frac;
    const scalar_t* grad_chunk = grad + (k * channels + chunk_start) * bins;
    const int64_t image_words = static_cast<int64_t>(n) * height * width * channels;
    scratch_t* lane_scratch = scratch + layout.word_offset[l] + image_words + chunk_start + lane;
    // Gradient reaching this lane's input channel from bin `slot` of the loaded tile (the CPU
    // kernel's expression); 0 on idle lanes. All lanes must call it (shuffles).
    auto source_grad = [&](int slot) {
      const acc_t v = active ? static_cast<acc_t>(tile.get(lane, slot)) : acc_t(0);
      const acc_t main = __shfl_sync(kFullWarpMask, v, main_lane);
      const acc_t side = __shfl_sync(kFullWarpMask, v, side_lane);
      return (keep * main + g.frac * side) / g.count;
    };
    for (int tile_first = 0; tile_first < bins; tile_first += kWarp) {
      const int tile_bins = min(kWarp, bins - tile_first);
      tile.load(grad_chunk + tile_first, chunk_channels, tile_bins, bins, lane);
      if constexpr (kGrid > 0) {
        constexpr int kBinsPerPass = kWarp / kSamples;
        static_assert(kWarp % kBinsPerPass == 0, "a pass of bins must not straddle two tiles");
        for (int first = tile_first; first < tile_first + tile_bins; first += kBinsPerPass) {
          compute_shared_taps<kGrid, scratch_t>(g, first, bins, opt.out_w, height, width,
                                                channels, lane, taps);
          __syncwarp();
          const int pass_bins = min(kBinsPerPass, tile_first + tile_bins - first);
          for (int j = 0; j < pass_bins; ++j) {
            const acc_t grad_j = source_grad(first - tile_first + j);
            const bool write = active && grad_j != acc_t(0);
            if (!__any_sync(kFullWarpMask, write)) continue;
            shared_taps_bin_scatter<kSamples>(taps + j * kSamples, lane_scratch, grad_j, write,
                                              scale);
          }
          __syncwarp();  // the next pass rewrites the taps
        }
      } else {
        for (int slot = 0; slot < tile_bins; ++slot) {
          const int bin = tile_first + slot;
          const acc_t grad_j = source_grad(slot);
          const bool write = active && grad_j != acc_t(0);
          if (!__any_sync(kFullWarpMask, write)) continue;
          any_grid_bin_scatter(g, bin / opt.out_w, bin % opt.out_w, height, width, lane_scratch,
                               static_cast<int64_t>(channels), grad_j, write, scale);
        }
      }
    }
  }
}

// nO > 32: one thread per (group, RoI, bin, input orientation j), scattering into a scratch laid
// out [level][n][group][pixel][j] so that the nO threads of one bin hit nO adjacent words.
template <typename scalar_t, bool kFixedPoint>
__global__ void __launch_bounds__(kThreads)
backward_any_orientations_kernel(const scalar_t* __restrict__ grad,
                                 const scalar_t* __restrict__ rois,
                                 const int64_t* __restrict__ roi_levels, int64_t num_rois,
                                 int groups, int batch_size,
                                 LevelLayout<at::opmath_type<scalar_t>> layout, KernelOptions opt,
                                 ScratchType<scalar_t, kFixedPoint>* __restrict__ scratch,
                                 const double* __restrict__ bound) {
  using acc_t = at::opmath_type<scalar_t>;
  const double scale = kFixedPoint ? fixed_point_scale(*bound) : 1.0;
  const int bins = opt.out_h * opt.out_w, num_o = opt.num_orientations;
  const int64_t channels = static_cast<int64_t>(groups) * num_o;
  const int64_t total = static_cast<int64_t>(groups) * num_rois * bins * num_o;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int j = static_cast<int>(i % num_o);
    const int64_t rest = i / num_o;
    const int bin = static_cast<int>(rest % bins);
    const int64_t k = (rest / bins) % num_rois;
    const int c = static_cast<int>(rest / (static_cast<int64_t>(bins) * num_rois));
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, layout.count, batch_size, &l, &n)) continue;
    const int height = layout.height[l], width = layout.width[l];
    const auto g = riroi_geometry<scalar_t, acc_t>(roi, layout.spatial_scale[l], opt.out_h,
                                                   opt.out_w, opt.num_samples, num_o, opt.clockwise);
    // Input orientation j feeds two outputs of this bin.
    const scalar_t* grad_bin = grad + (k * channels + static_cast<int64_t>(c) * num_o) * bins + bin;
    const acc_t main = static_cast<acc_t>(grad_bin[main_target(j, g.shift, num_o) * bins]);
    const acc_t side = static_cast<acc_t>(grad_bin[neighbour_target(j, g.shift, num_o, opt.legacy) * bins]);
    const acc_t grad_j = ((acc_t(1) - g.frac) * main + g.frac * side) / g.count;
    if (grad_j == acc_t(0)) continue;
    const int64_t plane = static_cast<int64_t>(height) * width;
    const int64_t base =
        layout.word_offset[l] + (static_cast<int64_t>(n) * groups + c) * plane * num_o + j;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        BilinearTaps<acc_t> t;
        if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (t.weight[q] == acc_t(0)) continue;  // border clamps give zero-weight taps
          scratch_add(scratch + base + static_cast<int64_t>(t.offset[q]) * num_o,
                      t.weight[q] * grad_j, scale);
        }
      }
    }
  }
}

// nO > 32: scratch [level][n][group][pixel][j] -> gradient[level] (N, C, H, W); one thread per
// (level, n, group, pixel) reads its nO contiguous words and writes nO coalesced rows.
template <typename scalar_t, typename scratch_t, typename Convert>
__global__ void __launch_bounds__(kThreads)
group_scratch_to_gradients_kernel(const scratch_t* __restrict__ scratch,
                                  LevelLayout<at::opmath_type<scalar_t>> layout,
                                  GradientLevels<scalar_t> gradients, int num_o, Convert convert) {
  convert.prepare();
  const int64_t total = layout.word_offset[layout.count] / num_o;
  REDET_CUDA_GRID_STRIDE(u, total) {
    int l = 0;
    while (l + 1 < layout.count && u * num_o >= layout.word_offset[l + 1]) ++l;
    const int64_t plane = static_cast<int64_t>(layout.height[l]) * layout.width[l];
    const int64_t local = u - layout.word_offset[l] / num_o;
    const int64_t image_group = local / plane, pixel = local % plane;
    scalar_t* out = gradients.data[l] + image_group * num_o * plane + pixel;
    const scratch_t* in = scratch + u * num_o;
    for (int j = 0; j < num_o; ++j) out[j * plane] = convert(in[j]);
  }
}
// ------------------------------------------ host side ------------------------------------------
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

// The backward's kernels for one dtype: the scatter into the zeroed scratch, then its conversion
// into every level's (N, C, H, W) gradient.
template <typename scalar_t>
struct BackwardLaunch {
  const scalar_t* grad;
  const scalar_t* rois;
  const int64_t* roi_levels;
  int64_t num_rois, channels, batch_size;
  LevelLayout<at::opmath_type<scalar_t>> layout;
  KernelOptions opt;
  cudaStream_t stream;

  template <bool kFixedPoint, typename Convert>
  void run(ScratchType<scalar_t, kFixedPoint>* scratch, const double* bound,
           const std::vector<at::Tensor>& gradients, const GradientLevels<scalar_t>& outputs,
           Convert convert) const {
    const int num_o = opt.num_orientations;
    if (num_o <= kWarp) {  // channels-last scatter, scratch [level][n][pixel][C]
      scatter_channels_last<kFixedPoint>(scratch, bound);
      for (int l = 0; l < layout.count; ++l) {
        channels_last_to_nchw<scalar_t>(scratch + layout.word_offset[l], gradients[l], convert,
                                        stream);
      }
    } else {  // scratch [level][n][group][pixel][j]
      const int64_t threads = channels * num_rois * opt.out_h * opt.out_w;
      backward_any_orientations_kernel<scalar_t, kFixedPoint>
          <<<blocks_for(threads), kThreads, 0, stream>>>(
              grad, rois, roi_levels, num_rois, static_cast<int>(channels / num_o),
              static_cast<int>(batch_size), layout, opt, scratch, bound);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      group_scratch_to_gradients_kernel<scalar_t>
          <<<blocks_for(layout.word_offset[layout.count] / num_o), kThreads, 0, stream>>>(
              scratch, layout, outputs, num_o, convert);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  template <bool kFixedPoint>
  void scatter_channels_last(ScratchType<scalar_t, kFixedPoint>* scratch,
                             const double* bound) const {
    constexpr int threads = kWarp * channels_last_warps_per_block<scalar_t>();
    const int lanes = chunk_lanes(opt.num_orientations);
    const int64_t warps = num_rois * ((channels + lanes - 1) / lanes);
    const int blocks = blocks_for(warps * kWarp, threads);
    const int c = static_cast<int>(channels), n = static_cast<int>(batch_size);
    if (opt.num_samples == 2) {  // ReDet's setting: the unrolled 2 x 2 grid
      backward_channels_last_kernel<scalar_t, kFixedPoint, 2><<<blocks, threads, 0, stream>>>(
          grad, rois, roi_levels, num_rois, c, n, layout, opt, scratch, bound);
    } else {
      backward_channels_last_kernel<scalar_t, kFixedPoint, 0><<<blocks, threads, 0, stream>>>(
          grad, rois, roi_levels, num_rois, c, n, layout, opt, scratch, bound);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

at::Tensor forward_levels(at::TensorList features_, const at::Tensor& rois_,
                          const at::Tensor& levels_, at::ArrayRef<double> scales,
                          const RiRoIOptions& opt, const char* name, const char* op) {
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

// grad_output, the options, levels and sizes are checked by the op entry points
// (riroi_align_rotated_ops.h).
std::vector<at::Tensor> backward_levels(const at::Tensor& grad_, const at::Tensor& rois_,
                                        const at::Tensor& levels_, at::ArrayRef<double> scales,
                                        const RiRoIOptions& opt, int64_t batch_size,
                                        int64_t channels, at::IntArrayRef heights,
                                        at::IntArrayRef widths, const char* op) {
  const size_t num_levels = heights.size();
  c10::cuda::CUDAGuard guard(grad_.device());
  const auto grad = grad_.contiguous();  // the peer reads a non-contiguous grad wrongly
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  std::vector<at::Tensor> gradients;
  for (size_t l = 0; l < num_levels; ++l) {
    gradients.push_back(at::empty({batch_size, channels, heights[l], widths[l]}, grad.options()));
  }
  if (grad.numel() == 0) {
    for (auto& g : gradients) g.zero_();
    return gradients;
  }
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const auto acc_dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t* roi_levels = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  const auto kopt = kernel_options(opt);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(),
                                  "riroi_align_rotated_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    LevelLayout<acc_t> layout{};
    GradientLevels<scalar_t> outputs{};
    layout.count = static_cast<int>(num_levels);
    for (size_t l = 0; l < num_levels; ++l) {
      layout.height[l] = static_cast<int>(heights[l]);
      layout.width[l] = static_cast<int>(widths[l]);
      layout.spatial_scale[l] = static_cast<acc_t>(scales[l]);
      layout.word_offset[l + 1] = layout.word_offset[l] + gradients[l].numel();
      outputs.data[l] = gradients[l].data_ptr<scalar_t>();
    }
    const BackwardLaunch<scalar_t> launch{grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(),
                                          roi_levels, rois.size(0), channels, batch_size,
                                          layout, kopt, stream};
    if (deterministic) {
      auto scratch = at::zeros({layout.word_offset[num_levels]}, grad.options().dtype(at::kLong));
      auto bound = grad.abs().sum(at::kDouble);
      const double* bound_data = bound.data_ptr<double>();
      launch.template run<true>(reinterpret_cast<long long*>(scratch.data_ptr<int64_t>()),
                                bound_data, gradients, outputs, FixedPointTo<scalar_t>{bound_data});
    } else {
      auto scratch = at::zeros({layout.word_offset[num_levels]}, grad.options().dtype(acc_dtype));
      launch.template run<false>(scratch.data_ptr<acc_t>(), nullptr, gradients, outputs,
                                 CastTo<scalar_t>{});
    }
  });
  return gradients;
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, CUDA, m) {
  register_riroi_kernels<&forward_levels, &backward_levels>(m);
}

}  // namespace redet
