// Backward of the depth-aware flow projection on CUDA: two launches without hole filling, three
// with it, no atomics (deterministic), no memset; all arithmetic is the shared functions of
// depth_flow_projection_backward_math.h, called in the CPU kernel's order.
//   terms (no filling), pixel_terms_kernel: per pixel, one 16-byte record (ĝ/count, ĝ·out/count)
//     from grad_output (read through its strides: no contiguous copy), output and count;
//   terms (filling), run_summaries_kernel then filled_terms_kernel: a warp per 32 x 32 tile, in
//     shared memory; the first records each row and column segment's hole sums, the second
//     adds the runs of holes to the non-holes they were filled from and writes the records;
//   source_gradient_kernel: per source pixel, the records of the (up to four) pixels it reached,
//     four independent vector loads, and its flow and depth gradients.
// Why records: a gather from an incoherent flow (neighbouring sources landing far apart) reads
// one cache sector per reached pixel and plane, so five planes (grad x, y, out x, y, count) cost
// five times the L2 transactions of one record; the records cost one coalesced pass.
#include <ATen/OpMathType.h>
#include <stdint.h>

#include <type_traits>

#include "common/cuda_utils.cuh"
#include "depth_flow_projection/cuda/hole_fill_kernels.cuh"
#include "depth_flow_projection/depth_flow_projection.h"
#include "depth_flow_projection/depth_flow_projection_backward_math.h"
#include "depth_flow_projection/depth_flow_projection_math.h"

namespace redet {

template <typename acc_t>
__device__ __forceinline__ GradientTerms<acc_t> load_terms(const GradientTerms<acc_t>* p) {
  if constexpr (std::is_same_v<acc_t, float>) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    return {v.x, v.y, v.z, v.w};
  } else {
    const double2 a = __ldg(reinterpret_cast<const double2*>(p));
    const double2 b = __ldg(reinterpret_cast<const double2*>(p) + 1);
    return {a.x, a.y, b.x, b.y};
  }
}

template <typename acc_t>
__device__ __forceinline__ void store_terms(GradientTerms<acc_t>* p,
                                            const GradientTerms<acc_t>& t) {
  if constexpr (std::is_same_v<acc_t, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(t.x, t.y, t.w, t.unused);
  } else {
    reinterpret_cast<double2*>(p)[0] = make_double2(t.x, t.y);
    reinterpret_cast<double2*>(p)[1] = make_double2(t.w, t.unused);
  }
}

// ---- terms without hole filling -------------------------------------------------------------

constexpr int kTermsPerLane = 4;  // a warp takes 128 pixels of a row, lane + 32·k

template <typename scalar_t, typename acc_t>
__global__ void pixel_terms_kernel(GradView<scalar_t> grad, const scalar_t* __restrict__ out,
                                   const acc_t* __restrict__ count, int64_t batch, int height,
                                   int width, GradientTerms<acc_t>* __restrict__ terms) {
  constexpr int kSpan = kWarp * kTermsPerLane;
  const int lane = threadIdx.x % kWarp;
  const int spans = (width + kSpan - 1) / kSpan;
  const int64_t plane = static_cast<int64_t>(height) * width;
  REDET_CUDA_WARP_STRIDE(item, batch * height * spans) {
    const int64_t image_row = item / spans;  // b · height + y
    const int x0 = static_cast<int>(item - image_row * spans) * kSpan + lane;
    const int64_t b = image_row / height;
    const int y = static_cast<int>(image_row - b * height);
    const int64_t row = image_row * width;           // (b, y, 0) of count and terms
    const scalar_t* out_row = out + b * plane + row;  // (b, 0, y, 0) of the output
    acc_t gx[kTermsPerLane], gy[kTermsPerLane], ox[kTermsPerLane], oy[kTermsPerLane],
        c[kTermsPerLane];
#pragma unroll
    for (int k = 0; k < kTermsPerLane; ++k) {
      const int x = x0 + k * kWarp;
      c[k] = x < width ? count[row + x] : acc_t(0);
    }
    // A hole's record is zero whatever its gradient and output: not read (a pan's wide hole
    // band then costs its count only).
#pragma unroll
    for (int k = 0; k < kTermsPerLane; ++k) {
      const int x = x0 + k * kWarp;
      const bool needed = x < width && c[k] > acc_t(0);
      gx[k] = needed ? static_cast<acc_t>(grad.at(b, 0, y, x)) : acc_t(0);
      gy[k] = needed ? static_cast<acc_t>(grad.at(b, 1, y, x)) : acc_t(0);
      ox[k] = needed ? static_cast<acc_t>(out_row[x]) : acc_t(0);
      oy[k] = needed ? static_cast<acc_t>(out_row[plane + x]) : acc_t(0);
    }
#pragma unroll
    for (int k = 0; k < kTermsPerLane; ++k) {
      const int x = x0 + k * kWarp;
      if (x < width) store_terms(terms + row + x, pixel_terms(gx[k], gy[k], ox[k], oy[k], c[k]));
    }
  }
}

