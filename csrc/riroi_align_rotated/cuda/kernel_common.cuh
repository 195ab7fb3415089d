// What RiRoIAlignRotated's forward and backward kernels share: the options, the per-row check, the
// RoI's geometry at its level, and the set-up of the channels-last kernels (a thread's lane in its
// channel chunk, a work item's RoI and channels, the warp's ChannelTile).
#pragma once
#include <ATen/OpMathType.h>

#include "common/cuda/channel_tile.cuh"
#include "common/roi_rows.h"
#include "riroi_align_rotated/riroi_align_rotated.h"
#include "riroi_align_rotated/riroi_align_rotated_math.h"

namespace redet {

struct KernelOptions {
  int out_h, out_w, num_samples, num_orientations;
  bool clockwise, legacy;
};

inline KernelOptions kernel_options(const RiRoIOptions& o) {
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

// RoI k's level and image, the map's size there and the RoI's geometry on it.
template <typename acc_t>
struct LevelRoi {
  int level, image, height, width;
  RiRoIGeometry<acc_t> g;
};

// RoI k at its level (levels: the forward's FeatureLevels or the backward's LevelLayout); false for
// a row that breaks the rules (roi_level_and_image). kGrid > 0: the fixed grid of the channels-last
// kernels (num_samples == kGrid, equal already), set as compile-time constants so that the compiler
// folds the divisions by the grid into exact multiplications.
template <int kGrid, typename scalar_t, typename Levels>
__device__ __forceinline__ bool level_roi(const Levels& levels, const scalar_t* rois,
                                          const int64_t* roi_levels, int64_t k, int batch_size,
                                          const KernelOptions& opt,
                                          LevelRoi<at::opmath_type<scalar_t>>* r) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* roi = rois + k * 6;
  if (!roi_level_and_image(roi, roi_levels, k, levels.count, batch_size, &r->level, &r->image)) {
    return false;
  }
  r->height = levels.height[r->level];
  r->width = levels.width[r->level];
  r->g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[r->level], opt.out_h, opt.out_w,
                                         opt.num_samples, opt.num_orientations, opt.clockwise);
  if constexpr (kGrid > 0) {
    r->g.grid_h = r->g.grid_w = kGrid;
    r->g.count = acc_t(kGrid * kGrid);
  }
  return true;
}

// Work items (RoI, channel chunk) of the channels-last kernels go chunk-major: item = chunk *
// num_rois + RoI. The warps in flight then share one chunk's channels of every pixel (training
// shape: 2 x 256^2 pixels x 128 B = 17 MB, L2-resident) instead of all channels of the RoIs in
// flight, whose footprints far exceed L2 (RoI-major order would read the map from DRAM several
// times over). It matters most to the backward's atomics; the forward is bound by its L1/L2
// requests rather than by DRAM.
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

// Bytes of a channels-last block's ChannelTiles (one per warp). The kernels declare them as raw
// bytes: c10::Half / BFloat16 have constructors, which __shared__ arrays may not have.
template <typename scalar_t>
constexpr int channels_last_tile_bytes() {
  return channels_last_warps_per_block<scalar_t>() * ChannelTile<scalar_t>::elements() *
         sizeof(scalar_t);
}

// This warp's ChannelTile in the block's tile bytes.
template <typename scalar_t>
__device__ __forceinline__ ChannelTile<scalar_t> warp_tile(unsigned char* tile_memory, int warp) {
  return ChannelTile<scalar_t>(reinterpret_cast<scalar_t*>(tile_memory) +
                               warp * ChannelTile<scalar_t>::elements());
}

// A thread of a channels-last kernel: one warp per work item, lane = channel of the item's chunk.
struct ChunkLane {
  int lane, warp;               // in the block
  int lanes, chunks;            // channels of a chunk (chunk_lanes), chunks of a RoI
  int orientation, group_lane;  // its channel's orientation; the lane of orientation 0 of its group
};

__device__ __forceinline__ ChunkLane chunk_lane(int channels, int num_orientations) {
  ChunkLane c;
  c.lane = threadIdx.x % kWarp;
  c.warp = threadIdx.x / kWarp;
  c.lanes = chunk_lanes(num_orientations);
  c.chunks = (channels + c.lanes - 1) / c.lanes;
  c.orientation = c.lane % num_orientations;
  c.group_lane = c.lane - c.orientation;
  return c;
}

// The RoI and channels of work item `roi_item` (chunk-major: chunk_of_item).
struct ChunkItem {
  int64_t k;           // the RoI
  int chunk_start;     // its first channel
  int chunk_channels;  // its channels: lanes, or fewer in the last chunk
  bool active;         // this lane has a channel
};

__device__ __forceinline__ ChunkItem chunk_item(int64_t roi_item, int64_t num_rois, int channels,
                                                const ChunkLane& c) {
  ChunkItem it;
  it.k = roi_item % num_rois;
  it.chunk_start = chunk_of_item(roi_item, num_rois) * c.lanes;
  it.chunk_channels = min(c.lanes, channels - it.chunk_start);
  it.active = c.lane < it.chunk_channels;
  return it;
}

}  // namespace redet
