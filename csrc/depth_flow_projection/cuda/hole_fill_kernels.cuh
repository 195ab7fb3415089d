// Hole filling of the depth-aware flow projection on CUDA: the three kernels of the forward's fill.
// The semantics (row pass: left + right into each hole's slot; column pass: + top + bottom, the
// mean) and all arithmetic are the shared functions of common/flow_hole_fill.h, as on the CPU, so
// the results are the CPU's bit for bit. Only the search for each hole's neighbours differs.
//
// Design, and why. ncu at 4K on an H200 (the previous design: a row sweep per warp, then a column
// pass finding holes from the counts):
//   - column pass 159-167 us: 86 registers/thread, 20% achieved occupancy, 0.17 eligible warps per
//     scheduler, 77% of stalls waiting on L1TEX, DRAM at 7.8% (377 GB/s): latency-bound, each
//     thread loading 32 counts per 32-row word of its column;
//   - row pass 113 us at 2.06 TB/s (43% of DRAM) against 66 us for plain normalisation: each warp
//     swept its row segment as a chain of chunk loads.
// Holes are a few percent of the pixels, so neither pass should touch the non-holes' bytes more
// than plain normalisation does. Hence a 1-bit hole mask, written once, and searches on it:
//   1. mark_rows_kernel: elementwise, no chain of loads: normalises every pixel (a hole gets 0, 0,
//      0 for now) and stores one 32-bit word per 32-pixel chunk of a row, bit k set when pixel k
//      is not a hole (a warp ballot). Rows are padded to whole chunks, so a chunk is never split.
//   2. fill_row_holes_kernel: one block per row reads the row's mask words only (1/128 of its
//      accumulator bytes). A warp takes 32 words (1024 pixels) at a time: warp scans over the
//      words give each chunk the nearest non-holes outside it, the warps' first/last non-holes
//      are exchanged in shared memory, and each hole stores left + right (loads only for holes;
//      lane = chunk, so all the group's holes load together).
//   3. fill_column_holes_kernel: a warp owns 32 adjacent columns (one mask word per row) over a
//      segment of rows; a 32x32 bit transpose of 32 rows' words (5 shuffles) gives each lane its
//      column's 32-row mask, and each lane runs the shared run sweep (for_each_hole_run) over those
//      masks: a non-hole costs 1/32 of a 4-byte load. The nearest non-holes outside a segment come
//      through shared memory; each run of holes loads its two neighbours once and its holes'
//      partial sums a few at a time, so they are in flight together.
// So the non-holes cost one read of the accumulators and one write of output and count (as in
// plain normalisation) plus 2 bits; the rest scales with the holes.
#pragma once
#include <stdint.h>

#include <climits>

#include "common/flow_hole_fill.h"

