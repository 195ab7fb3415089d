// Channels-last gathers: one warp lane per channel, so the 32 lanes of a warp read 32 adjacent
// words of a (N, H, W, C) feature map (one coalesced request) at every sample point. Their outputs
// are (K, C, bins) with bins contiguous, so a lane's results are `bins` words apart: the warp
// collects a tile of up to 32 channels (or 32 x the channels a lane owns) x kBins bins in shared
// memory and stores it in the output's own order (adjacent words per request instead of 32
// scattered ones). The backward scatters read their grad_output the same way in reverse: load() a
// tile in the array's order, get() a lane's channel.
#pragma once
#include <cstdint>

namespace redet {

constexpr int kWarp = 32;
constexpr unsigned kFullWarpMask = 0xffffffffu;

// kBins: bins a tile holds (32 by default). A kernel whose warps produce a few bins at a time
// (RoIPool: one row of 7) takes a narrow tile, so that a full SM's worth of warps fits in shared memory.
// kChannels: channel rows (32 by default, one per lane); a kernel whose lanes own several adjacent
// channels (RoIPool's 2 channels per lane) takes 32 * that many rows.
template <typename scalar_t, int kBins = kWarp, int kChannels = kWarp>
struct ChannelTile {
  static_assert(kBins >= 1 && kBins <= kWarp, "ChannelTile holds 1 to 32 bins");
  static_assert(kChannels >= 1, "ChannelTile holds at least one channel");
  // Row length, odd: put() writes one column (32 rows), which then falls in 32 different banks.
  // (With 2 rows per lane and 4-byte elements the lanes' rows are 2 * kRow words apart: 2-way
  // conflicts on put, a few per bin against the bin's dozens of loads.)
  static constexpr int kRow = kBins | 1;

  scalar_t (*cell)[kRow];  // [channel in chunk][bin in tile]

  // Elements of one warp's tile; the kernel declares kWarps * elements() of shared memory.
  static constexpr int elements() { return kChannels * kRow; }

  __device__ explicit ChannelTile(scalar_t* warp_memory)
      : cell(reinterpret_cast<scalar_t (*)[kRow]>(warp_memory)) {}

  __device__ void put(int channel, int bin_in_tile, scalar_t value) {
    cell[channel][bin_in_tile] = value;
  }
  __device__ scalar_t get(int channel, int bin_in_tile) const { return cell[channel][bin_in_tile]; }

  // Stores the tile: out points at output[k][first channel][first bin of the tile]; `channels`
  // (<= kChannels) rows of `bins` valid bins, rows `channel_stride` words apart. Call from all
  // lanes of the warp.
  // The lanes walk the tile in the output's order (row by row, bins fastest), so a request covers
  // 32 adjacent words of a row or the end of one row and the start of the next; when the tile
  // holds whole rows (bins == channel_stride) the tile is one contiguous block.
  __device__ void store(scalar_t* out, int channels, int bins, int64_t channel_stride, int lane) {
    __syncwarp();
    if (bins > 0) {
      int c = lane / bins, b = lane - c * bins;  // this lane's element c * bins + b, then 32 further
      const int dc = kWarp / bins, db = kWarp - dc * bins;
      while (c < channels) {
        out[c * channel_stride + b] = cell[c][b];
        c += dc;
        b += db;
        if (b >= bins) {
          b -= bins;
          ++c;
        }
      }
    }
    __syncwarp();  // the tile is reused for the next bins
  }

  // The inverse of store(): fills the tile from in[c * channel_stride + b] (c < channels,
  // b < bins), the lanes walking the array in its own order (adjacent words per request). Call
  // from all lanes of the warp; get() may follow at once.
  __device__ void load(const scalar_t* __restrict__ in, int channels, int bins,
                       int64_t channel_stride, int lane) {
    __syncwarp();  // the previous tile's readers are done
    if (bins > 0) {
      int c = lane / bins, b = lane - c * bins;
      const int dc = kWarp / bins, db = kWarp - dc * bins;
      while (c < channels) {
        cell[c][b] = in[c * channel_stride + b];
        c += dc;
        b += db;
        if (b >= bins) {
          b -= bins;
          ++c;
        }
      }
    }
    __syncwarp();
  }
};

}  // namespace redet