// ---- terms with hole filling: 32 x 32 tiles (depth_flow_projection_backward_math.h) ----

// Warps per block: each keeps a tile's cells in shared memory (34 KB per block either way).
template <typename acc_t>
constexpr int run_tiles_per_block() {
  return sizeof(acc_t) == 8 ? 2 : 4;
}

template <typename acc_t>
struct SharedRunTile {
  GradPair<acc_t> cells[kRunTile * kRunTileStride];
  uint32_t rows[kRunTile];  // non-hole bits per row
};

constexpr int kRunRowsPerStep = 8;  // rows whose loads a lane has in flight together

// Loads tile `at` into the warp's shared tile (lane = column) and sweeps its rows (lane = row),
// then its columns (lane = column), as RunTile does on the CPU. Returns in registers the runs of
// row `lane`, of column `lane` and column `lane`'s non-hole bits. Ends with the warp in sync.
template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void load_and_sweep_tile(SharedRunTile<acc_t>& tile,
                                                    const RunTileCoords& at,
                                                    const GradView<scalar_t>& grad,
                                                    const acc_t* __restrict__ count, int height,
                                                    int width, int lane,
                                                    LineRuns<acc_t>* row_runs,
                                                    LineRuns<acc_t>* column_runs,
                                                    uint32_t* column_word) {
  const int x = at.x0 + lane;
  const bool column_inside = lane < at.n_columns;
  for (int r0 = 0; r0 < kRunTile; r0 += kRunRowsPerStep) {
    acc_t gx[kRunRowsPerStep], gy[kRunRowsPerStep], c[kRunRowsPerStep];
#pragma unroll
    for (int k = 0; k < kRunRowsPerStep; ++k) {
      const int y = at.y0 + r0 + k;
      const bool inside = column_inside && r0 + k < at.n_rows;
      c[k] = inside ? count[(at.b * height + y) * width + x] : acc_t(0);
      gx[k] = inside ? static_cast<acc_t>(grad.at(at.b, 0, y, x)) : acc_t(0);
      gy[k] = inside ? static_cast<acc_t>(grad.at(at.b, 1, y, x)) : acc_t(0);
    }
#pragma unroll
    for (int k = 0; k < kRunRowsPerStep; ++k) {
      const int r = r0 + k;
      const bool inside = column_inside && r < at.n_rows;
      const uint32_t word = __ballot_sync(kAllLanes, inside && c[k] > acc_t(0));
      if (lane == 0) tile.rows[r] = word;  // 0 past the tile's rows
      if (inside) tile.cells[r * kRunTileStride + lane] = initial_cell(gx[k], gy[k], c[k]);
    }
  }
  __syncwarp();
  const uint32_t my_row = tile.rows[lane];
  *row_runs = lane < at.n_rows
                  ? sweep_line(tile.cells + lane * kRunTileStride, 1, my_row, at.n_columns)
                  : LineRuns<acc_t>{zero_pair<acc_t>(), zero_pair<acc_t>(), -1, -1};
  *column_word = transpose_bits(my_row, lane);  // (all lanes: shuffles)
  __syncwarp();  // the row sweeps' additions before the column sweeps read and add
  *column_runs = column_inside
                     ? sweep_line(tile.cells + lane, kRunTileStride, *column_word, at.n_rows)
                     : LineRuns<acc_t>{zero_pair<acc_t>(), zero_pair<acc_t>(), -1, -1};
  __syncwarp();
}