namespace redet {

constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;

// 32-pixel chunks per row: the mask has one word per chunk, row-major, (b, y, chunk).
__host__ __device__ inline int chunks_of(int width) { return (width + kWarp - 1) / kWarp; }

// ---- 1. normalise and mark ------------------------------------------------------------------

constexpr int kMarkChunksPerStep = 2;  // chunks a warp loads before using any (loads in flight)

// a / b for 0 <= a, 0 < b: in 32 bits when both fit (64-bit division is a long subroutine, and
// this kernel divides per pixel).
__device__ __forceinline__ int64_t quotient(int64_t a, int64_t b) {
  if (a <= 0xffffffffll && b <= 0xffffffffll) {
    return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  }
  return a / b;
}

// Warp = chunk: lane k is pixel 32·chunk + k of its row. rows = batch·height.
template <typename scalar_t, typename count_t, typename Slots>
__global__ void mark_rows_kernel(Slots slots_arg, int64_t rows, int height, int width,
                                 scalar_t* __restrict__ out, count_t* __restrict__ count,
                                 uint32_t* __restrict__ valid_words) {
  using calc_t = typename Slots::calc_type;
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kWarp;
  const int chunks = chunks_of(width);
  const int64_t total = rows * chunks;
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t step = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarp;
       step < total; step += kMarkChunksPerStep * warps) {  // (warp-uniform)
    calc_t sx[kMarkChunksPerStep], sy[kMarkChunksPerStep], c[kMarkChunksPerStep];
    int64_t pixel[kMarkChunksPerStep];  // slot index (b·plane + y·width + x), -1 past the row
    int64_t image[kMarkChunksPerStep];  // b
#pragma unroll
    for (int k = 0; k < kMarkChunksPerStep; ++k) {
      const int64_t chunk = step + k * warps;
      const int64_t r = quotient(chunk, chunks);  // (b, y) of the chunk
      const int x = static_cast<int>(chunk - r * chunks) * kWarp + lane;
      pixel[k] = chunk < total && x < width ? r * width + x : -1;
      image[k] = quotient(r, height);
      sx[k] = sy[k] = c[k] = calc_t(0);
      if (pixel[k] >= 0) slots.load(pixel[k], &sx[k], &sy[k], &c[k]);
    }
#pragma unroll
    for (int k = 0; k < kMarkChunksPerStep; ++k) {
      const int64_t chunk = step + k * warps;
      if (chunk >= total) break;  // (warp-uniform)
      const auto p = project_slot<count_t>(sx[k], sy[k], c[k]);  // past the row: a hole
      if (pixel[k] >= 0) {
        const int64_t o = image[k] * plane + pixel[k];  // (b, 0, y, x) of the output
        out[o] = static_cast<scalar_t>(p.x);
        out[o + plane] = static_cast<scalar_t>(p.y);
        count[pixel[k]] = p.count;
      }
      const unsigned valid = __ballot_sync(kAllLanes, p.valid);
      if (lane == 0) valid_words[chunk] = valid;
    }
  }
}

// ---- 2. row pass: left + right ----------------------------------------------------------------

constexpr int kMaxRowWarps = 32;  // warps per row (block); a warp takes 32 words = 1024 pixels
constexpr int kNoPosition = INT_MAX;
// Holes a lane loads the neighbours of before storing any (8-byte values: one, else they spill
// under the 64 registers/thread of a 32-warp block).
template <typename calc_t>
constexpr int kRowHolesPerStep = sizeof(calc_t) == 4 ? 2 : 1;

// Inclusive scans over the lanes: max over lanes <= lane, min over lanes >= lane.
__device__ __forceinline__ int warp_prefix_max(int v, int lane) {
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const int o = __shfl_up_sync(kAllLanes, v, d);
    if (lane >= d) v = max(v, o);
  }
  return v;
}

__device__ __forceinline__ int warp_suffix_min(int v, int lane) {
#pragma unroll
  for (int d = 1; d < kWarp; d *= 2) {
    const int o = __shfl_down_sync(kAllLanes, v, d);
    if (lane + d < kWarp) v = min(v, o);
  }
  return v;
}

// The first non-hole in words [g·32, g·32 + 32) of the row (lane = word), or -1; warp-uniform.
__device__ __forceinline__ int first_non_hole_in_group(uint32_t v, int g) {
  const unsigned any = __ballot_sync(kAllLanes, v != 0);
  if (any == 0) return -1;
  const int lo = __ffs(any) - 1;
  return (g * kWarp + lo) * kWarp + lowest_set_bit(__shfl_sync(kAllLanes, v, lo));
}

