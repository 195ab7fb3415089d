// Depth-aware flow projection on CUDA.
// Forward, three or four launches (plus one 4-byte copy when checking depth) and at most one host
// synchronisation:
// (0) one memset zeroes the accumulators (sum_x, sum_y, count, -) and the invalid-depth flag;
// (1) scatter every source pixel into them: one 16-byte float4 atomic per target on sm_90 (DAIN
//     issues three scalar ones), and neighbouring lanes that hit the same pixels merge their
//     additions first; in deterministic mode 64-bit fixed point with integer atomics instead
//     (order-independent, bitwise repeatable). The same pass flags invalid depth values;
// (2) without hole filling one elementwise normalisation; with it the two linear sweeps of
//     common/flow_hole_fill.h: a row pass (normalises the non-holes, left + right of the holes)
//     and a column pass (top + bottom, the mean; short segments and per-hole work, no sweeps);
// (3) when checking depth, the flag is copied to pinned memory right after (1); once (2) is
//     enqueued the host waits for that copy only (the only sync, overlapping (2)) and runs the
//     host check only if the flag is set.
// Backward: a gather per source pixel from the (up to four) pixels it reached, after the hole
// filling's transpose when filling was on; no atomics, so it is deterministic.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <type_traits>

#include "common/cuda/async_readback.cuh"
#include "common/cuda_utils.cuh"
#include "common/flow_hole_fill.h"
#include "common/flow_projection.h"
#include "depth_flow_projection/depth_flow_projection.h"

namespace redet {
namespace {

// ---- scatter ------------------------------------------------------------------------------

struct FloatAccumulator {
  float* acc;
  __device__ __forceinline__ void add(int64_t i, float vx, float vy, float w) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(acc + 4 * i), make_float4(vx, vy, w, 0.f));
#else
    atomicAdd(acc + 4 * i, vx);
    atomicAdd(acc + 4 * i + 1, vy);
    atomicAdd(acc + 4 * i + 2, w);
#endif
  }
};

struct DoubleAccumulator {
  double* acc;
  __device__ __forceinline__ void add(int64_t i, double vx, double vy, double w) const {
    atomicAdd(acc + 4 * i, vx);
    atomicAdd(acc + 4 * i + 1, vy);
    atomicAdd(acc + 4 * i + 2, w);
  }
};

// bound[0] bounds every pixel's count, bound[1] every pixel's |sum| (see fixed_point.h).
struct FixedPointAccumulator {
  long long* acc;
  const double* bound;
  __device__ __forceinline__ void add(int64_t i, double vx, double vy, double w) const {
    const double sum_scale = fixed_point_scale(bound[1]);
    atomic_add_fixed_point(acc + 4 * i, vx, sum_scale);
    atomic_add_fixed_point(acc + 4 * i + 1, vy, sum_scale);
    atomic_add_fixed_point(acc + 4 * i + 2, w, fixed_point_scale(bound[0]));
  }
};

// Is this depth (or inverse depth) value acceptable? Mirrors check_depth_values().
template <typename acc_t>
__device__ __forceinline__ bool depth_is_valid(acc_t d, bool inverse_depth) {
  return inverse_depth ? (d >= acc_t(0) && isfinite(d)) : d > acc_t(0);
}