// Pass 1: the segment summaries of every tile.
template <typename scalar_t, typename acc_t>
__global__ void run_summaries_kernel(GradView<scalar_t> grad, const acc_t* __restrict__ count,
                                     int64_t batch, int height, int width,
                                     RunSummaries<acc_t> s) {
  constexpr int kTiles = run_tiles_per_block<acc_t>();
  __shared__ SharedRunTile<acc_t> shared[kTiles];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  SharedRunTile<acc_t>& tile = shared[warp];
  const int64_t tiles = batch * run_tiles_of(height) * run_tiles_of(width);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kTiles + warp; t < tiles;
       t += static_cast<int64_t>(gridDim.x) * kTiles) {  // (warp-uniform)
    const RunTileCoords at = run_tile_coords(t, height, width);
    LineRuns<acc_t> row_runs, column_runs;
    uint32_t column_word;
    load_and_sweep_tile(tile, at, grad, count, height, width, lane, &row_runs, &column_runs,
                        &column_word);
    if (lane < at.n_rows) {
      const int64_t i = s.row(at.b, at.y0 + lane) + at.tile_column;
      s.row_words[i] = tile.rows[lane];
      s.row_heads[i] = row_runs.head;
      s.row_tails[i] = row_runs.tail;
    }
    if (lane < at.n_columns) {
      const int64_t i = s.column(at.b, at.x0 + lane) + static_cast<int64_t>(at.tile_row) * width;
      s.column_words[i] = column_word;
      s.column_heads[i] = column_runs.head;
      s.column_tails[i] = column_runs.tail;
    }
    __syncwarp();  // tile.rows read before the next tile overwrites it
  }
}

// Pass 2: each tile's cells completed with the outer runs from the summaries (rows, then
// columns, as on the CPU), then its records.
template <typename scalar_t, typename acc_t>
__global__ void filled_terms_kernel(GradView<scalar_t> grad, const scalar_t* __restrict__ out,
                                    const acc_t* __restrict__ count, int64_t batch, int height,
                                    int width, RunSummaries<acc_t> s,
                                    GradientTerms<acc_t>* __restrict__ terms) {
  constexpr int kTiles = run_tiles_per_block<acc_t>();
  __shared__ SharedRunTile<acc_t> shared[kTiles];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  SharedRunTile<acc_t>& tile = shared[warp];
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int64_t tiles = batch * run_tiles_of(height) * run_tiles_of(width);
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kTiles + warp; t < tiles;
       t += static_cast<int64_t>(gridDim.x) * kTiles) {  // (warp-uniform)
    const RunTileCoords at = run_tile_coords(t, height, width);
    LineRuns<acc_t> row_runs, column_runs;
    uint32_t column_word;
    load_and_sweep_tile(tile, at, grad, count, height, width, lane, &row_runs, &column_runs,
                        &column_word);
    // Lane = row `lane` and column `lane`: both walks' loads in flight together.
    GradPair<acc_t> before, after, above, below;
    row_outer_runs(s, at.b, at.y0 + lane, at.tile_column, row_runs, &before, &after);
    column_outer_runs(s, at.b, at.tile_row, at.x0 + lane, column_runs, &above, &below);
    if (row_runs.first >= 0) {  // (only for lane < n_rows)
      tile.cells[lane * kRunTileStride + row_runs.first].add(before);
      tile.cells[lane * kRunTileStride + row_runs.last].add(after);
    }
    __syncwarp();
    if (column_runs.first >= 0) {  // (only for lane < n_columns)
      tile.cells[column_runs.first * kRunTileStride + lane].add(above);
      tile.cells[column_runs.last * kRunTileStride + lane].add(below);
    }
    __syncwarp();
    const int x = at.x0 + lane;
    if (lane < at.n_columns) {
      for (int r0 = 0; r0 < at.n_rows; r0 += kRunRowsPerStep) {
        acc_t ox[kRunRowsPerStep], oy[kRunRowsPerStep], c[kRunRowsPerStep];
#pragma unroll
        for (int k = 0; k < kRunRowsPerStep; ++k) {
          const int64_t i = (at.b * height + at.y0 + r0 + k) * width + x;  // (b, y, x) of count
          const bool inside = r0 + k < at.n_rows;
          ox[k] = inside ? static_cast<acc_t>(out[at.b * plane + i]) : acc_t(0);
          oy[k] = inside ? static_cast<acc_t>(out[at.b * plane + i + plane]) : acc_t(0);
          c[k] = inside ? count[i] : acc_t(0);
        }
#pragma unroll
        for (int k = 0; k < kRunRowsPerStep; ++k) {
          if (r0 + k >= at.n_rows) break;
          const int64_t i = (at.b * height + at.y0 + r0 + k) * width + x;
          const GradPair<acc_t> g = tile.cells[(r0 + k) * kRunTileStride + lane];
          store_terms(terms + i, pixel_terms(g.x, g.y, ox[k], oy[k], c[k]));
        }
      }
    }
    __syncwarp();  // the cells read before the next tile overwrites them
  }
}

