// What RiRoIAlignRotated's forward and backward kernels share: the options, the per-row check and
// how (RoI, channel chunk) work items map onto warps.
#pragma once
#include <ATen/OpMathType.h>

#include "common/cuda/channel_tile.cuh"
#include "common/roi_rows.h"
#include "riroi_align_rotated/riroi_align_rotated.h"

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

}  // namespace redet