// One source pixel per lane; the warp walks the pixels together (a warp-uniform loop), so lanes
// can exchange targets. With smooth flow, lane k's right column of targets is lane k+1's left
// column: lane k adds both contributions with one atomic and lane k+1 skips its own, which
// halves the atomics. Merging only pre-sums additions to one address, so it is always valid.
template <typename scalar_t, typename acc_t, typename Accumulator>
__global__ void scatter_kernel(const scalar_t* __restrict__ flow, const scalar_t* __restrict__ depth,
                               int64_t batch, int height, int width, acc_t t, bool inverse_depth,
                               Accumulator accumulator, int* invalid_depth) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int64_t total = batch * plane;
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t warp_start = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane;
       warp_start < total; warp_start += stride) {
    const int64_t index = warp_start + lane;
    int64_t top_left = -1, top_right = -1, bottom_left = -1, bottom_right = -1;
    acc_t vx = 0, vy = 0, w = 0;
    if (index < total) {
      const int64_t b = index / plane, i = index - b * plane;
      const int y = static_cast<int>(i / width);
      const int x = static_cast<int>(i - static_cast<int64_t>(y) * width);
      const acc_t d = static_cast<acc_t>(depth[index]);
      if (invalid_depth != nullptr && !depth_is_valid(d, inverse_depth)) *invalid_depth = 1;
      const acc_t gx = t * static_cast<acc_t>(flow[b * 2 * plane + i]);
      const acc_t gy = t * static_cast<acc_t>(flow[b * 2 * plane + plane + i]);
      ProjectionCorners c;
      if (project_pixel(x, y, gx, gy, width, height, &c)) {
        w = projection_weight(d, inverse_depth);
        vx = -w * gx;
        vy = -w * gy;
        const int64_t top = b * plane + static_cast<int64_t>(c.top) * width;
        const int64_t bottom = b * plane + static_cast<int64_t>(c.bottom) * width;
        top_left = top + c.left;
        top_right = top + c.right;
        bottom_left = bottom + c.left;
        bottom_right = bottom + c.right;
      }
    }
    constexpr unsigned kAll = 0xffffffffu;
    const int64_t next_top_left = __shfl_down_sync(kAll, top_left, 1);
    const int64_t next_bottom_left = __shfl_down_sync(kAll, bottom_left, 1);
    const acc_t next_vx = __shfl_down_sync(kAll, vx, 1);
    const acc_t next_vy = __shfl_down_sync(kAll, vy, 1);
    const acc_t next_w = __shfl_down_sync(kAll, w, 1);
    const int64_t prev_top_right = __shfl_up_sync(kAll, top_right, 1);
    const int64_t prev_bottom_right = __shfl_up_sync(kAll, bottom_right, 1);
    if (top_left < 0) continue;  // not projected
    const bool take_next = lane < 31 && next_top_left == top_right && next_bottom_left == bottom_right;
    const bool given_to_prev = lane > 0 && prev_top_right == top_left && prev_bottom_right == bottom_left;
    if (!given_to_prev) {
      accumulator.add(top_left, vx, vy, w);
      accumulator.add(bottom_left, vx, vy, w);
    }
    const acc_t rx = take_next ? vx + next_vx : vx;
    const acc_t ry = take_next ? vy + next_vy : vy;
    const acc_t rw = take_next ? w + next_w : w;
    accumulator.add(top_right, rx, ry, rw);
    accumulator.add(bottom_right, rx, ry, rw);
  }
}

// ---- accumulator slots -------------------------------------------------------------------
// Each kernel below takes a Slots argument and calls bind() once: the fixed-point slots read
// their scales from the device there.

struct FloatSlots {  // one 16-byte load per pixel
  using calc_type = float;
  float* acc;
  __device__ __forceinline__ FloatSlots bind() const { return *this; }
  __device__ __forceinline__ void load(int64_t i, float* sx, float* sy, float* c) const {
    const float4 v = reinterpret_cast<const float4*>(acc)[i];
    *sx = v.x;
    *sy = v.y;
    *c = v.z;
  }
  __device__ __forceinline__ void store_partial(int64_t i, float x, float y) const {
    reinterpret_cast<float2*>(acc)[2 * i] = make_float2(x, y);
  }
  __device__ __forceinline__ void load_partial(int64_t i, float* x, float* y) const {
    const float2 v = reinterpret_cast<const float2*>(acc)[2 * i];
    *x = v.x;
    *y = v.y;
  }
};

struct DoubleSlots : PlainSlots<double> {
  using calc_type = double;
  __device__ __forceinline__ DoubleSlots bind() const { return *this; }
};

// 64-bit fixed point (deterministic mode); a hole's partial sum is stored as double bits.
struct FixedPointSlots {
  using calc_type = double;
  long long* acc;
  const double* bound;  // on the device: bound[0] bounds every count, bound[1] every |sum|
  double sum_scale, count_scale;
  __device__ __forceinline__ FixedPointSlots bind() const {
    return {acc, bound, fixed_point_scale(bound[1]), fixed_point_scale(bound[0])};
  }
  __device__ __forceinline__ void load(int64_t i, double* sx, double* sy, double* c) const {
    *sx = from_fixed_point(acc[4 * i], sum_scale);
    *sy = from_fixed_point(acc[4 * i + 1], sum_scale);
    *c = from_fixed_point(acc[4 * i + 2], count_scale);
  }
  __device__ __forceinline__ void store_partial(int64_t i, double x, double y) const {
    acc[4 * i] = __double_as_longlong(x);
    acc[4 * i + 1] = __double_as_longlong(y);
  }
  __device__ __forceinline__ void load_partial(int64_t i, double* x, double* y) const {
    *x = __longlong_as_double(acc[4 * i]);
    *y = __longlong_as_double(acc[4 * i + 1]);
  }
};

// ---- normalise without hole filling -------------------------------------------------------

