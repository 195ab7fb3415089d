// Depth-aware flow projection (DAIN), the math shared by the CPU and CUDA forward kernels.
//
// A source pixel y with flow F(y) and weight w(y) = 1/depth(y) lands at p = y + G, G = t·F(y).
// If p lies inside [0, W-1] x [0, H-1] it adds (−w·G, w) to (sum, count) at the four pixels
// (L,T) (R,T) (L,B) (R,B), L = floor(p.x), R = min(L+1, W-1), T = floor(p.y), B = min(T+1, H-1),
// with equal weights (at the border one pixel can get the same contribution twice).
// Output = sum / count; pixels with count <= 0 are holes, optionally filled with the mean of the
// nearest non-holes to the left, right, top and bottom (hole filling, below). In the returned
// count a filled hole holds −(number of directions that found a non-hole), which is what the
// fill's backward needs. Accumulators are 4 values per pixel, pixel-major: (sum_x, sum_y, count, unused)
// (on CUDA, sums per corner (L, T), from which the pixels' sums follow: cuda/corner_sums.cuh).
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/macros.h"

namespace redet {

// a + b rounded once, never fused with a preceding multiply into an FMA (nvcc fuses by default),
// so that the CPU and CUDA kernels take the same floor/inside decisions.
REDET_HOST_DEVICE float add_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

REDET_HOST_DEVICE double add_rounded(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

struct ProjectionCorners {
  int left, right, top, bottom;
};

// False when p is outside the image or not finite (such a source pixel is dropped).
template <typename acc_t>
REDET_HOST_DEVICE bool project_pixel(int x, int y, acc_t gx, acc_t gy, int width, int height,
                                     ProjectionCorners* c) {
  const acc_t px = add_rounded(static_cast<acc_t>(x), gx);
  const acc_t py = add_rounded(static_cast<acc_t>(y), gy);
  if (!(px >= acc_t(0) && px <= static_cast<acc_t>(width - 1) && py >= acc_t(0) &&
        py <= static_cast<acc_t>(height - 1))) {
    return false;
  }
  c->left = static_cast<int>(px);  // px >= 0, so truncation is floor
  c->top = static_cast<int>(py);
  c->right = c->left + 1 < width ? c->left + 1 : width - 1;
  c->bottom = c->top + 1 < height ? c->top + 1 : height - 1;
  return true;
}

// Is this depth input acceptable? depth > 0 (+inf allowed: weight 0), or an inverse depth finite
// and >= 0 (the op's check, check_depth_values, applies the same rule to the whole tensor). A
// source pixel with an invalid value contributes nothing and gets no gradient: with
// check_depth=False, or in a CUDA graph, where nothing raises.
template <typename acc_t>
REDET_HOST_DEVICE bool depth_is_valid(acc_t depth, bool inverse_depth) {
  return inverse_depth ? (depth >= acc_t(0) && isfinite(depth)) : depth > acc_t(0);
}

// The weight w from the depth input (which may already be 1/depth).
template <typename acc_t>
REDET_HOST_DEVICE acc_t projection_weight(acc_t depth, bool inverse_depth) {
  return inverse_depth ? depth : acc_t(1) / depth;
}

// ---- hole filling ----
//
// A hole (count <= 0 after the scatter) takes the mean of the nearest non-holes to its left,
// right, top and bottom, summed in that order. Walking from every hole to its neighbours costs
// O(run length) per hole, O(run²) per run of holes, and a column walk reads one pixel per row.
// Instead, observe that all holes of one maximal run in a row share the same left and right
// neighbour (the non-holes bounding the run), and likewise in a column. So two linear sweeps:
//   1. Row pass: every row is swept once, left to right. A non-hole gets its output (sum/count)
//      and count. When a run of holes ends, each hole of the run gets the partial sum
//      left + right of the run's bounding values, stored in its own (now free) accumulator slot,
//      and −(directions found so far) in count.
//   2. Column pass: every column is swept once, top to bottom. When a run of holes ends, each
//      hole adds the run's top and bottom values to its partial sum, divides by the number of
//      directions found and writes output and count = −found.
// The sum (((left + right) + top) + bottom) / found is the same as that of the plain walk, and
// each pixel is read a bounded number of times whatever the holes look like. CUDA finds each
// hole's four neighbours in 1-bit non-hole masks instead of sweeping
// (csrc/depth_flow_projection/cuda/hole_fill_kernels.cuh), but adds them with these functions in
// the same order, so CPU and CUDA agree bit for bit.
//
// What the fill reads from a non-hole (as_fill_input): for fp16/bf16 outputs its output as
// stored, the projected value rounded to 16 bits, so a filled value may differ by about one
// 16-bit ulp (of the neighbours' values) from the calc-type fill rounded once; in exchange CUDA's
// fill reads the neighbours' 2-byte outputs and keeps no full-precision copy of them. For the
// other outputs, the unrounded projected value.
//
// Accumulator slots: `Slots` gives load(i, &sum_x, &sum_y, &count) for pixel i (batch-flat) and
// store_partial/load_partial for a hole's partial sum (a hole's accumulated sums are unused).

// Accumulator slots, 4 values per pixel: (sum_x, sum_y, count, unused); after the row pass a
// hole's (sum_x, sum_y) hold its partial fill sum.
template <typename acc_t>
struct PlainSlots {
  acc_t* acc;
  REDET_HOST_DEVICE void load(int64_t i, acc_t* sum_x, acc_t* sum_y, acc_t* count) const {
    *sum_x = acc[4 * i];
    *sum_y = acc[4 * i + 1];
    *count = acc[4 * i + 2];
  }
  REDET_HOST_DEVICE void store_partial(int64_t i, acc_t x, acc_t y) const {
    acc[4 * i] = x;
    acc[4 * i + 1] = y;
  }
  REDET_HOST_DEVICE void load_partial(int64_t i, acc_t* x, acc_t* y) const {
    *x = acc[4 * i];
    *y = acc[4 * i + 1];
  }
};

// A pixel after the scatter: its projected value and stored count, or a hole (0, 0, 0).
template <typename calc_t, typename count_t>
struct ProjectedPixel {
  bool valid;
  calc_t x, y;
  count_t count;
};

// A neighbour's projected value; `found` is false where the direction has no non-hole.
template <typename calc_t>
struct NeighbourValue {
  bool found;
  calc_t x, y;
};

// A non-hole's count as stored; the pixel is a hole when this is not > 0. (In deterministic mode
// the sums are computed in double but count is stored as float for float input: deciding on the
// stored value keeps every pass of the fill in agreement.)
template <typename count_t, typename calc_t>
REDET_HOST_DEVICE bool stored_count_is_positive(calc_t count) {
  return static_cast<count_t>(count) > count_t(0);
}

template <typename count_t, typename calc_t>
REDET_HOST_DEVICE ProjectedPixel<calc_t, count_t> project_slot(calc_t sum_x, calc_t sum_y,
                                                               calc_t count) {
  if (!stored_count_is_positive<count_t>(count)) return {false, calc_t(0), calc_t(0), count_t(0)};
  return {true, sum_x / count, sum_y / count, static_cast<count_t>(count)};
}

template <typename count_t, typename calc_t, typename Slots>
REDET_HOST_DEVICE ProjectedPixel<calc_t, count_t> load_projected(const Slots& slots, int64_t i) {
  calc_t sx, sy, c;
  slots.load(i, &sx, &sy, &c);
  return project_slot<count_t>(sx, sy, c);
}

// fp16/bf16 outputs (the only 2-byte types the ops dispatch to) fill from the stored outputs.
template <typename scalar_t>
constexpr bool fills_from_rounded_outputs = sizeof(scalar_t) == 2;

// A non-hole's projected value v as the fill reads it: its output as stored (v rounded to
// scalar_t, back in calc_t) for 16-bit outputs, v itself otherwise.
template <typename scalar_t, typename calc_t>
REDET_HOST_DEVICE calc_t as_fill_input(calc_t v) {
  if constexpr (fills_from_rounded_outputs<scalar_t>) {
    return static_cast<calc_t>(static_cast<scalar_t>(v));
  } else {
    return v;
  }
}

// The fill's input from the non-hole at slot i (or "not found" for i < 0).
template <typename scalar_t, typename calc_t, typename Slots>
REDET_HOST_DEVICE NeighbourValue<calc_t> projected_value_at(const Slots& slots, int64_t i) {
  if (i < 0) return {false, calc_t(0), calc_t(0)};
  calc_t sx, sy, c;
  slots.load(i, &sx, &sy, &c);
  return {true, as_fill_input<scalar_t>(sx / c), as_fill_input<scalar_t>(sy / c)};
}

// The running fill sum of one hole, neighbours added in the fixed order left, right, top, bottom.
template <typename calc_t>
struct HoleSum {
  calc_t x, y;
  int found;
  REDET_HOST_DEVICE void add(const NeighbourValue<calc_t>& v) {
    if (!v.found) return;
    x += v.x;
    y += v.y;
    ++found;
  }
};

// Row pass, one hole at slot i: keeps left + right in the slot and −(found) in count.
template <typename calc_t, typename count_t, typename Slots>
REDET_HOST_DEVICE void store_row_partial(const Slots& slots, count_t* count, int64_t i,
                                         const NeighbourValue<calc_t>& left,
                                         const NeighbourValue<calc_t>& right) {
  HoleSum<calc_t> sum{calc_t(0), calc_t(0), 0};
  sum.add(left);
  sum.add(right);
  slots.store_partial(i, sum.x, sum.y);
  count[i] = -static_cast<count_t>(sum.found);
}

// Column pass, one hole: the partial sum (left + right) and directions found that the row pass
// left in its slot and count.
template <typename calc_t, typename count_t, typename Slots>
REDET_HOST_DEVICE HoleSum<calc_t> load_row_partial(const Slots& slots, const count_t* count,
                                                   int64_t i) {
  HoleSum<calc_t> sum;
  sum.found = static_cast<int>(-count[i]);
  slots.load_partial(i, &sum.x, &sum.y);
  return sum;
}

// Column pass, one hole: adds its top and bottom neighbours to the row pass's partial sum and
// writes the mean (out_x: the hole's pixel in the x plane) and count = −(directions found).
template <typename scalar_t, typename count_t, typename calc_t>
REDET_HOST_DEVICE void finish_hole(HoleSum<calc_t> sum, const NeighbourValue<calc_t>& above,
                                   const NeighbourValue<calc_t>& below, scalar_t* out_x,
                                   int64_t plane, count_t* count) {
  sum.add(above);
  sum.add(below);
  const bool any = sum.found > 0;
  out_x[0] = static_cast<scalar_t>(any ? sum.x / static_cast<calc_t>(sum.found) : calc_t(0));
  out_x[plane] = static_cast<scalar_t>(any ? sum.y / static_cast<calc_t>(sum.found) : calc_t(0));
  *count = -static_cast<count_t>(sum.found);
}

// Column pass (CPU): finishes the holes at rows [first, end) of one column, whose nearest
// non-holes above and below are at rows `top` and `bottom` (-1: none). `column` is the slot/count
// index of the column's row 0 and `out` points at the column's row 0 in the x plane of the output.
template <typename scalar_t, typename count_t, typename calc_t, typename Slots>
REDET_HOST_DEVICE void fill_column_run(const Slots& slots, count_t* count, scalar_t* out,
                                       int64_t plane, int64_t column, int width, int first,
                                       int end, int top, int bottom) {
  const NeighbourValue<calc_t> above = projected_value_at<scalar_t, calc_t>(
      slots, top >= 0 ? column + static_cast<int64_t>(top) * width : -1);
  const NeighbourValue<calc_t> below = projected_value_at<scalar_t, calc_t>(
      slots, bottom >= 0 ? column + static_cast<int64_t>(bottom) * width : -1);
  for (int y = first; y < end; ++y) {
    const int64_t offset = static_cast<int64_t>(y) * width;
    finish_hole(load_row_partial<calc_t>(slots, count, column + offset), above, below,
                out + offset, plane, count + column + offset);
  }
}

// Bit helpers for 32-position hole masks.
REDET_HOST_DEVICE int lowest_set_bit(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return __ffs(v) - 1;
#else
  return __builtin_ctz(v);
#endif
}

REDET_HOST_DEVICE int highest_set_bit(uint32_t v) {  // v != 0
#if defined(__CUDA_ARCH__)
  return 31 - __clz(v);
#else
  return 31 - __builtin_clz(v);
#endif
}

// Bit k set when the pixel at line[(p0 + k)·stride] is a hole (count not > 0), for p0 + k < end.
// The 32 loads are independent, so a GPU thread has them all in flight at once.
template <typename count_t>
REDET_HOST_DEVICE uint32_t hole_word(const count_t* line, int64_t stride, int p0, int end) {
  uint32_t holes = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 32; ++k) {
    if (p0 + k < end && !(line[static_cast<int64_t>(p0 + k) * stride] > count_t(0))) {
      holes |= 1u << k;
    }
  }
  return holes;
}

// The positions [0, n) of a 32-position word (n >= 1; n > 32 counts as 32).
REDET_HOST_DEVICE uint32_t word_range(int n) { return n >= 32 ? ~0u : (1u << n) - 1u; }

// Calls on_run(first, end, before, after) for every maximal run [first, end) of holes among the
// positions [begin, end_), in order. hole_word(p) returns a mask whose bit k says whether
// position p + k is a hole (bits at or beyond end_ are ignored): a caller can load 32 positions
// at once. before/after are the nearest non-holes around the run; for a run touching begin or
// end_ they are before_begin / after_end as given (-1: none). Returns the
// last non-hole of the range (before_begin if there is none). Linear in end_ − begin.
template <typename HoleWord, typename OnRun>
REDET_HOST_DEVICE int for_each_hole_run(int begin, int end_, int before_begin, int after_end,
                                        const HoleWord& hole_word, const OnRun& on_run) {
  int before = before_begin, run = -1;
  for (int word = begin; word < end_; word += 32) {
    const int n = end_ - word < 32 ? end_ - word : 32;
    const uint32_t in_range = word_range(n);
    const uint32_t holes = hole_word(word) & in_range;
    const uint32_t valid = ~holes & in_range;
    int k = 0;  // first position of the word not yet classified
    while (k < n) {
      const uint32_t from_k = ~0u << k;
      if (run < 0) {  // between runs: find the next hole, remembering the last non-hole before it
        const uint32_t next_hole = holes & from_k;
        const uint32_t up_to_hole = next_hole != 0 ? (next_hole & (0u - next_hole)) - 1u : ~0u;
        const uint32_t skipped = valid & from_k & up_to_hole;
        if (skipped != 0) before = word + highest_set_bit(skipped);
        if (next_hole == 0) break;
        k = lowest_set_bit(next_hole);
        run = word + k;
      } else {  // inside a run: find the non-hole that ends it
        const uint32_t next_valid = valid & from_k;
        if (next_valid == 0) break;
        k = lowest_set_bit(next_valid);
        on_run(run, word + k, before, word + k);
        run = -1;
      }
    }
  }
  if (run >= 0) on_run(run, end_, before, after_end);
  return before;
}

}  // namespace redet
