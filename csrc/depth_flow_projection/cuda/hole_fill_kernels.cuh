// Hole filling of the depth-aware flow projection on CUDA: the two kernels of the forward's fill.
// The semantics (each hole: the mean of the nearest non-holes to its left, right, top and bottom,
// added in that order) and all arithmetic are the shared functions of
// depth_flow_projection_math.h, as on the CPU, so the results are the CPU's bit for bit wherever
// the projected sums are exact in any order (corner_sums.cuh). Only the search for the neighbours differs.
//
// Design, and why. The CPU's two sweeps (a row pass storing left + right in each hole's slot, then
// a column pass adding top + bottom) would make each pass a chain of dependent loads behind its
// own stores, with one block per 32-column strip for the column pass. Here the marking costs
// what plain normalisation costs, and nothing is stored into the accumulators, so every hole's
// loads are independent:
//   1. mark_tiles_kernel: a warp normalises a 32 x 32 tile (lane = column, 32 rows; a hole gets
//      0, 0, 0 for now) from the corner sums (corner_sums.cuh) and writes two 1-bit masks of its
//      non-holes (HoleMasks): row words (one per 32-pixel chunk of a row, a ballot per row) and
//      column words (one per 32-row chunk of a column, the tile's 32 row words bit-transposed),
//      and sets the summary bit of each word that has a non-hole. On small images four warps
//      share a tile, 8 rows each, and OR their bits into its column words.
//   2. fill_holes_kernel: a warp per row chunk; each hole lane finds its nearest non-holes in the
//      row words (left, right) and the column words (top, bottom) - in the word it starts in, or
//      through the summaries, which skip 1024 pixels per load (a half-empty 4K image has runs of
//      ~2000 holes) - then reads the four values together and writes the mean.
// Non-holes cost one read of the accumulators and one write of output and count (as in plain
// normalisation) plus a few bits; the rest scales with the holes. The fill reads the neighbours'
// outputs as stored (depth_flow_projection_math.h: as_fill_input; for fp16/bf16, 2-byte values rounded to 16
// bits), except for float output in fixed point (deterministic mode), whose sums are double:
// there the marking also writes a double copy of each non-hole's value (keeps_unrounded_copy),
// which the fill reads, so that float output is filled from the unrounded values as in the
// other paths.
#pragma once
#include <stdint.h>

#include <type_traits>
#include <utility>

#include "common/cuda_utils.cuh"
#include "depth_flow_projection/cuda/corner_sums.cuh"
#include "depth_flow_projection/depth_flow_projection_math.h"

namespace redet {

constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;

// 32-pixel chunks of a row or 32-row chunks of a column (words of a line of bits).
__host__ __device__ inline int chunks_of(int length) { return (length + kWarp - 1) / kWarp; }

// The fill's non-hole bits (row-major layouts, chunk = x / 32, row chunk = y / 32; column layouts
// put neighbouring columns side by side, so a warp's accesses coalesce):
//   row words (b, y, chunk), column words (b, row chunk, x), and their summaries: row summary
//   (b, y, chunk / 32), bit chunk % 32, column summary (b, row chunk / 32, x), bit row chunk % 32,
//   set when that word has a non-hole. All must be zero before mark_tiles_kernel, which ORs the
//   column words and the summaries in.
struct HoleMasks {
  uint32_t* row_words;
  uint32_t* column_words;
  uint32_t* row_summary;
  uint32_t* column_summary;

