// Channels-last gathers: one warp lane per channel, so the 32 lanes of a warp read 32 adjacent
// words of a (N, H, W, C) feature map (one coalesced request) at every sample point. Their outputs
// are (K, C, bins) with bins contiguous, so a lane's results are `bins` words apart: the warp
// collects a tile of up to 32 channels x 32 bins in shared memory and stores it one channel row at a
// time (32 adjacent words per request instead of 32 scattered ones).
#pragma once
#include <cstdint>

namespace redet {

constexpr int kWarp = 32;

template <typename scalar_t>
struct ChannelTile {
  scalar_t (*cell)[kWarp + 1];  // [channel lane][bin in tile]; +1 spreads a column over the banks

  // Shared memory for `warps` tiles; the kernel declares it, each warp takes its own tile.
  static constexpr int words_per_warp() { return kWarp * (kWarp + 1); }

  __device__ explicit ChannelTile(scalar_t* warp_memory)
      : cell(reinterpret_cast<scalar_t (*)[kWarp + 1]>(warp_memory)) {}

  __device__ void put(int lane, int bin_in_tile, scalar_t value) { cell[lane][bin_in_tile] = value; }

  // Stores the tile: out points at output[k][first channel][first bin of the tile]; `channels`
  // lanes and `bins` bins are valid; rows are `channel_stride` words apart. Call from all lanes.
  __device__ void store(scalar_t* out, int channels, int bins, int64_t channel_stride, int lane) {
    __syncwarp();
    if (lane < bins) {
      for (int c = 0; c < channels; ++c) out[c * channel_stride + lane] = cell[c][lane];
    }
    __syncwarp();  // the tile is reused for the next bins
  }
};

}  // namespace redet
