// Backward of the depth-aware flow projection: the math shared by the CPU and CUDA kernels.
//
// Source pixel y (flow F(y), weight w(y), G = t·F(y)) reaches up to four pixels x
// (depth_flow_projection_math.h), and there d out(x)/d F(y) = −t·w/count(x) and
// d out(x)/d w(y) = −(G + out(x))/count(x). With ĝ(x) the gradient reaching pixel x's projected
// value (grad_output, plus with hole filling what the holes filled from x pass back:
// below), the backward is two steps:
//   1. terms, per pixel x: a = ĝ(x)/count(x) (two values) and a·out(x); zero at a hole;
//   2. gather, per source pixel y: with S the sum of the terms of the pixels it reached,
//      grad F(y) = −t·w·(S.x, S.y) and grad w(y) = −(G.x·S.x + G.y·S.y + S.w).
// A gather then reads one record per reached pixel (one 16-byte load for float) instead of five
// planes (grad x, grad y, out x, out y, count), so an incoherent flow, whose neighbouring sources
// reach scattered pixels, costs a fifth of the cache transactions. No atomics: deterministic.
#pragma once
#include <stdint.h>

#include "common/macros.h"
#include "depth_flow_projection/depth_flow_projection_math.h"

namespace redet {

// The per-pixel record of step 1: (ĝx/count, ĝy/count, their dot product with out, unused).
template <typename acc_t>
struct alignas(4 * sizeof(acc_t)) GradientTerms {
  acc_t x, y, w, unused;
};

// grad_output (B, 2, H, W) with any strides: an expanded (`.sum().backward()`) or transposed
// gradient is read in place, without a copy.
template <typename scalar_t>
struct GradView {
  const scalar_t* data;
  int64_t batch_stride, channel_stride, row_stride, column_stride;
  REDET_HOST_DEVICE scalar_t at(int64_t b, int channel, int y, int x) const {
    return data[b * batch_stride + channel * channel_stride + y * row_stride + x * column_stride];
  }
};

template <typename acc_t>
REDET_HOST_DEVICE GradientTerms<acc_t> pixel_terms(acc_t grad_x, acc_t grad_y, acc_t out_x,
                                                   acc_t out_y, acc_t count) {
  if (!(count > acc_t(0))) return {acc_t(0), acc_t(0), acc_t(0), acc_t(0)};  // a hole
  const acc_t inv = acc_t(1) / count;
  const acc_t ax = grad_x * inv, ay = grad_y * inv;
  return {ax, ay, ax * out_x + ay * out_y, acc_t(0)};
}

template <typename acc_t>
REDET_HOST_DEVICE void add_terms(GradientTerms<acc_t>* sum, const GradientTerms<acc_t>& t) {
  sum->x += t.x;
  sum->y += t.y;
  sum->w += t.w;
}

// The rows and columns of the four pixels a source reached, in the scatter's order:
// (L,T) (R,T) (L,B) (R,B).
struct ReachedPixels {
  int y[4], x[4];
};

REDET_HOST_DEVICE ReachedPixels reached_pixels(const ProjectionCorners& c) {
  return {{c.top, c.top, c.bottom, c.bottom}, {c.left, c.right, c.left, c.right}};
}

// Step 2 for one source pixel, from S (the sum of its reached pixels' terms). A source that
// landed nowhere (outside, or a flow that is not finite) gets zero, whatever G is. The depth
// gradient is with respect to w; the caller converts it to depth.
template <typename acc_t>
REDET_HOST_DEVICE void source_gradient(bool landed, acc_t t, acc_t gx, acc_t gy, acc_t w,
                                       const GradientTerms<acc_t>& s, acc_t* grad_fx,
                                       acc_t* grad_fy, acc_t* grad_w) {
  if (!landed) {
    *grad_fx = *grad_fy = *grad_w = acc_t(0);
    return;
  }
  *grad_fx = -t * w * s.x;
  *grad_fy = -t * w * s.y;
  *grad_w = -(gx * s.x + gy * s.y + s.w);
}

// A source pixel's weight, 0 when its depth input is invalid (depth_is_valid): such a pixel
// contributed nothing (check_depth=False, or in a CUDA graph) and gets no gradient.
template <typename acc_t>
REDET_HOST_DEVICE acc_t source_weight(acc_t depth, bool inverse_depth, bool* valid) {
  *valid = depth_is_valid(depth, inverse_depth);
  return *valid ? projection_weight(depth, inverse_depth) : acc_t(0);
}

// The gradient with respect to the depth input as given: w itself, or D with w = 1/D (dw/dD = −w²).
template <typename acc_t>
REDET_HOST_DEVICE acc_t depth_gradient(acc_t grad_w, acc_t w, bool inverse_depth) {
  return inverse_depth ? grad_w : -grad_w * w * w;
}

// ---- backward of the hole filling ----
//
// The gradient ĝ(x) reaching each non-hole x's projected value.
//
// A filled hole h is the mean of the nearest non-holes found to its left, right, top and bottom
// (n(h) of them, count(h) = −n(h): depth_flow_projection_math.h), so it passes u(h) = grad(h)/n(h)
// back to each of them, and
//   ĝ(x) = grad(x) + Σ u over the runs of holes next to x: left, right, above and below.
// All holes of one maximal run in a row share the same left and right non-holes (likewise in a
// column), so each run's total goes to its (up to) two bounding non-holes. Runs are summed in
// 32 x 32 tiles, two passes over the image:
//   1. summaries: each tile sweeps each of its rows and columns once (sweep_line) and records,
//      per row segment and per column segment: whether it has a non-hole (a bit word), the sum
//      of u before its first non-hole (head) and after its last one (tail; both the whole
//      segment's sum when it has no non-hole);
//   2. per tile again: the same sweeps add the runs inside the tile to their bounds, then the
//      first and last non-hole of each row and column add the rest of their outer run from the
//      neighbouring segments' summaries (sum_until_non_hole: tails to the left or above, heads to
//      the right or below, up to the segment with a non-hole).
// Each hole is read a bounded number of times, in coalesced tiles, however long its runs; the
// order of every addition is fixed, so the result is deterministic, and the CPU and CUDA
// kernels, which make the same calls in the same order, agree bit for bit.
//
// A tile's cells (row r, column c at cells[r·kRunTileStride + c]) hold u(h) for a hole and, for
// a non-hole, its running ĝ (grad(x) to begin with). Holes' cells are only read; a non-hole's
// cell is only added to.

constexpr int kRunTile = 32;          // tiles of kRunTile x kRunTile pixels (a warp's 32 lanes)
constexpr int kRunTileStride = kRunTile + 1;  // padded: a row and a column hit distinct banks

REDET_HOST_DEVICE int run_tiles_of(int length) { return (length + kRunTile - 1) / kRunTile; }

// Where tile `tile` (row-major over (b, tile row, tile column)) lies, and its size.
struct RunTileCoords {
  int64_t b;
  int tile_row, tile_column, y0, x0, n_rows, n_columns;
};

REDET_HOST_DEVICE RunTileCoords run_tile_coords(int64_t tile, int height, int width) {
  const int tile_rows = run_tiles_of(height), tile_columns = run_tiles_of(width);
  RunTileCoords t;
  t.tile_column = static_cast<int>(tile % tile_columns);
  const int64_t image_tile_row = tile / tile_columns;
  t.b = image_tile_row / tile_rows;
  t.tile_row = static_cast<int>(image_tile_row - t.b * tile_rows);
  t.y0 = t.tile_row * kRunTile;
  t.x0 = t.tile_column * kRunTile;
  t.n_rows = height - t.y0 < kRunTile ? height - t.y0 : kRunTile;
  t.n_columns = width - t.x0 < kRunTile ? width - t.x0 : kRunTile;
  return t;
}

template <typename acc_t>
struct alignas(2 * sizeof(acc_t)) GradPair {
  acc_t x, y;
  REDET_HOST_DEVICE void add(const GradPair& o) {
    x += o.x;
    y += o.y;
  }
};

template <typename acc_t>
REDET_HOST_DEVICE GradPair<acc_t> zero_pair() {
  return {acc_t(0), acc_t(0)};
}

// A hole's share u(h) = grad(h)/n(h), from its stored count −n(h); 0 if it found nothing (then
// it bounds no run: nothing reaches it).
template <typename acc_t>
REDET_HOST_DEVICE GradPair<acc_t> hole_share(acc_t grad_x, acc_t grad_y, acc_t count) {
  const acc_t n = -count;
  if (!(n > acc_t(0))) return zero_pair<acc_t>();
  return {grad_x / n, grad_y / n};
}

// The initial cell of pixel with gradient (grad_x, grad_y) and stored count.
template <typename acc_t>
REDET_HOST_DEVICE GradPair<acc_t> initial_cell(acc_t grad_x, acc_t grad_y, acc_t count) {
  return count > acc_t(0) ? GradPair<acc_t>{grad_x, grad_y} : hole_share(grad_x, grad_y, count);
}

// What one line (row or column) segment of a tile looks like from outside: the sums of u before
// its first non-hole and after its last (both the whole segment's sum without a non-hole) and
// the positions of those non-holes (-1: none).
template <typename acc_t>
struct LineRuns {
  GradPair<acc_t> head, tail;
  int first, last;
};

// One line of n >= 1 cells (cell k at cells[k·stride]; bit k of non_holes set for a non-hole), in
// order: each run between two non-holes is added to both (to the right one when reached, then
// to the left one); the part before the first non-hole is added to it, the part after the last
// to that one. Returns the line's LineRuns.
template <typename acc_t>
REDET_HOST_DEVICE LineRuns<acc_t> sweep_line(GradPair<acc_t>* cells, int stride,
                                             uint32_t non_holes, int n) {
  LineRuns<acc_t> runs{zero_pair<acc_t>(), zero_pair<acc_t>(), -1, -1};
  if (non_holes == (n >= 32 ? ~0u : (1u << n) - 1u)) {  // no holes (common): nothing to add
    runs.first = 0;
    runs.last = n - 1;
    return runs;
  }
  GradPair<acc_t> run = zero_pair<acc_t>();
  for (int k = 0; k < n; ++k) {
    GradPair<acc_t>& cell = cells[k * stride];
    if (!((non_holes >> k) & 1u)) {
      run.add(cell);
      continue;
    }
    cell.add(run);  // the run to its left
    if (runs.last >= 0) {
      cells[runs.last * stride].add(run);  // ... is also the run to the right of the last non-hole
    } else {
      runs.head = run;
      runs.first = k;
    }
    runs.last = k;
    run = zero_pair<acc_t>();
  }
  runs.tail = run;
  if (runs.last >= 0) {
    cells[runs.last * stride].add(run);
  } else {
    runs.head = run;
  }
  return runs;
}

// Bit k of the result: the non-hole bit of column c in row k (row_bits[k], k < n).
REDET_HOST_DEVICE uint32_t column_bits(const uint32_t* row_bits, int c, int n) {
  uint32_t bits = 0;
  for (int k = 0; k < n; ++k) bits |= ((row_bits[k] >> c) & 1u) << k;
  return bits;
}

// The summaries of pass 1. Row segments (b, y, tile column) and column segments
// (b, tile row, x): `words` non-zero when the segment has a non-hole (its non-hole bits),
// `heads`, `tails` as in LineRuns.
template <typename acc_t>
struct RunSummaries {
  uint32_t* row_words;
  GradPair<acc_t>* row_heads;
  GradPair<acc_t>* row_tails;
  uint32_t* column_words;
  GradPair<acc_t>* column_heads;
  GradPair<acc_t>* column_tails;
  int height, width;

