// Channels-last gathers: one warp lane per channel, so the 32 lanes of a warp read 32 adjacent
// words of a (N, H, W, C) feature map (one coalesced request) at every sample point. Their outputs
// are (K, C, bins) with bins contiguous, so a lane's results are `bins` words apart: the warp
// collects a tile of up to 32 channels x 32 bins in shared memory and stores it in the output's
// own order (32 adjacent words per request instead of 32 scattered ones).
#pragma once
#include <cstdint>

namespace redet {

constexpr int kWarp = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

template <typename scalar_t>
struct ChannelTile {
  scalar_t (*cell)[kWarp + 1];  // [channel lane][bin in tile]; +1 spreads a column over the banks

  // Elements of one warp's tile; the kernel declares kWarps * elements() of shared memory.
  static constexpr int elements() { return kWarp * (kWarp + 1); }

  __device__ explicit ChannelTile(scalar_t* warp_memory)
      : cell(reinterpret_cast<scalar_t (*)[kWarp + 1]>(warp_memory)) {}

  __device__ void put(int lane, int bin_in_tile, scalar_t value) { cell[lane][bin_in_tile] = value; }

  // Stores the tile: out points at output[k][first channel][first bin of the tile]; `channels`
  // rows of `bins` valid bins, rows `channel_stride` words apart. Call from all lanes of the warp.
  // The lanes walk the tile in the output's order (row by row, bins fastest), so a request covers
  // 32 adjacent words of a row or the end of one row and the start of the next; when the tile
  // holds whole rows (bins == channel_stride) the tile is one contiguous block.
  __device__ void store(scalar_t* out, int channels, int bins, int64_t channel_stride, int lane) {
    __syncwarp();
    const int total = channels * bins;
    for (int i = lane; i < total; i += kWarp) {
      const int c = i / bins, b = i - c * bins;
      out[c * channel_stride + b] = cell[c][b];
    }
    __syncwarp();  // the tile is reused for the next bins
  }
};

}  // namespace redet
