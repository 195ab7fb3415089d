// Depth-aware flow projection on the CPU. The scatter runs image by image (parallel over the batch),
// visiting source pixels in raster order, so it is deterministic. Normalisation and the hole
// filling's row pass run parallel over rows, its column pass parallel over columns (the linear
// sweeps of depth_flow_projection_math.h). The backward (depth_flow_projection_backward_math.h)
// forms per-pixel terms, over 32 x 32 tiles with hole filling, then gathers them per source pixel,
// parallel over rows: the CUDA kernels' steps, so both compute the same sums in the same order.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include "depth_flow_projection/depth_flow_projection.h"
#include "depth_flow_projection/depth_flow_projection_backward_math.h"
#include "depth_flow_projection/depth_flow_projection_math.h"

namespace redet {
namespace {

// Row pass of the hole filling (depth_flow_projection_math.h), or plain normalisation without it:
// output and count of every non-hole; left + right partial sums of the holes.
template <typename scalar_t, typename acc_t>
void normalize_rows(const PlainSlots<acc_t>& slots, int64_t batch, int height, int width,
                    bool fill_holes, scalar_t* out, acc_t* count) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t row = r * width;                      // slot of (b, y, 0)
      scalar_t* out_row = out + (r / height) * plane + row;  // (b, 0, y, 0) of the output
      for (int x = 0; x < width; ++x) {
        const auto p = load_projected<acc_t, acc_t>(slots, row + x);  // a hole gives (0, 0, 0)
        out_row[x] = static_cast<scalar_t>(p.x);
        out_row[plane + x] = static_cast<scalar_t>(p.y);
        count[row + x] = p.count;
      }
      if (!fill_holes) continue;
      for_each_hole_run(
          0, width, -1, -1,
          [&](int x0) { return hole_word(count + row, 1, x0, width); },
          [&](int first, int stop, int left, int right) {
            const auto l =
                projected_value_at<scalar_t, acc_t>(slots, left >= 0 ? row + left : -1);
            const auto r_ =
                projected_value_at<scalar_t, acc_t>(slots, right >= 0 ? row + right : -1);
            for (int x = first; x < stop; ++x) store_row_partial(slots, count, row + x, l, r_);
          });
    }
  });
}

// Column pass of the hole filling: top + bottom, the mean, output and count of the holes.
template <typename scalar_t, typename acc_t>
void fill_columns(const PlainSlots<acc_t>& slots, int64_t batch, int height, int width,
                  scalar_t* out, acc_t* count) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * width, 16, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t b = c / width;
      const int64_t column = b * plane + (c - b * width);  // slot of (b, 0, x)
      for_each_hole_run(
          0, height, -1, -1,
          [&](int y0) { return hole_word(count + column, width, y0, height); },
          [&](int first, int stop, int top, int bottom) {
            fill_column_run<scalar_t, acc_t, acc_t>(slots, count, out + b * plane + column, plane,
                                                    column, width, first, stop, top, bottom);
          });
    }
  });
}

}  // namespace

FlowProjectionResult depth_flow_projection_forward_cpu(const at::Tensor& flow_,
                                                       const at::Tensor& depth_, double t,
                                                       bool inverse_depth, bool fill_holes,
                                                       bool check_depth) {
  constexpr const char* op = "depth_flow_projection";
  check_depth_flow_projection_args(flow_, depth_, t, op);
  if (check_depth) check_depth_values(depth_, inverse_depth, op);
  const auto io = prepare_flow_projection_forward(flow_, depth_);
  const at::Tensor &flow = io.flow, &depth = io.depth, &output = io.output, &count = io.count;
  const int64_t batch = io.batch;
  const int height = io.height, width = io.width;
  const int64_t plane = static_cast<int64_t>(height) * width;
  if (flow.numel() == 0) return {output, count};
  const auto acc_type = flow_projection_acc_type(flow.scalar_type());
  auto acc = at::zeros({batch, height, width, 4}, flow.options().dtype(acc_type));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* f = flow.data_ptr<scalar_t>();
    const scalar_t* d = depth.data_ptr<scalar_t>();
    acc_t* a = acc.data_ptr<acc_t>();
    const acc_t tt = static_cast<acc_t>(t);
    at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const scalar_t* fx = f + b * 2 * plane;
        const scalar_t* dd = d + b * plane;
        acc_t* ab = a + b * plane * 4;
        for (int y = 0; y < height; ++y) {
          for (int x = 0; x < width; ++x) {
            const int64_t i = static_cast<int64_t>(y) * width + x;
            const acc_t gx = tt * static_cast<acc_t>(fx[i]);
            const acc_t gy = tt * static_cast<acc_t>(fx[plane + i]);
            const acc_t depth_value = static_cast<acc_t>(dd[i]);
            ProjectionCorners c;
            if (!depth_is_valid(depth_value, inverse_depth) ||
                !project_pixel(x, y, gx, gy, width, height, &c)) {
              continue;
            }
            const acc_t w = projection_weight(depth_value, inverse_depth);
            const int xs[4] = {c.left, c.right, c.left, c.right};
            const int ys[4] = {c.top, c.top, c.bottom, c.bottom};
            for (int k = 0; k < 4; ++k) {
              acc_t* target = ab + 4 * (static_cast<int64_t>(ys[k]) * width + xs[k]);
              target[0] -= w * gx;
              target[1] -= w * gy;
              target[2] += w;
            }
          }
        }
      }
    });

    const PlainSlots<acc_t> slots{a};
    scalar_t* out = output.data_ptr<scalar_t>();
    acc_t* cnt = count.data_ptr<acc_t>();
    normalize_rows(slots, batch, height, width, fill_holes, out, cnt);
    if (fill_holes) fill_columns(slots, batch, height, width, out, cnt);
  });
  return {output, count};
}