template <typename scalar_t, typename count_t, typename Slots>
__global__ void normalize_kernel(Slots slots_arg, int64_t batch, int64_t plane,
                                 scalar_t* __restrict__ out, count_t* __restrict__ count) {
  using calc_t = typename Slots::calc_type;
  const Slots slots = slots_arg.bind();
  REDET_CUDA_GRID_STRIDE(index, batch * plane) {
    const int64_t b = index / plane, i = index - b * plane;
    const auto p = load_projected<count_t, calc_t>(slots, index);  // a hole gives (0, 0, 0)
    out[b * 2 * plane + i] = static_cast<scalar_t>(p.x);
    out[b * 2 * plane + plane + i] = static_cast<scalar_t>(p.y);
    count[index] = p.count;
  }
}

// ---- hole filling, row pass (see common/flow_hole_fill.h) ---------------------------------
// One block per row; warp w sweeps the consecutive 32-pixel chunks [begin, end) of the row. In a
// chunk, a ballot of the non-holes gives each hole its nearest non-holes inside the chunk (the
// closest set bits below and above its lane); holes after the chunk's last non-hole wait
// ("pending") until a later chunk shows the run's right end. The non-holes just outside a warp's
// segment come from the other warps' first/last non-holes, exchanged in shared memory.

constexpr int kWarp = 32;
constexpr unsigned kAllLanes = 0xffffffffu;
constexpr int kRowWarps = 8;       // warps (row segments) per row

// Row-pass blocks that must fit on one SM: the sweep is a chain of loads, so resident warps are
// what keeps memory busy. With float sums 5 blocks (48 registers) compile without spills, where
// ptxas alone took 64 (4 blocks); 6 would spill. 8-byte sums spill at 4 already: no minimum.
template <typename calc_t>
constexpr int kRowBlocksPerSM = sizeof(calc_t) == 4 ? 5 : 1;

template <typename count_t, typename Slots>
__device__ __forceinline__ bool is_non_hole(const Slots& slots, int64_t i) {
  typename Slots::calc_type sx, sy, c;
  slots.load(i, &sx, &sy, &c);
  return stored_count_is_positive<count_t>(c);
}

// First / last non-hole of the row segment [begin, end) by chunks (-1: none); warp-uniform.
template <typename count_t, typename Slots>
__device__ __forceinline__ int first_non_hole_in_row(const Slots& slots, int64_t row, int begin, int end, int lane) {
  for (int x0 = begin; x0 < end; x0 += kWarp) {
    const unsigned mask = __ballot_sync(kAllLanes, x0 + lane < end && is_non_hole<count_t>(slots, row + x0 + lane));
    if (mask != 0) return x0 + __ffs(mask) - 1;
  }
  return -1;
}

template <typename count_t, typename Slots>
__device__ __forceinline__ int last_non_hole_in_row(const Slots& slots, int64_t row, int begin, int end, int lane) {
  if (end <= begin) return -1;
  for (int x0 = begin + (end - 1 - begin) / kWarp * kWarp; x0 >= begin; x0 -= kWarp) {
    const unsigned mask = __ballot_sync(kAllLanes, x0 + lane < end && is_non_hole<count_t>(slots, row + x0 + lane));
    if (mask != 0) return x0 + kWarp - 1 - __clz(mask);
  }
  return -1;
}

// First and last non-hole of the row segment [begin, end) (-1: none); warp-uniform. Its first and
// last chunks are read together: one round trip when both hold a non-hole (the usual case).
template <typename count_t, typename Slots>
__device__ __forceinline__ void segment_non_holes(const Slots& slots, int64_t row, int begin, int end,
                                                  int lane, int* first, int* last) {
  *first = *last = -1;
  if (end <= begin) return;
  const int tail = begin + (end - 1 - begin) / kWarp * kWarp;  // the last chunk
  const bool head_valid = begin + lane < end && is_non_hole<count_t>(slots, row + begin + lane);
  const bool tail_valid = tail + lane < end && is_non_hole<count_t>(slots, row + tail + lane);
  const unsigned head = __ballot_sync(kAllLanes, head_valid), tail_mask = __ballot_sync(kAllLanes, tail_valid);
  *first = head != 0 ? begin + __ffs(head) - 1
                     : first_non_hole_in_row<count_t>(slots, row, begin + kWarp, end, lane);
  if (*first < 0) return;
  *last = tail_mask != 0 ? tail + kWarp - 1 - __clz(tail_mask)
                         : last_non_hole_in_row<count_t>(slots, row, begin, tail, lane);
}

// The value of `lane`'s pixel, read by every lane from lane `from`.
template <typename calc_t>
__device__ __forceinline__ NeighbourValue<calc_t> value_of_lane(bool found, calc_t x, calc_t y, int from) {
  return {found, __shfl_sync(kAllLanes, x, from), __shfl_sync(kAllLanes, y, from)};
}