// ---- gather -----------------------------------------------------------------------------------

// A reached pixel's record, addressed by its 32-bit row and column at each load: with the four
// 64-bit indices formed up front the gather needs 78 registers instead of 64, and fewer blocks fit
// on a multiprocessor.
template <typename acc_t>
struct RecordedTerms {
  const GradientTerms<acc_t>* __restrict__ records;
  __device__ __forceinline__ GradientTerms<acc_t> at(int64_t b, int64_t plane, int width, int y,
                                                     int x) const {
    return load_terms(records + b * plane + static_cast<int64_t>(y) * width + x);
  }
};

constexpr int kGatherRows = 2;  // source pixels per lane: a column of a 2-row strip

// A warp takes 32 neighbouring source pixels of each row of a strip (lane = column), as the
// scatter does; a lane has the records of all its reached pixels in flight together. Grid: x
// over column groups (a warp each), y over the strips of the batch (one index division per strip).
template <typename scalar_t, typename acc_t, typename Records>
__global__ void source_gradient_kernel(const scalar_t* __restrict__ flow,
                                       const scalar_t* __restrict__ depth, Records terms,
                                       int64_t batch, int height, int width, acc_t t,
                                       bool inverse_depth, scalar_t* __restrict__ grad_flow,
                                       scalar_t* __restrict__ grad_depth) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int lane = threadIdx.x % kWarp;
  const int warps = blockDim.x / kWarp;
  const int column_groups = (width + kWarp - 1) / kWarp;
  const int strips = (height + kGatherRows - 1) / kGatherRows;
  for (int64_t strip_of_batch = blockIdx.y; strip_of_batch < batch * strips;
       strip_of_batch += gridDim.y) {
    const int64_t b = strip_of_batch / strips;
    const int y0 = static_cast<int>(strip_of_batch - b * strips) * kGatherRows;
    for (int group = blockIdx.x * warps + threadIdx.x / kWarp; group < column_groups;
         group += gridDim.x * warps) {
      const int x = group * kWarp + lane;
      if (x >= width) continue;  // (no warp-wide operations below)
      const int rows = min(kGatherRows, height - y0);
      const scalar_t* flow_x = flow + b * 2 * plane;
      const scalar_t* depth_b = depth + b * plane;
      acc_t gx[kGatherRows], gy[kGatherRows], w[kGatherRows];
      bool valid[kGatherRows];
#pragma unroll
      for (int r = 0; r < kGatherRows; ++r) {
        const int64_t i = static_cast<int64_t>(y0 + r) * width + x;
        const bool inside = r < rows;
        gx[r] = inside ? t * static_cast<acc_t>(flow_x[i]) : acc_t(0);
        gy[r] = inside ? t * static_cast<acc_t>(flow_x[plane + i]) : acc_t(0);
        w[r] = source_weight(inside ? static_cast<acc_t>(depth_b[i]) : acc_t(1), inverse_depth,
                             &valid[r]);
      }
      GradientTerms<acc_t> reached[kGatherRows][4];
      bool landed[kGatherRows];
#pragma unroll
      for (int r = 0; r < kGatherRows; ++r) {
        ProjectionCorners c{0, 0, 0, 0};
        landed[r] = r < rows && valid[r] &&
                    project_pixel(x, y0 + r, gx[r], gy[r], width, height, &c);
        const ReachedPixels p = reached_pixels(c);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          reached[r][k] = landed[r] ? terms.at(b, plane, width, p.y[k], p.x[k])
                                 : GradientTerms<acc_t>{acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
        }
      }
#pragma unroll
      for (int r = 0; r < kGatherRows; ++r) {
        if (r >= rows) break;
        GradientTerms<acc_t> sum{acc_t(0), acc_t(0), acc_t(0), acc_t(0)};
#pragma unroll
        for (int k = 0; k < 4; ++k) add_terms(&sum, reached[r][k]);
        acc_t gfx, gfy, gw;
        source_gradient(landed[r], t, gx[r], gy[r], w[r], sum, &gfx, &gfy, &gw);
        const int64_t i = static_cast<int64_t>(y0 + r) * width + x;
        grad_flow[b * 2 * plane + i] = static_cast<scalar_t>(gfx);
        grad_flow[b * 2 * plane + plane + i] = static_cast<scalar_t>(gfy);
        grad_depth[b * plane + i] = static_cast<scalar_t>(depth_gradient(gw, w[r], inverse_depth));
      }
    }
  }
}