namespace {

// ---- backward: terms per pixel (over tiles with hole filling), then the gather per source pixel

template <typename scalar_t, typename acc_t>
void pixel_terms_cpu(const GradView<scalar_t>& grad, const scalar_t* out, const acc_t* count,
                     int64_t batch, int height, int width, GradientTerms<acc_t>* terms) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / height;
      const int y = static_cast<int>(r - b * height);
      const scalar_t* out_row = out + b * plane + r * width;  // (b, 0, y, 0)
      for (int x = 0; x < width; ++x) {
        terms[r * width + x] = pixel_terms(
            static_cast<acc_t>(grad.at(b, 0, y, x)), static_cast<acc_t>(grad.at(b, 1, y, x)),
            static_cast<acc_t>(out_row[x]), static_cast<acc_t>(out_row[plane + x]),
            count[r * width + x]);
      }
    }
  });
}

// One tile of the hole filling's backward: what a CUDA warp keeps in shared memory and
// registers, filled by the same calls in the same order (cuda/depth_flow_projection_backward.cu).
template <typename acc_t>
struct RunTile {
  GradPair<acc_t> cells[kRunTile * kRunTileStride];
  uint32_t rows[kRunTile];  // non-hole bits per row
  LineRuns<acc_t> row_runs[kRunTile], column_runs[kRunTile];
  RunTileCoords at;

  // Loads the tile's cells and sweeps its rows, then its columns.
  template <typename scalar_t>
  RunTile(int64_t tile, const GradView<scalar_t>& grad, const acc_t* count, int height,
          int width)
      : at(run_tile_coords(tile, height, width)) {
    for (int r = 0; r < at.n_rows; ++r) {
      const int y = at.y0 + r;
      uint32_t bits = 0;
      for (int c = 0; c < at.n_columns; ++c) {
        const int x = at.x0 + c;
        const acc_t cnt = count[(at.b * height + y) * width + x];
        cells[r * kRunTileStride + c] =
            initial_cell(static_cast<acc_t>(grad.at(at.b, 0, y, x)),
                         static_cast<acc_t>(grad.at(at.b, 1, y, x)), cnt);
        if (cnt > acc_t(0)) bits |= 1u << c;
      }
      rows[r] = bits;
    }
    for (int r = 0; r < at.n_rows; ++r) {
      row_runs[r] = sweep_line(cells + r * kRunTileStride, 1, rows[r], at.n_columns);
    }
    for (int c = 0; c < at.n_columns; ++c) {
      column_runs[c] =
          sweep_line(cells + c, kRunTileStride, column_bits(rows, c, at.n_rows), at.n_rows);
    }
  }
};

// Pass 1: each tile's row and column segment summaries.
template <typename scalar_t, typename acc_t>
void run_summaries_cpu(const GradView<scalar_t>& grad, const acc_t* count, int64_t batch,
                       int height, int width, const RunSummaries<acc_t>& s) {
  const int64_t tiles = batch * run_tiles_of(height) * run_tiles_of(width);
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const RunTile<acc_t> t(tile, grad, count, height, width);
      const RunTileCoords& at = t.at;
      for (int r = 0; r < at.n_rows; ++r) {
        const int64_t i = s.row(at.b, at.y0 + r) + at.tile_column;
        s.row_words[i] = t.rows[r];
        s.row_heads[i] = t.row_runs[r].head;
        s.row_tails[i] = t.row_runs[r].tail;
      }
      for (int c = 0; c < at.n_columns; ++c) {
        const int64_t i = s.column(at.b, at.x0 + c) + static_cast<int64_t>(at.tile_row) * width;
        s.column_words[i] = column_bits(t.rows, c, at.n_rows);
        s.column_heads[i] = t.column_runs[c].head;
        s.column_tails[i] = t.column_runs[c].tail;
      }
    }
  });
}