// Stores left + right into every hole of [first, end) of the row (all lanes together).
template <typename calc_t, typename count_t, typename Slots>
__device__ __forceinline__ void store_row_run(const Slots& slots, count_t* count, int64_t row, int first, int end,
                              const NeighbourValue<calc_t>& left,
                              const NeighbourValue<calc_t>& right, int lane) {
  for (int x = first + lane; x < end; x += kWarp) store_row_partial(slots, count, row + x, left, right);
}

// One warp's sweep of [begin, end) of the row whose slot 0 is `row` (`out`: the row in the x
// plane). before/after: the nearest non-holes outside the segment (-1: none).
template <typename scalar_t, typename count_t, typename Slots>
__device__ __forceinline__ void sweep_row_segment(const Slots& slots, count_t* count, scalar_t* out, int64_t plane,
                                  int64_t row, int begin, int end, int before, int after, int lane) {
  using calc_t = typename Slots::calc_type;
  using Value = NeighbourValue<calc_t>;
  Value carry = projected_value_at<calc_t>(slots, before >= 0 ? row + before : -1);  // left of the chunk
  int pending = -1;  // first hole of a run whose right end has not been seen yet
  // The slots of the next two chunks, loaded ahead (the sweep is a chain: two chunks in flight
  // per warp while one is processed). A hole beyond the end reads as count 0.
  calc_t next_x = 0, next_y = 0, next_count = 0, later_x = 0, later_y = 0, later_count = 0;
  if (begin + lane < end) slots.load(row + begin + lane, &next_x, &next_y, &next_count);
  if (begin + kWarp + lane < end) slots.load(row + begin + kWarp + lane, &later_x, &later_y, &later_count);
  for (int x0 = begin; x0 < end; x0 += kWarp) {
    const int x = x0 + lane;
    const auto p = project_slot<count_t>(next_x, next_y, next_count);
    next_x = later_x;
    next_y = later_y;
    next_count = later_count;
    later_count = 0;
    // Safe to load early: this iteration writes only pixels before x0 + kWarp.
    if (x + 2 * kWarp < end) slots.load(row + x + 2 * kWarp, &later_x, &later_y, &later_count);
    if (p.valid) {
      out[x] = static_cast<scalar_t>(p.x);
      out[plane + x] = static_cast<scalar_t>(p.y);
      count[row + x] = p.count;
    }
    const unsigned mask = __ballot_sync(kAllLanes, p.valid);
    if (mask == 0) {  // all holes: the run goes on
      if (pending < 0) pending = x0;
      continue;
    }
    const unsigned lower = mask & ((1u << lane) - 1u);
    const unsigned higher = lane == kWarp - 1 ? 0u : mask & (~0u << (lane + 1));
    const Value left = value_of_lane(lower != 0, p.x, p.y, lower != 0 ? kWarp - 1 - __clz(lower) : lane);
    const Value right = value_of_lane(higher != 0, p.x, p.y, higher != 0 ? __ffs(higher) - 1 : lane);
    const int first = __ffs(mask) - 1, last = kWarp - 1 - __clz(mask);
    if (pending >= 0) {  // the run that began in an earlier chunk ends at this chunk's first non-hole
      store_row_run(slots, count, row, pending, x0, carry, value_of_lane(true, p.x, p.y, first), lane);
      pending = -1;
    }
    if (x < end && !p.valid && higher != 0) {
      store_row_partial(slots, count, row + x, lower != 0 ? left : carry, right);
    }
    carry = value_of_lane(true, p.x, p.y, last);
    const int chunk_end = min(x0 + kWarp, end);
    if (x0 + last + 1 < chunk_end) pending = x0 + last + 1;
  }
  if (pending >= 0) {
    store_row_run(slots, count, row, pending, end, carry,
                  projected_value_at<calc_t>(slots, after >= 0 ? row + after : -1), lane);
  }
}

template <typename scalar_t, typename count_t, typename Slots>
__global__ void __launch_bounds__(kWarp * kRowWarps, kRowBlocksPerSM<typename Slots::calc_type>) fill_rows_kernel(Slots slots_arg, int64_t batch, int height, int width,
                                 scalar_t* __restrict__ out, count_t* __restrict__ count) {
  __shared__ int segment_first[kRowWarps], segment_last[kRowWarps];
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int chunks_per_warp = ((width + kWarp - 1) / kWarp + warps - 1) / warps;
  const int begin = min(width, warp * chunks_per_warp * kWarp);
  const int end = min(width, begin + chunks_per_warp * kWarp);
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int64_t r = blockIdx.x; r < batch * height; r += gridDim.x) {
    const int64_t row = r * width;                // slot of (b, y, 0) = b·plane + y·width
    scalar_t* out_row = out + (r / height) * plane + row;  // (b, 0, y, 0) of the output
    int before = -1, after = -1;
    if (warps > 1) {  // the non-holes around this warp's segment
      int first, last;
      segment_non_holes<count_t>(slots, row, begin, end, lane, &first, &last);
      if (lane == 0) {
        segment_first[warp] = first;
        segment_last[warp] = last;
      }
      __syncthreads();
      for (int w = warp - 1; w >= 0 && before < 0; --w) before = segment_last[w];
      for (int w = warp + 1; w < warps && after < 0; ++w) after = segment_first[w];
      __syncthreads();  // shared memory is reused by the next row
    }
    sweep_row_segment(slots, count, out_row, plane, row, begin, end, before, after, lane);
  }
}