  // 32-bit words needed for an image batch (words and summaries).
  static int64_t word_count(int64_t batch, int height, int width) {
    return batch * (static_cast<int64_t>(height) * chunks_of(width) +
                    static_cast<int64_t>(chunks_of(height)) * width +
                    static_cast<int64_t>(height) * chunks_of(chunks_of(width)) +
                    static_cast<int64_t>(chunks_of(chunks_of(height))) * width);
  }
  static HoleMasks in(uint32_t* words, int64_t batch, int height, int width) {
    uint32_t* column_words = words + batch * height * chunks_of(width);
    uint32_t* row_summary = column_words + batch * chunks_of(height) * width;
    uint32_t* column_summary = row_summary + batch * height * chunks_of(chunks_of(width));
    return {words, column_words, row_summary, column_summary};
  }
};

// ---- 1. normalise and mark --------------------------------------------------------------------

// Does the fill need a copy of the non-holes' unrounded values beside the output? Only where the
// output type is neither the calc type nor filled from as stored: float output of double sums
// (fixed point). fp16/bf16 are filled from their stored outputs (depth_flow_projection_math.h).
template <typename scalar_t, typename calc_t>
constexpr bool keeps_unrounded_copy =
    !std::is_same_v<scalar_t, calc_t> && !fills_from_rounded_outputs<scalar_t>;

// That copy: the projected values of the non-holes, (x, y) of pixel i side by side (calc_t is
// double wherever it is kept).
__device__ __forceinline__ void store_exact(double* exact, int64_t i, double x, double y) {
  reinterpret_cast<double2*>(exact)[i] = make_double2(x, y);
}
__device__ __forceinline__ NeighbourValue<double> load_exact(const double* exact, int64_t i) {
  const double2 v = reinterpret_cast<const double2*>(exact)[i];
  return {true, v.x, v.y};
}

constexpr int kMarkRowsPerStep = 8;  // rows whose loads a warp has in flight together

// A 32x32 bit matrix, lane r holding row r (bit c: column c), transposed: lane c gets column c
// (bit r: row r). Five butterfly stages; stage j swaps the off-diagonal j x j blocks.
__device__ __forceinline__ uint32_t transpose_bits(uint32_t x, int lane) {
  uint32_t m = 0x0000ffffu;  // the bits whose index has bit j clear
#pragma unroll
  for (int j = 16; j > 0; j >>= 1, m ^= m << j) {
    const uint32_t y = __shfl_xor_sync(kAllLanes, x, j);
    x = (lane & j) ? (x & ~m) | ((y & ~m) >> j) : (x & m) | ((y & m) << j);
  }
  return x;
}

// Warp = `32 / warps_per_tile` rows (32 or 8) of a tile (b, 32 rows, 32 columns), lane = column;
// grid-stride over the tiles' parts. Each warp ORs its rows' bits into the tile's column words.
template <typename scalar_t, typename count_t, typename Slots>
__global__ void mark_tiles_kernel(Slots slots_arg, int64_t batch, int height, int width,
                                  int warps_per_tile, scalar_t* __restrict__ out,
                                  count_t* __restrict__ count, HoleMasks masks,
                                  typename Slots::calc_type* __restrict__ exact) {
  using calc_t = typename Slots::calc_type;
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kWarp;
  const int chunks = chunks_of(width), row_chunks = chunks_of(height);
  const int rows_per_warp = kWarp / warps_per_tile;
  const int64_t parts = batch * row_chunks * chunks * warps_per_tile;
  const int64_t plane = static_cast<int64_t>(height) * width;
  REDET_CUDA_WARP_STRIDE(part, parts) {
    const int64_t tile = part / warps_per_tile;
    const int first = static_cast<int>(part - tile * warps_per_tile) * rows_per_warp;  // in tile
    const int chunk = static_cast<int>(tile % chunks);
    const int64_t image_rows = tile / chunks;  // b · row_chunks + row chunk
    const int64_t b = image_rows / row_chunks;
    const int row_chunk = static_cast<int>(image_rows - b * row_chunks);
    const int tile_y0 = row_chunk * kWarp;
    const int y0 = tile_y0 + first;
    if (y0 >= height) continue;  // (warp-uniform)
    const int x = chunk * kWarp + lane;
    const int64_t image = b * plane;
    // Row pair sums of the row above this warp's rows (corner_sums.cuh), then of each row in turn:
    // lane = column, its left corner from the lane before (lane 0 loads its own).
    const int64_t row_above = image + static_cast<int64_t>(y0 - 1) * width;
    Sums<calc_t> above = y0 > 0 && x < width ? row_pair_sums<calc_t>(slots, row_above, x, width)
                                             : no_sums<calc_t>();
    uint32_t my_row_word = 0;  // lane r: the non-hole bits of row tile_y0 + r, if it is this warp's
    for (int r0 = 0; r0 < rows_per_warp && y0 + r0 < height; r0 += kMarkRowsPerStep) {
      Sums<calc_t> here[kMarkRowsPerStep], left_of_warp[kMarkRowsPerStep];
#pragma unroll
      for (int k = 0; k < kMarkRowsPerStep; ++k) {
        here[k] = left_of_warp[k] = no_sums<calc_t>();
        const int y = y0 + r0 + k;
        const int64_t row = image + static_cast<int64_t>(y) * width;
        if (y < height && x < width) here[k] = corner_at<calc_t>(slots, row + x);
        if (y < height && lane == 0 && x > 0) {
          left_of_warp[k] = corner_at<calc_t>(slots, row + x - 1);
        }
      }
#pragma unroll
      for (int k = 0; k < kMarkRowsPerStep; ++k) {
        const int y = y0 + r0 + k;
        if (y >= height) break;  // (warp-uniform)
        Sums<calc_t> left{__shfl_up_sync(kAllLanes, here[k].x, 1),
                          __shfl_up_sync(kAllLanes, here[k].y, 1),
                          __shfl_up_sync(kAllLanes, here[k].c, 1)};
        if (lane == 0) left = left_of_warp[k];
        const Sums<calc_t> row_pair = pair_sum(left, here[k], x == width - 1);
        const Sums<calc_t> s = pair_sum(above, row_pair, y == height - 1);  // = pixel_sums()
        above = row_pair;
        const auto p = project_slot<count_t>(s.x, s.y, s.c);  // past the row: a hole
        if (x < width) {
          const int64_t i = image + static_cast<int64_t>(y) * width + x;
          out[i + b * plane] = static_cast<scalar_t>(p.x);  // (b, 0, y, x) of the output
          out[i + b * plane + plane] = static_cast<scalar_t>(p.y);
          count[i] = p.count;
          if constexpr (keeps_unrounded_copy<scalar_t, calc_t>) {
            if (p.valid) store_exact(exact, i, p.x, p.y);
          }
        }
        const uint32_t word = __ballot_sync(kAllLanes, p.valid && x < width);
        if (lane == first + r0 + k) my_row_word = word;
      }
    }
    const bool my_row_is_here = lane >= first && lane < first + rows_per_warp;
    if (my_row_is_here && tile_y0 + lane < height) {
      const int64_t image_row = b * height + tile_y0 + lane;
      masks.row_words[image_row * chunks + chunk] = my_row_word;
      if (my_row_word != 0) {
        atomicOr(&masks.row_summary[image_row * chunks_of(chunks) + chunk / kWarp],
                 1u << (chunk % kWarp));
      }
    }
    // Lane c: column c's bits of this warp's rows (other rows' bits 0).
    const uint32_t my_column_bits = transpose_bits(my_row_word, lane);
    if (x < width && my_column_bits != 0) {
      atomicOr(&masks.column_words[(b * row_chunks + row_chunk) * width + x], my_column_bits);
      atomicOr(&masks.column_summary[(b * chunks_of(row_chunks) + row_chunk / kWarp) * width + x],
               1u << (row_chunk % kWarp));
    }
  }
}

// ---- 2. fill ------------------------------------------------------------------------------------

// A line of bits (a row or a column of the masks): word w at words[w·stride], `count` words, and
// its summary (bit w % 32 of summary[(w / 32)·stride]: word w is not 0). Bits past the line's end
// are never set, so searches stop there.
struct BitLine {
  const uint32_t* words;
  const uint32_t* summary;
  int64_t stride;
  int count;
};

// The nearest set bit before / after position p of the line, word p / 32 being `first` (already
// loaded); -1 if there is none. Past the first word, the summary finds the word to look in.
__device__ __forceinline__ int nearest_bit_before(const BitLine& line, uint32_t first, int p) {
  const uint32_t bits = first & ((1u << (p % kWarp)) - 1u);
  if (bits != 0) return p / kWarp * kWarp + highest_set_bit(bits);
  const int w = p / kWarp;
  int s = w / kWarp;
  uint32_t words_set = line.summary[s * line.stride] & ((1u << (w % kWarp)) - 1u);
  while (words_set == 0) {
    if (--s < 0) return -1;
    words_set = line.summary[s * line.stride];
  }
  const int found = s * kWarp + highest_set_bit(words_set);
  return found * kWarp + highest_set_bit(line.words[found * line.stride]);
}

__device__ __forceinline__ int nearest_bit_after(const BitLine& line, uint32_t first, int p) {
  const uint32_t bits = first & ~((2u << (p % kWarp)) - 1u);  // (2u << 31 == 0)
  if (bits != 0) return p / kWarp * kWarp + lowest_set_bit(bits);
  const int w = p / kWarp;
  const int summary_count = chunks_of(line.count);
  int s = w / kWarp;
  uint32_t words_set = line.summary[s * line.stride] & ~((2u << (w % kWarp)) - 1u);
  while (words_set == 0) {
    if (++s >= summary_count) return -1;
    words_set = line.summary[s * line.stride];
  }
  const int found = s * kWarp + lowest_set_bit(words_set);
  return found * kWarp + lowest_set_bit(line.words[found * line.stride]);
}

// The fill's input from the non-hole (x, y) of the image whose output starts at out_x, pixels at
// `image` (x < 0: none in that direction). mark_tiles_kernel stored static_cast<scalar_t>(value),
// so the output converted back is as_fill_input(value) (depth_flow_projection_math.h) without rounding it
// again; where keeps_unrounded_copy, the copy in `exact` is.
template <typename calc_t, typename scalar_t>
__device__ __forceinline__ NeighbourValue<calc_t> neighbour_value(const scalar_t* out_x,
                                                                  const calc_t* exact,
                                                                  int64_t plane, int64_t image,
                                                                  int x, int y, int width) {
  if (x < 0) return {false, calc_t(0), calc_t(0)};
  const int64_t j = static_cast<int64_t>(y) * width + x;
  if constexpr (keeps_unrounded_copy<scalar_t, calc_t>) {
    return load_exact(exact, image + j);
  } else {
    return {true, static_cast<calc_t>(out_x[j]), static_cast<calc_t>(out_x[j + plane])};
  }
}

// Warp = one 32-pixel chunk of a row, lane = pixel; grid-stride over batch·height·chunks. Only
// holes do any work past reading the chunk's row word.
template <typename scalar_t, typename count_t, typename Slots>
__global__ void fill_holes_kernel(Slots /*only its calc_type*/, HoleMasks masks, int64_t batch, int height,
                                  int width, scalar_t* __restrict__ out,
                                  count_t* __restrict__ count,
                                  const typename Slots::calc_type* __restrict__ exact) {
  using calc_t = typename Slots::calc_type;
  const int lane = threadIdx.x % kWarp;
  const int chunks = chunks_of(width), row_chunks = chunks_of(height);
  const int64_t total = batch * height * chunks;
  const int64_t plane = static_cast<int64_t>(height) * width;
  REDET_CUDA_WARP_STRIDE(item, total) {
    const int64_t image_row = item / chunks;  // b · height + y
    const int chunk = static_cast<int>(item - image_row * chunks);
    const int x = chunk * kWarp + lane;
    const uint32_t valid = masks.row_words[item];
    if (x >= width || ((valid >> lane) & 1u)) continue;  // not a hole (no shuffles below)
    const int64_t b = image_row / height;
    const int y = static_cast<int>(image_row - b * height);
    const BitLine row{masks.row_words + image_row * chunks,
                      masks.row_summary + image_row * chunks_of(chunks), 1, chunks};
    const BitLine column{masks.column_words + b * row_chunks * width + x,
                         masks.column_summary + b * chunks_of(row_chunks) * width + x, width,
                         row_chunks};
    const uint32_t column_word = column.words[static_cast<int64_t>(y / kWarp) * width];
    const int left = nearest_bit_before(row, valid, x);
    const int right = nearest_bit_after(row, valid, x);
    const int top = nearest_bit_before(column, column_word, y);
    const int bottom = nearest_bit_after(column, column_word, y);
    const int64_t image = b * plane;
    scalar_t* out_x = out + 2 * image;  // (b, 0, 0, 0) of the output
    const auto value_at = [&](int xn, int yn) {
      return neighbour_value<calc_t>(out_x, exact, plane, image, xn, yn, width);
    };
    const auto left_value = value_at(left, left >= 0 ? y : -1);
    const auto right_value = value_at(right, right >= 0 ? y : -1);
    const auto top_value = value_at(top >= 0 ? x : -1, top);
    const auto bottom_value = value_at(bottom >= 0 ? x : -1, bottom);
    // The CPU's order: left + right (its row pass), then top and bottom (finish_hole).
    HoleSum<calc_t> sum{calc_t(0), calc_t(0), 0};
    sum.add(left_value);
    sum.add(right_value);
    const int64_t j = static_cast<int64_t>(y) * width + x;
    finish_hole(sum, top_value, bottom_value, out_x + j, plane, count + image + j);
  }
}

}  // namespace redet