// Pass 2: each tile's cells completed with the outer runs (rows first, then columns), then
// their terms.
template <typename scalar_t, typename acc_t>
void filled_terms_cpu(const GradView<scalar_t>& grad, const scalar_t* out, const acc_t* count,
                      int64_t batch, int height, int width, const RunSummaries<acc_t>& s,
                      GradientTerms<acc_t>* terms) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int64_t tiles = batch * run_tiles_of(height) * run_tiles_of(width);
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      RunTile<acc_t> t(tile, grad, count, height, width);
      const RunTileCoords& at = t.at;
      for (int r = 0; r < at.n_rows; ++r) {
        GradPair<acc_t> before, after;
        const LineRuns<acc_t>& runs = t.row_runs[r];
        row_outer_runs(s, at.b, at.y0 + r, at.tile_column, runs, &before, &after);
        if (runs.first < 0) continue;
        t.cells[r * kRunTileStride + runs.first].add(before);
        t.cells[r * kRunTileStride + runs.last].add(after);
      }
      for (int c = 0; c < at.n_columns; ++c) {
        GradPair<acc_t> above, below;
        const LineRuns<acc_t>& runs = t.column_runs[c];
        column_outer_runs(s, at.b, at.tile_row, at.x0 + c, runs, &above, &below);
        if (runs.first < 0) continue;
        t.cells[runs.first * kRunTileStride + c].add(above);
        t.cells[runs.last * kRunTileStride + c].add(below);
      }
      for (int r = 0; r < at.n_rows; ++r) {
        const int64_t row = (at.b * height + at.y0 + r) * width + at.x0;  // (b, y, x0) of count
        const scalar_t* out_row = out + at.b * plane + row;              // (b, 0, y, x0)
        for (int c = 0; c < at.n_columns; ++c) {
          const GradPair<acc_t>& g = t.cells[r * kRunTileStride + c];
          terms[row + c] = pixel_terms(g.x, g.y, static_cast<acc_t>(out_row[c]),
                                       static_cast<acc_t>(out_row[plane + c]), count[row + c]);
        }
      }
    }
  });
}

// Gather per source pixel (parallel over rows).
template <typename scalar_t, typename acc_t>
void source_gradient_cpu(const scalar_t* flow, const scalar_t* depth,
                         const GradientTerms<acc_t>* terms, int64_t batch, int height, int width,
                         acc_t t, bool inverse_depth, scalar_t* grad_flow, scalar_t* grad_depth) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  at::parallel_for(0, batch * height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / height;
      const int y = static_cast<int>(r - b * height);
      const GradientTerms<acc_t>* terms_b = terms + b * plane;
      for (int x = 0; x < width; ++x) {
        const int64_t i = r * width + x;           // (b, y, x) of depth
        const int64_t fi = b * plane + i;          // (b, 0, y, x) of flow
        const acc_t gx = t * static_cast<acc_t>(flow[fi]);
        const acc_t gy = t * static_cast<acc_t>(flow[fi + plane]);
        bool valid;
        const acc_t w = source_weight(static_cast<acc_t>(depth[i]), inverse_depth, &valid);
        GradientTerms<acc_t> sum{acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
        ProjectionCorners c;
        const bool landed = valid && project_pixel(x, y, gx, gy, width, height, &c);
        if (landed) {
          const ReachedPixels p = reached_pixels(c);
          for (int k = 0; k < 4; ++k) {
            add_terms(&sum, terms_b[static_cast<int64_t>(p.y[k]) * width + p.x[k]]);
          }
        }
        acc_t gfx, gfy, gw;
        source_gradient(landed, t, gx, gy, w, sum, &gfx, &gfy, &gw);
        grad_flow[fi] = static_cast<scalar_t>(gfx);
        grad_flow[fi + plane] = static_cast<scalar_t>(gfy);
        grad_depth[i] = static_cast<scalar_t>(depth_gradient(gw, w, inverse_depth));
      }
    }
  });
}

}  // namespace

FlowProjectionResult depth_flow_projection_backward_cpu(
    const at::Tensor& grad_, const at::Tensor& flow_, const at::Tensor& depth_,
    const at::Tensor& output_, const at::Tensor& count_, double t, bool inverse_depth,
    bool fill_holes) {
  check_depth_flow_projection_backward_args(grad_, flow_, depth_, output_, count_, t);
  const auto io = prepare_flow_projection_backward(grad_, flow_, depth_, output_, count_);
  const int64_t batch = io.batch;
  const int height = io.height, width = io.width;
  if (io.flow.numel() == 0) return {io.grad_flow, io.grad_depth};
  const auto workspace = allocate_flow_backward_workspace(io, fill_holes);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, io.flow.scalar_type(), "depth_flow_projection_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto grad = grad_view<scalar_t>(io.grad);
    const scalar_t* out = io.output.data_ptr<scalar_t>();
    const acc_t* count = io.count.data_ptr<acc_t>();
    GradientTerms<acc_t>* terms = workspace.terms<acc_t>();
    if (fill_holes) {
      const auto summaries = workspace.summaries<acc_t>();
      run_summaries_cpu(grad, count, batch, height, width, summaries);
      filled_terms_cpu(grad, out, count, batch, height, width, summaries, terms);
    } else {
      pixel_terms_cpu(grad, out, count, batch, height, width, terms);
    }
    source_gradient_cpu(io.flow.data_ptr<scalar_t>(), io.depth.data_ptr<scalar_t>(), terms,
                        batch, height, width, static_cast<acc_t>(t), inverse_depth,
                        io.grad_flow.data_ptr<scalar_t>(), io.grad_depth.data_ptr<scalar_t>());
  });
  return {io.grad_flow, io.grad_depth};
}

}  // namespace redet