// ---- hole filling, column pass ------------------------------------------------------------
// A block owns kFillColumns adjacent columns over their whole height, split into `groups` row
// segments; thread (group g, column c) = threadIdx.x = g·kFillColumns + c. Eight 4-byte counts
// are one 32-byte sector per row, so the reads stay sector-efficient while an image gets W/8
// blocks (480 at 4K: more than the SMs) and each thread a segment of at most a few 32-row words
// (the host's column_fill_layout). No loop-carried chain of loads:
//   1. each thread loads its segment's hole masks (32 independent count loads per word) and
//      publishes its first/last non-hole in shared memory;
//   2. the nearest non-holes above/below its segment come from the other segments';
//   3. each hole finds its nearest non-holes above and below by bit operations on its word's
//      mask (or they are the ones just outside the word), and kHoleBatch holes load their partial
//      sums and neighbours together. A non-hole costs only its count load.

constexpr int kFillColumns = 8;       // columns per block
constexpr int kMaxColumnGroups = 64;  // row segments per column
// Holes whose loads are in flight together (float: 86 registers, no spills; 8-byte values need
// twice the registers per hole, so fewer).
template <typename calc_t>
constexpr int kHoleBatch = sizeof(calc_t) == 4 ? 4 : 2;

// The first non-hole of the column at or after row `from`, which must exist before `end`.
template <typename count_t>
__device__ __forceinline__ int first_non_hole_from(const count_t* column_count, int width, int from,
                                                   int end) {
  for (int y0 = from;; y0 += kWarp) {
    const uint32_t valid = ~hole_word(column_count, width, y0, end) & word_range(end - y0);
    if (valid != 0) return y0 + lowest_set_bit(valid);
  }
}

// Finishes the holes of the 32-row word at y0 of one column: `holes`/`valid` are its masks,
// top/bottom the nearest non-holes above/below the word (-1: none; bottom is only used by holes
// after the word's last non-hole).
template <typename scalar_t, typename count_t, typename Slots>
__device__ __forceinline__ void fill_column_word(const Slots& slots, count_t* count, scalar_t* out_column,
                                 int64_t plane, int64_t column, int width, int y0, uint32_t holes,
                                 uint32_t valid, int top, int bottom) {
  using calc_t = typename Slots::calc_type;
  auto value_at_row = [&](int y) {
    return projected_value_at<calc_t>(slots, y >= 0 ? column + static_cast<int64_t>(y) * width : -1);
  };
  constexpr int batch = kHoleBatch<calc_t>;
  while (holes != 0) {
    int rows[batch];
    HoleSum<calc_t> sums[batch];
    NeighbourValue<calc_t> above[batch], below[batch];
#pragma unroll
    for (int k = 0; k < batch; ++k) {  // independent loads: all in flight together
      rows[k] = -1;
      if (holes == 0) continue;
      const int bit = lowest_set_bit(holes);
      holes &= holes - 1u;
      const uint32_t lower = valid & ((1u << bit) - 1u);
      const uint32_t upper = valid & ~((2u << bit) - 1u);  // (2u << 31 == 0: none above bit 31)
      rows[k] = y0 + bit;
      sums[k] = load_row_partial<calc_t>(slots, count, column + static_cast<int64_t>(rows[k]) * width);
      above[k] = value_at_row(lower != 0 ? y0 + highest_set_bit(lower) : top);
      below[k] = value_at_row(upper != 0 ? y0 + lowest_set_bit(upper) : bottom);
    }
#pragma unroll
    for (int k = 0; k < batch; ++k) {
      if (rows[k] < 0) continue;
      const int64_t offset = static_cast<int64_t>(rows[k]) * width;
      finish_hole(sums[k], above[k], below[k], out_column + offset, plane, count + column + offset);
    }
  }
}