// Row pass, one block per row (grid-stride over batch·height rows). Warp w takes the word groups
// [group_begin, group_end) of the row (32 words each), in order.
template <typename count_t, typename Slots>
__global__ void __launch_bounds__(kWarp * kMaxRowWarps) fill_row_holes_kernel(
    Slots slots_arg, const uint32_t* __restrict__ valid_words, int64_t rows, int width,
    count_t* __restrict__ count) {
  using calc_t = typename Slots::calc_type;
  __shared__ int segment_first[kMaxRowWarps], segment_last[kMaxRowWarps];
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int chunks = chunks_of(width);
  const int groups = (chunks + kWarp - 1) / kWarp;
  const int per_warp = (groups + warps - 1) / warps;
  const int group_begin = min(groups, warp * per_warp);
  const int group_end = min(groups, group_begin + per_warp);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint32_t* words = valid_words + r * chunks;
    const int64_t row = r * width;  // slot of (b, y, 0)
    auto valid_of = [&](int k) { return k < chunks ? words[k] : 0u; };  // non-hole bits of chunk k
    // 1. The first and last non-hole of this warp's groups, shared with the other warps.
    int first = -1, last = -1;
    for (int g = group_begin; g < group_end; ++g) {
      const uint32_t v = valid_of(g * kWarp + lane);
      const unsigned any = __ballot_sync(kAllLanes, v != 0);
      if (any == 0) continue;
      const int hi = kWarp - 1 - __clz(any);
      if (first < 0) first = first_non_hole_in_group(v, g);
      last = (g * kWarp + hi) * kWarp + highest_set_bit(__shfl_sync(kAllLanes, v, hi));
    }
    if (lane == 0) {
      segment_first[warp] = first;
      segment_last[warp] = last;
    }
    __syncthreads();
    int before = -1, after = -1;  // the nearest non-holes outside this warp's groups
    for (int w = warp - 1; w >= 0 && before < 0; --w) before = segment_last[w];
    for (int w = warp + 1; w < warps && after < 0; ++w) after = segment_first[w];
    __syncthreads();  // shared memory is reused by the next row
    // 2. Group by group. `carry`: the last non-hole before the group. `ahead`: the first non-hole
    // after group `ahead_for`, searched only when a hole needs it and reused while it lies past
    // the current group, so every group is searched at most once.
    int carry = before, ahead = -1, ahead_for = -1;
    for (int g = group_begin; g < group_end; ++g) {
      const int k = g * kWarp + lane;  // this lane's chunk
      const uint32_t v = valid_of(k);
      const uint32_t holes = k < chunks ? ~v & word_range(width - k * kWarp) : 0u;
      // Nearest non-holes of the lane's chunk from the group's other chunks (or outside it).
      const int upto = warp_prefix_max(v != 0 ? k * kWarp + highest_set_bit(v) : -1, lane);
      const int from = warp_suffix_min(v != 0 ? k * kWarp + lowest_set_bit(v) : kNoPosition, lane);
      const int below_lane = __shfl_up_sync(kAllLanes, upto, 1);
      const int above_lane = __shfl_down_sync(kAllLanes, from, 1);
      const int left = lane > 0 ? max(below_lane, carry) : carry;  // (carry < any position here)
      int right = lane < kWarp - 1 ? above_lane : kNoPosition;
      // Holes after the chunk's last non-hole with no non-hole later in the group: look ahead.
      const bool needs_ahead = right == kNoPosition && holes != 0 &&
                               (v == 0 || highest_set_bit(holes) > highest_set_bit(v));
      if (__any_sync(kAllLanes, needs_ahead)) {
        const int group_end_position = (g + 1) * kWarp * kWarp;
        if (ahead_for < 0 || (ahead >= 0 && ahead < group_end_position)) {
          ahead = after;
          for (int h = g + 1; h < group_end; ++h) {
            const int found = first_non_hole_in_group(valid_of(h * kWarp + lane), h);
            if (found >= 0) {
              ahead = found;
              break;
            }
          }
          ahead_for = g;
        }
      }
      if (right == kNoPosition) right = ahead_for >= 0 ? ahead : -1;  // (-1 is only used if found)
      const int group_last = __shfl_sync(kAllLanes, upto, kWarp - 1);
      // The holes: each lane its own chunk's, kRowHolesPerStep at a time, so the neighbour loads of
      // the whole group are in flight together. (Chunk after chunk, each step's loads waited for
      // the previous step's stores: ~25 round trips per group at 4K, 41 us for the pass.)
      const int chunk_x = k * kWarp;
      for (uint32_t rest = holes; rest != 0;) {
        constexpr int kStep = kRowHolesPerStep<calc_t>;
        int hole[kStep];
        NeighbourValue<calc_t> left_value[kStep], right_value[kStep];
#pragma unroll
        for (int h = 0; h < kStep; ++h) {
          hole[h] = rest != 0 ? lowest_set_bit(rest) : -1;
          if (hole[h] < 0) continue;
          rest &= rest - 1u;
          const uint32_t lower = v & ((1u << hole[h]) - 1u);
          const uint32_t higher = v & ~((2u << hole[h]) - 1u);  // (2u << 31 == 0)
          const int l = lower != 0 ? chunk_x + highest_set_bit(lower) : left;
          const int r = higher != 0 ? chunk_x + lowest_set_bit(higher) : right;
          left_value[h] = projected_value_at<calc_t>(slots, l >= 0 ? row + l : -1);
          right_value[h] = projected_value_at<calc_t>(slots, r >= 0 ? row + r : -1);
        }
#pragma unroll
        for (int h = 0; h < kStep; ++h) {
          if (hole[h] >= 0) {
            store_row_partial(slots, count, row + chunk_x + hole[h], left_value[h], right_value[h]);
          }
        }
      }
      if (group_last >= 0) carry = group_last;
    }
  }
}