  REDET_HOST_DEVICE int tile_rows() const { return run_tiles_of(height); }
  REDET_HOST_DEVICE int tile_columns() const { return run_tiles_of(width); }
  // Segment 0 of row y / of column x; the segments of a row are 1 apart, of a column `width`.
  REDET_HOST_DEVICE int64_t row(int64_t b, int y) const {
    return (b * height + y) * tile_columns();
  }
  REDET_HOST_DEVICE int64_t column(int64_t b, int x) const {
    return b * tile_rows() * static_cast<int64_t>(width) + x;
  }
  static int64_t row_segments(int64_t batch, int height, int width) {
    return batch * height * run_tiles_of(width);
  }
  static int64_t column_segments(int64_t batch, int height, int width) {
    return batch * run_tiles_of(height) * static_cast<int64_t>(width);
  }
};

// Sum of values[k·stride] for the segments k = start, start + step, ... inside [0, count),
// nearest first, up to and including the first segment with a non-hole (words[k·stride] != 0).
// Loads kBatch segments at a time (independent loads: a long run costs few round trips).
template <typename acc_t>
REDET_HOST_DEVICE GradPair<acc_t> sum_until_non_hole(const uint32_t* words,
                                                     const GradPair<acc_t>* values,
                                                     int64_t stride, int start, int step,
                                                     int count) {
  constexpr int kBatch = 4;
  GradPair<acc_t> sum = zero_pair<acc_t>();
  for (int k0 = start; k0 >= 0 && k0 < count; k0 += kBatch * step) {
    uint32_t word[kBatch];
    GradPair<acc_t> value[kBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kBatch; ++i) {
      const int k = k0 + i * step;
      const bool inside = k >= 0 && k < count;
      word[i] = inside ? words[k * stride] : 1u;
      value[i] = inside ? values[k * stride] : zero_pair<acc_t>();
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < kBatch; ++i) {
      sum.add(value[i]);  // (zero past the ends, whose word 1 ends the walk)
      if (word[i] != 0) return sum;
    }
  }
  return sum;
}

// Pass 2: the parts of the outer runs of the row segment (b, y, tile column tc) beyond the
// tile, for its first non-hole (`before`) and its last (`after`); zero where there is none.
template <typename acc_t>
REDET_HOST_DEVICE void row_outer_runs(const RunSummaries<acc_t>& s, int64_t b, int y, int tc,
                                      const LineRuns<acc_t>& runs, GradPair<acc_t>* before,
                                      GradPair<acc_t>* after) {
  *before = *after = zero_pair<acc_t>();
  if (runs.first < 0) return;  // no non-hole: the runs through it end elsewhere
  const int64_t row = s.row(b, y);
  const int count = s.tile_columns();
  *before = sum_until_non_hole(s.row_words + row, s.row_tails + row, 1, tc - 1, -1, count);
  *after = sum_until_non_hole(s.row_words + row, s.row_heads + row, 1, tc + 1, 1, count);
}

// The same for the column segment (b, tile row tr, x): above its first non-hole, below its last.
template <typename acc_t>
REDET_HOST_DEVICE void column_outer_runs(const RunSummaries<acc_t>& s, int64_t b, int tr, int x,
                                         const LineRuns<acc_t>& runs, GradPair<acc_t>* above,
                                         GradPair<acc_t>* below) {
  *above = *below = zero_pair<acc_t>();
  if (runs.first < 0) return;
  const int64_t column = s.column(b, x);
  const int count = s.tile_rows();
  *above = sum_until_non_hole(s.column_words + column, s.column_tails + column, s.width, tr - 1,
                              -1, count);
  *below = sum_until_non_hole(s.column_words + column, s.column_heads + column, s.width, tr + 1,
                              1, count);
}

}  // namespace redet