template <typename scalar_t, typename count_t, typename Slots>
__global__ void __launch_bounds__(kFillColumns * kMaxColumnGroups) fill_columns_kernel(
    Slots slots_arg, int64_t batch, int height, int width, int rows_per_group,
    scalar_t* __restrict__ out, count_t* __restrict__ count) {
  __shared__ int segment_first[kMaxColumnGroups][kFillColumns], segment_last[kMaxColumnGroups][kFillColumns];
  const Slots slots = slots_arg.bind();
  const int lane = threadIdx.x % kFillColumns, group = threadIdx.x / kFillColumns;
  const int groups = blockDim.x / kFillColumns;
  const int64_t start = static_cast<int64_t>(group) * rows_per_group;  // (int64: no overflow)
  const int begin = start < height ? static_cast<int>(start) : height;
  const int end = static_cast<int64_t>(begin) + rows_per_group < height ? begin + rows_per_group : height;
  const int strips = (width + kFillColumns - 1) / kFillColumns;
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int64_t s = blockIdx.x; s < batch * strips; s += gridDim.x) {
    const int64_t b = s / strips;
    const int x = static_cast<int>(s - b * strips) * kFillColumns + lane;
    const bool in_image = x < width;
    const int64_t column = b * plane + x;  // slot of (b, 0, x)
    const count_t* column_count = count + column;
    // 1. The segment's first and last non-hole; its first word's mask is kept for step 3.
    int first = -1, last = -1;
    uint32_t first_word = 0;
    for (int y0 = begin; in_image && y0 < end; y0 += kWarp) {
      const uint32_t holes = hole_word(column_count, width, y0, end);
      if (y0 == begin) first_word = holes;
      const uint32_t valid = ~holes & word_range(end - y0);
      if (valid != 0) {
        if (first < 0) first = y0 + lowest_set_bit(valid);
        last = y0 + highest_set_bit(valid);
      }
    }
    segment_first[group][lane] = first;
    segment_last[group][lane] = last;
    __syncthreads();
    // 2. The nearest non-holes outside the segment (rows grow with the group).
    int above = -1, below = -1;
    for (int g = group - 1; g >= 0 && above < 0; --g) above = segment_last[g][lane];
    for (int g = group + 1; g < groups && below < 0; ++g) below = segment_first[g][lane];
    __syncthreads();  // shared memory is reused by the next strip
    if (!in_image) continue;
    // 3. Word by word: `top` is the nearest non-hole above the word; the nearest one below it is
    // searched only when a hole after the word's last non-hole needs it, and the search resumes
    // past its last find, so every word is searched at most once.
    scalar_t* out_column = out + b * plane + column;  // (b, 0, 0, x) of the output
    int top = above, next_below = -1;
    for (int y0 = begin; y0 < end; y0 += kWarp) {
      const uint32_t in_word = word_range(end - y0);
      const uint32_t holes = (y0 == begin ? first_word : hole_word(column_count, width, y0, end)) & in_word;
      const uint32_t valid = ~holes & in_word;
      if (holes != 0) {
        const int word_end = min(end, y0 + kWarp);
        int bottom = below;
        if (last >= word_end && (valid == 0 || highest_set_bit(holes) > highest_set_bit(valid))) {
          if (next_below < word_end) next_below = first_non_hole_from(column_count, width, word_end, end);
          bottom = next_below;
        }
        fill_column_word(slots, count, out_column, plane, column, width, y0, holes, valid, top, bottom);
      }
      if (valid != 0) top = y0 + highest_set_bit(valid);
    }
  }
}

// ---- backward -----------------------------------------------------------------------------

template <typename scalar_t, typename acc_t>
__global__ void fill_holes_transpose_kernel(const scalar_t* __restrict__ grad,
                                            const acc_t* __restrict__ count, int64_t batch,
                                            int height, int width, acc_t* __restrict__ grad_projected) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  REDET_CUDA_GRID_STRIDE(index, batch * plane) {
    const int64_t b = index / plane, i = index - b * plane;
    const int y = static_cast<int>(i / width), x = static_cast<int>(i - static_cast<int64_t>(y) * width);
    acc_t* gp = grad_projected + b * 2 * plane + i;
    fill_holes_transpose_pixel(grad + b * 2 * plane, count + b * plane, plane, x, y, width, height,
                               gp, gp + plane);
  }
}