// ---- host -------------------------------------------------------------------------------------

// All of the backward's launches on `stream` (terms, then the gather); `terms` and `summaries`
// from the workspace (depth_flow_projection.h).
template <typename scalar_t, typename acc_t>
void launch_flow_projection_backward(const GradView<scalar_t>& grad, const scalar_t* flow,
                                     const scalar_t* depth, const scalar_t* out,
                                     const acc_t* count, int64_t batch, int height, int width,
                                     double t, bool inverse_depth, bool fill_holes,
                                     GradientTerms<acc_t>* terms,
                                     const RunSummaries<acc_t>& summaries, scalar_t* grad_flow,
                                     scalar_t* grad_depth, cudaStream_t stream) {
  if (fill_holes) {
    constexpr int kTiles = run_tiles_per_block<acc_t>();
    const int64_t tiles = batch * run_tiles_of(height) * run_tiles_of(width);
    const int blocks = blocks_for(tiles * kWarp, kTiles * kWarp);
    run_summaries_kernel<scalar_t, acc_t><<<blocks, kTiles * kWarp, 0, stream>>>(
        grad, count, batch, height, width, summaries);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    filled_terms_kernel<scalar_t, acc_t><<<blocks, kTiles * kWarp, 0, stream>>>(
        grad, out, count, batch, height, width, summaries, terms);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    const int64_t spans = (width + kWarp * kTermsPerLane - 1) / (kWarp * kTermsPerLane);
    pixel_terms_kernel<scalar_t, acc_t><<<blocks_for(batch * height * spans * kWarp), kThreads, 0,
                                          stream>>>(grad, out, count, batch, height, width, terms);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // Up to 8 warps per block, spread evenly over a row's column groups (448 pixels: 2 x 7).
  const int column_groups = (width + kWarp - 1) / kWarp;
  const int column_blocks = (column_groups + kThreads / kWarp - 1) / (kThreads / kWarp);
  const int warps = (column_groups + column_blocks - 1) / column_blocks;
  const int64_t strips = batch * ((height + kGatherRows - 1) / kGatherRows);
  const dim3 grid(column_blocks, static_cast<unsigned>(std::min<int64_t>(strips, 65535)));
  source_gradient_kernel<scalar_t, acc_t><<<grid, warps * kWarp, 0, stream>>>(
      flow, depth, RecordedTerms<acc_t>{terms}, batch, height, width, static_cast<acc_t>(t),
      inverse_depth, grad_flow, grad_depth);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

FlowProjectionResult depth_flow_projection_backward_cuda(
    const at::Tensor& grad_, const at::Tensor& flow_, const at::Tensor& depth_,
    const at::Tensor& output_, const at::Tensor& count_, double t, bool inverse_depth,
    bool fill_holes) {
  check_depth_flow_projection_backward_args(grad_, flow_, depth_, output_, count_, t);
  c10::cuda::CUDAGuard guard(flow_.device());
  const auto io = prepare_flow_projection_backward(grad_, flow_, depth_, output_, count_);
  if (io.flow.numel() == 0) return {io.grad_flow, io.grad_depth};
  const auto workspace = allocate_flow_backward_workspace(io, fill_holes);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, io.flow.scalar_type(), "depth_flow_projection_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    launch_flow_projection_backward<scalar_t, acc_t>(
        grad_view<scalar_t>(io.grad), io.flow.data_ptr<scalar_t>(), io.depth.data_ptr<scalar_t>(),
        io.output.data_ptr<scalar_t>(), io.count.data_ptr<acc_t>(), io.batch, io.height,
        io.width, t, inverse_depth, fill_holes, workspace.terms<acc_t>(),
        workspace.summaries<acc_t>(), io.grad_flow.data_ptr<scalar_t>(),
        io.grad_depth.data_ptr<scalar_t>(), stream);
  });
  return {io.grad_flow, io.grad_depth};
}

}  // namespace redet