// ---- 3. column pass: top + bottom, the mean ---------------------------------------------------

// Warps (row segments) per block. 8-byte values spill under the 64 registers/thread that 32
// warps allow (ptxas): 16 warps for them (and __launch_bounds__'s min 1 block, without which
// ptxas still kept them at 64 and spilled).
template <typename calc_t>
constexpr int kMaxColumnSegments = sizeof(calc_t) == 4 ? 32 : 16;

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

// Holes whose partial sums are loaded together (8-byte values need twice the registers).
template <typename calc_t>
constexpr int kColumnRunBatch = sizeof(calc_t) == 4 ? 4 : 2;

// fill_column_run of common/flow_hole_fill.h (the same arithmetic), with the holes' loads
// batched: the run's neighbours once, then kColumnRunBatch holes' partial sums at a time.
template <typename scalar_t, typename count_t, typename Slots>
__device__ __forceinline__ void finish_column_run(const Slots& slots, count_t* count,
                                                  scalar_t* out_column, int64_t plane,
                                                  int64_t column, int width, int first, int end,
                                                  int top, int bottom) {
  using calc_t = typename Slots::calc_type;
  const NeighbourValue<calc_t> above =
      projected_value_at<calc_t>(slots, top >= 0 ? column + static_cast<int64_t>(top) * width : -1);
  const NeighbourValue<calc_t> below = projected_value_at<calc_t>(
      slots, bottom >= 0 ? column + static_cast<int64_t>(bottom) * width : -1);
  constexpr int batch = kColumnRunBatch<calc_t>;
  for (int y = first; y < end; y += batch) {
    HoleSum<calc_t> sums[batch];
#pragma unroll
    for (int k = 0; k < batch; ++k) {
      sums[k] = {calc_t(0), calc_t(0), 0};
      if (y + k < end) {
        const int64_t i = column + static_cast<int64_t>(y + k) * width;
        sums[k] = load_row_partial<calc_t>(slots, count, i);
      }
    }
#pragma unroll
    for (int k = 0; k < batch; ++k) {
      if (y + k >= end) break;
      const int64_t offset = static_cast<int64_t>(y + k) * width;
      finish_hole(sums[k], above, below, out_column + offset, plane, count + column + offset);
    }
  }
}