template <typename scalar_t, typename acc_t, typename grad_t>
__global__ void source_gradient_kernel(const grad_t* __restrict__ grad,
                                       const scalar_t* __restrict__ flow,
                                       const scalar_t* __restrict__ depth,
                                       const scalar_t* __restrict__ out,
                                       const acc_t* __restrict__ count, int64_t batch, int height,
                                       int width, acc_t t, bool inverse_depth,
                                       scalar_t* __restrict__ grad_flow,
                                       scalar_t* __restrict__ grad_depth) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  REDET_CUDA_GRID_STRIDE(index, batch * plane) {
    const int64_t b = index / plane, i = index - b * plane;
    const int y = static_cast<int>(i / width), x = static_cast<int>(i - static_cast<int64_t>(y) * width);
    const int64_t fi = b * 2 * plane + i;
    const acc_t w = projection_weight(static_cast<acc_t>(depth[index]), inverse_depth);
    acc_t gfx, gfy, gw;
    source_gradient(x, y, width, height, t, static_cast<acc_t>(flow[fi]),
                    static_cast<acc_t>(flow[fi + plane]), w, grad + b * 2 * plane,
                    out + b * 2 * plane, count + b * plane, plane, &gfx, &gfy, &gw);
    grad_flow[fi] = static_cast<scalar_t>(gfx);
    grad_flow[fi + plane] = static_cast<scalar_t>(gfy);
    grad_depth[index] = static_cast<scalar_t>(inverse_depth ? gw : -gw * w * w);  // dw/dD = −w²
  }
}

// ---- host ---------------------------------------------------------------------------------

// Upper bounds of any pixel's count and |sum|, on the device: each source adds to a pixel at most
// 4 times (the corner case), so 4·H·W·max(w) and that times t·max|F|.
at::Tensor fixed_point_bounds(const at::Tensor& flow, const at::Tensor& depth, double t,
                              bool inverse_depth) {
  const double per_pixel = 4.0 * static_cast<double>(flow.size(2) * flow.size(3));
  const auto d = depth.to(at::kDouble);
  const auto w_max = inverse_depth ? d.amax() : d.amin().reciprocal();
  const auto f = flow.to(at::kDouble).abs();
  const auto f_max = at::where(at::isfinite(f), f, at::zeros_like(f)).amax();
  const auto count_bound = w_max * per_pixel;
  return at::stack({count_bound, count_bound * f_max * t});
}

// Accumulators: 4 values per pixel, then one more slot whose first int is the invalid-depth flag;
// zeroed by one memset, so the depth check costs no kernel of its own.
at::Tensor zeroed_accumulators(int64_t pixels, const at::TensorOptions& options,
                               cudaStream_t stream) {
  auto acc = at::empty({pixels + 1, 4}, options);
  C10_CUDA_CHECK(cudaMemsetAsync(acc.data_ptr(), 0, acc.nbytes(), stream));
  return acc;
}

int* invalid_depth_flag(const at::Tensor& acc, int64_t pixels, bool check_depth) {
  if (!check_depth) return nullptr;
  return reinterpret_cast<int*>(static_cast<char*>(acc.data_ptr()) + pixels * 4 * acc.element_size());
}

// Column pass: as many row segments per column as a block allows (kMaxColumnGroups), each a
// whole number of 32-row words, as few as possible: at most 2 words up to H = 4096 (1 up to 2048).
struct ColumnFillLayout {
  int groups, rows_per_group;
};

ColumnFillLayout column_fill_layout(int height) {
  const int64_t words = (static_cast<int64_t>(height) + kWarp - 1) / kWarp;
  const int64_t rows_per_group = (words + kMaxColumnGroups - 1) / kMaxColumnGroups * kWarp;
  return {static_cast<int>((height + rows_per_group - 1) / rows_per_group),
          static_cast<int>(rows_per_group)};
}

