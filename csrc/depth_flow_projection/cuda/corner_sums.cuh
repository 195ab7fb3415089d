// The CUDA forward's accumulators hold corner sums, not pixel sums.
//
// A source pixel adds the same (−w·G, w) to all four pixels (L,T) (R,T) (L,B) (R,B) around its
// landing point (depth_flow_projection_math.h), so the scatter adds it once, to its corner (L, T), and
// a pixel's sums are recovered afterwards from the corners that reach it:
//   pixel (x, y) = corners (x-1, y-1) + (x, y-1) + (x-1, y) + (x, y),
// with the last column and the last row counted twice (there R = L, B = T). One atomic per source
// pixel instead of four: the scatter is bound by the L2's atomic throughput.
//
// Every kernel forms the sums in the one order of pixel_sums(): per row, left corner + this one
// (or + 2 x this one in the last column), then the row above + this row (or + 2 x this row in the
// last row). Sums exact in any order (the bitwise tests' cases) are therefore the CPU's exactly.
#pragma once
#include <stdint.h>

namespace redet {

// sum_x, sum_y, count of one corner, one row pair or one pixel.
template <typename calc_t>
struct Sums {
  calc_t x, y, c;
};

template <typename calc_t>
__device__ __forceinline__ Sums<calc_t> no_sums() {
  return {calc_t(0), calc_t(0), calc_t(0)};
}

// before + here, or before + 2·here when `last` (the last column or row: reached twice).
template <typename calc_t>
__device__ __forceinline__ Sums<calc_t> pair_sum(const Sums<calc_t>& before,
                                                 const Sums<calc_t>& here, bool last) {
  const calc_t k = last ? calc_t(2) : calc_t(1);
  return {before.x + k * here.x, before.y + k * here.y, before.c + k * here.c};
}

template <typename calc_t, typename Slots>
__device__ __forceinline__ Sums<calc_t> corner_at(const Slots& slots, int64_t i) {
  Sums<calc_t> s;
  slots.load(i, &s.x, &s.y, &s.c);
  return s;
}

// Corners (x-1, y) + (x, y) of row y; `row` is the slot of (b, y, 0).
template <typename calc_t, typename Slots>
__device__ __forceinline__ Sums<calc_t> row_pair_sums(const Slots& slots, int64_t row, int x,
                                                      int width) {
  const Sums<calc_t> left = x > 0 ? corner_at<calc_t>(slots, row + x - 1) : no_sums<calc_t>();
  return pair_sum(left, corner_at<calc_t>(slots, row + x), x == width - 1);
}

// The sums of pixel (x, y) of the image whose slot 0 is `image`.
template <typename calc_t, typename Slots>
__device__ __forceinline__ Sums<calc_t> pixel_sums(const Slots& slots, int64_t image, int x, int y,
                                                   int width, int height) {
  const int64_t row = image + static_cast<int64_t>(y) * width;
  const Sums<calc_t> above = y > 0 ? row_pair_sums<calc_t>(slots, row - width, x, width)
                                   : no_sums<calc_t>();
  return pair_sum(above, row_pair_sums<calc_t>(slots, row, x, width), y == height - 1);
}

}  // namespace redet