// Column pass. Block = one 32-column strip (chunk) of one image, warp s = rows
// [s·rows_per_segment, (s+1)·rows_per_segment), lane = column; grid-stride over batch·chunks.
template <typename scalar_t, typename count_t, typename Slots>
__global__ void __launch_bounds__(kWarp * kMaxColumnSegments<typename Slots::calc_type>, 1)
fill_column_holes_kernel(
    Slots slots_arg, const uint32_t* __restrict__ valid_words, int64_t batch, int height,
    int width, int rows_per_segment, scalar_t* __restrict__ out, count_t* __restrict__ count) {
  constexpr int kSegments = kMaxColumnSegments<typename Slots::calc_type>;
  __shared__ int segment_first[kSegments][kWarp], segment_last[kSegments][kWarp];
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kWarp, segment = threadIdx.x / kWarp;
  const int segments = blockDim.x / kWarp;
  const int64_t start = static_cast<int64_t>(segment) * rows_per_segment;  // (int64: no overflow)
  const int begin = start < height ? static_cast<int>(start) : height;
  const int end = static_cast<int64_t>(begin) + rows_per_segment < height ? begin + rows_per_segment
                                                                          : height;
  const int chunks = chunks_of(width);
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int64_t s = blockIdx.x; s < batch * chunks; s += gridDim.x) {
    const int64_t b = s / chunks;
    const int chunk = static_cast<int>(s - b * chunks);
    const int x = chunk * kWarp + lane;
    const bool in_image = x < width;  // lanes past the image see no holes (but join the shuffles)
    const uint32_t* strip = valid_words + b * height * chunks + chunk;  // row y: strip[y·chunks]
    // Hole bits of this lane's column for rows y0 + k (k < 32); rows from `end` on are not
    // loaded (callers mask them off).
    auto column_holes = [&](int y0) -> uint32_t {
      const int y = y0 + lane;
      const uint32_t row_valid = y < end ? strip[static_cast<int64_t>(y) * chunks] : 0u;
      const uint32_t valid = transpose_bits(row_valid, lane);
      return in_image ? ~valid : 0u;
    };
    // 1. The segment's first and last non-hole, shared with the other segments.
    int first = -1, last = -1;
    for (int y0 = begin; y0 < end; y0 += kWarp) {
      const uint32_t valid = ~column_holes(y0) & word_range(end - y0);
      if (valid != 0) {
        if (first < 0) first = y0 + lowest_set_bit(valid);
        last = y0 + highest_set_bit(valid);
      }
    }
    segment_first[segment][lane] = first;
    segment_last[segment][lane] = last;
    __syncthreads();
    int above = -1, below = -1;  // the nearest non-holes outside the segment
    for (int g = segment - 1; g >= 0 && above < 0; --g) above = segment_last[g][lane];
    for (int g = segment + 1; g < segments && below < 0; ++g) below = segment_first[g][lane];
    __syncthreads();  // shared memory is reused by the next strip
    // 2. The runs of holes, as on the CPU (every lane calls column_holes for every word: the
    // shuffles need the whole warp).
    const int64_t column = b * plane + x;              // slot of (b, 0, x)
    scalar_t* out_column = out + b * plane + column;   // (b, 0, 0, x) of the output
    for_each_hole_run(begin, end, above, below, column_holes,
                      [&](int first_hole, int stop, int top, int bottom) {
                        finish_column_run(slots, count, out_column, plane, column, width,
                                          first_hole, stop, top, bottom);
                      });
  }
}

// Column pass layout: as many row segments per strip as a block allows, each a whole number of
// 32-row words, as few words as possible (at 4K in float: 23 segments of 3 words).
struct ColumnFillLayout {
  int segments, rows_per_segment;
};

template <typename calc_t>
ColumnFillLayout column_fill_layout(int height) {
  constexpr int kSegments = kMaxColumnSegments<calc_t>;
  const int64_t words = (static_cast<int64_t>(height) + kWarp - 1) / kWarp;
  const int64_t rows_per_segment = (words + kSegments - 1) / kSegments * kWarp;
  return {static_cast<int>((height + rows_per_segment - 1) / rows_per_segment),
          static_cast<int>(rows_per_segment)};
}

}  // namespace redet