// Normalisation, or the two passes of the hole filling.
template <typename scalar_t, typename count_t, typename Slots>
void launch_finalize(const Slots& slots, const FlowProjectionForward& io, bool fill_holes,
                     cudaStream_t stream) {
  scalar_t* out = io.output.data_ptr<scalar_t>();
  count_t* count = io.count.data_ptr<count_t>();
  const int64_t plane = static_cast<int64_t>(io.height) * io.width;
  if (!fill_holes) {
    normalize_kernel<scalar_t, count_t><<<blocks_for(io.batch * plane), kThreads, 0, stream>>>(
        slots, io.batch, plane, out, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int chunks = (io.width + kWarp - 1) / kWarp;
  fill_rows_kernel<scalar_t, count_t><<<blocks_for(io.batch * io.height, 1),
                                        kWarp * std::min(kRowWarps, chunks), 0, stream>>>(
      slots, io.batch, io.height, io.width, out, count);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const ColumnFillLayout columns = column_fill_layout(io.height);
  const int strips = (io.width + kFillColumns - 1) / kFillColumns;
  fill_columns_kernel<scalar_t, count_t><<<blocks_for(io.batch * strips, 1),
                                           kFillColumns * columns.groups, 0, stream>>>(
      slots, io.batch, io.height, io.width, columns.rows_per_group, out, count);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> depth_flow_projection_cuda(const at::Tensor& flow_,
                                                              const at::Tensor& depth_, double t,
                                                              bool inverse_depth, bool fill_holes,
                                                              bool check_depth) {
  constexpr const char* op = "depth_flow_projection";
  check_depth_flow_projection_args(flow_, depth_, t, op);
  c10::cuda::CUDAGuard guard(flow_.device());
  const auto io = prepare_flow_projection_forward(flow_, depth_);
  const at::Tensor &flow = io.flow, &depth = io.depth;
  const int64_t n = io.batch * io.height * io.width;
  if (n == 0) return {io.output, io.count};
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = blocks_for(n);
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const auto acc_type = deterministic ? at::kLong : flow_projection_acc_type(flow.scalar_type());
  const auto acc = zeroed_accumulators(n, flow.options().dtype(acc_type), stream);
  int* invalid_depth = invalid_depth_flag(acc, n, check_depth);
  AsyncReadback depth_flag;  // (checked calls only) waited for once the fill is enqueued

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    auto scatter = [&](auto accumulator) {
      scatter_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, stream>>>(
          flow.data_ptr<scalar_t>(), depth.data_ptr<scalar_t>(), io.batch, io.height, io.width,
          static_cast<acc_t>(t), inverse_depth, accumulator, invalid_depth);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (invalid_depth != nullptr) depth_flag.start(invalid_depth, sizeof(int), stream);
    };
    if (deterministic) {
      const auto bound = fixed_point_bounds(flow, depth, t, inverse_depth);
      long long* a = reinterpret_cast<long long*>(acc.data_ptr<int64_t>());
      scatter(FixedPointAccumulator{a, bound.data_ptr<double>()});
      launch_finalize<scalar_t, acc_t>(FixedPointSlots{a, bound.data_ptr<double>(), 0.0, 0.0}, io,
                                       fill_holes, stream);
    } else if constexpr (std::is_same_v<acc_t, double>) {
      scatter(DoubleAccumulator{acc.data_ptr<double>()});
      launch_finalize<scalar_t, acc_t>(DoubleSlots{{acc.data_ptr<double>()}}, io, fill_holes, stream);
    } else {
      scatter(FloatAccumulator{acc.data_ptr<float>()});
      launch_finalize<scalar_t, acc_t>(FloatSlots{acc.data_ptr<float>()}, io, fill_holes, stream);
    }
  });
  if (depth_flag.started() && *static_cast<const int*>(depth_flag.wait()) != 0) {
    check_depth_values(depth, inverse_depth, op);  // names the first bad value
  }
  return {io.output, io.count};
}

std::tuple<at::Tensor, at::Tensor> depth_flow_projection_backward_cuda(
    const at::Tensor& grad_, const at::Tensor& flow_, const at::Tensor& depth_,
    const at::Tensor& output_, const at::Tensor& count_, double t, bool inverse_depth,
    bool fill_holes) {
  check_depth_flow_projection_backward_args(grad_, flow_, depth_, output_, count_, t);
  c10::cuda::CUDAGuard guard(flow_.device());
  const auto io = prepare_flow_projection_backward(grad_, flow_, depth_, output_, count_);
  const at::Tensor &grad = io.grad, &flow = io.flow, &depth = io.depth, &output = io.output,
                   &count = io.count, &grad_flow = io.grad_flow, &grad_depth = io.grad_depth;
  const int64_t batch = io.batch;
  const int height = io.height, width = io.width;
  const int64_t n = batch * height * width;
  if (n == 0) return {grad_flow, grad_depth};
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int blocks = blocks_for(n);
  const auto acc_type = flow_projection_acc_type(flow.scalar_type());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    auto gather = [&](const auto* g) {
      source_gradient_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, stream>>>(
          g, flow.data_ptr<scalar_t>(), depth.data_ptr<scalar_t>(), output.data_ptr<scalar_t>(),
          count.data_ptr<acc_t>(), batch, height, width, static_cast<acc_t>(t), inverse_depth,
          grad_flow.data_ptr<scalar_t>(), grad_depth.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (fill_holes) {
      auto grad_projected = at::empty(flow.sizes(), flow.options().dtype(acc_type));
      fill_holes_transpose_kernel<scalar_t, acc_t><<<blocks, kThreads, 0, stream>>>(
          grad.data_ptr<scalar_t>(), count.data_ptr<acc_t>(), batch, height, width,
          grad_projected.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      gather(static_cast<const acc_t*>(grad_projected.data_ptr<acc_t>()));
    } else {
      gather(static_cast<const scalar_t*>(grad.data_ptr<scalar_t>()));
    }
  });
  return {grad_flow, grad_depth};
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, CUDA, m) {
  register_depth_flow_projection_kernels(m, &depth_flow_projection_cuda,
                                         &depth_flow_projection_backward_cuda);
}

}  // namespace redet
