// Depth-aware flow projection's forward on CUDA (the backward:
// depth_flow_projection_backward.cu).
// Forward, three launches without hole filling, four with it, and at most one host
// synchronisation:
// (0) one kernel zeroes the accumulators (sum_x, sum_y, count, -) and the hole masks and, when
//     checking depth, flags invalid values (in pinned host memory: common/cuda/host_flag.cuh);
// (1) scatter every source pixel into them (one whose depth is invalid adds nothing): one atomic
//     per source pixel, into its corner only (corner_sums.cuh; a 16-byte float4 atomic on sm_90,
//     where DAIN issues three scalar ones for each of four pixels); in deterministic mode 64-bit
//     fixed point with integer atomics instead (order-independent, bitwise repeatable);
// (2) without hole filling one elementwise normalisation; with it two kernels
//     (hole_fill_kernels.cuh, which says why): a tiled normalisation that also writes 1-bit
//     non-hole masks by rows and by columns, then one that fills each hole from its nearest
//     non-holes (depth_flow_projection_math.h's arithmetic), found in the masks;
// (3) when checking depth, an event is recorded right after (0); once (2) is enqueued the host
//     waits for that event only (the only sync, overlapping (1) and (2)) and runs the host check,
//     which names the first bad value, only if the flag is set. The check is in the first kernel
//     (costing a second read of depth) because at small sizes the host is the bottleneck: the
//     time from the wait's return to the caller's next CUDA call is longer than (2) alone, so a
//     flag known only after (1) left the GPU idle. While a CUDA graph is captured nothing is
//     checked and nothing waits (capturing_cuda_graph()).
#include <ATen/OpMathType.h>

#include <optional>
#include <type_traits>

#include "common/cuda/host_flag.cuh"
#include "common/cuda_utils.cuh"
#include "depth_flow_projection/cuda/corner_sums.cuh"
#include "depth_flow_projection/cuda/hole_fill_kernels.cuh"
#include "depth_flow_projection/depth_flow_projection.h"
#include "depth_flow_projection/depth_flow_projection_math.h"

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

// ---- zero the workspace, check depth --------------------------------------------------------

// Blocks [0, zero_blocks) zero `units` 16-byte words of the workspace; the others (only when
// checking) set *invalid_depth, once per block, if any of the n depth values is invalid.
// Separate blocks rather than both jobs in every thread: an interleaved loop in every thread is
// slower.
template <typename scalar_t>
__global__ void zero_and_check_kernel(uint4* __restrict__ workspace, int64_t units,
                                      int zero_blocks, const scalar_t* __restrict__ depth,
                                      int64_t n, bool inverse_depth, int* invalid_depth) {
  if (static_cast<int>(blockIdx.x) < zero_blocks) {
    const int64_t stride = static_cast<int64_t>(zero_blocks) * blockDim.x;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < units;
         i += stride) {
      workspace[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    return;  // (block-uniform)
  }
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x - zero_blocks) * blockDim.x;
  bool bad = false;
  for (int64_t i = (blockIdx.x - zero_blocks) * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < n; i += stride) {
    bad |= !depth_is_valid(static_cast<acc_t>(depth[i]), inverse_depth);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *invalid_depth = 1;
}

// Source pixels handled by one lane: a column of kScatterRows rows of a row strip.
constexpr int kScatterRows = 4;

// A warp takes 32 neighbouring source pixels of each row of a strip of kScatterRows rows (lane =
// column), so there are no index divisions per pixel and a lane's loads are in flight together.
// Each source pixel that lands inside the image adds (−w·G, w) to its corner (L, T) only, one
// atomic (corner_sums.cuh says how the pixels' sums come back from the corners).
template <typename scalar_t, typename acc_t, typename Accumulator>
__global__ void scatter_kernel(const scalar_t* __restrict__ flow, const scalar_t* __restrict__ depth,
                               int64_t batch, int height, int width, acc_t t, bool inverse_depth,
                               Accumulator accumulator) {
  const int64_t plane = static_cast<int64_t>(height) * width;
  const int lane = threadIdx.x & 31;
  const int column_groups = (width + 31) / 32;
  const int strips = (height + kScatterRows - 1) / kScatterRows;
  const int64_t items = batch * strips * column_groups;
  const int64_t warps = static_cast<int64_t>(blockDim.x / 32) * gridDim.x;
  for (int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
       item < items; item += warps) {
    const int group = static_cast<int>(item % column_groups);
    const int64_t strip_of_batch = item / column_groups;
    const int64_t b = strip_of_batch / strips;
    const int y0 = static_cast<int>(strip_of_batch - b * strips) * kScatterRows;
    const int x = group * 32 + lane;
    if (x >= width) continue;
    const int rows = min(kScatterRows, height - y0);
    const scalar_t* flow_x = flow + b * 2 * plane;
    const scalar_t* flow_y = flow_x + plane;
    const scalar_t* depth_b = depth + b * plane;
    acc_t gx[kScatterRows], gy[kScatterRows], d[kScatterRows];
#pragma unroll
    for (int r = 0; r < kScatterRows; ++r) {
      const int64_t i = static_cast<int64_t>(y0 + r) * width + x;
      const bool inside = r < rows;
      gx[r] = inside ? t * static_cast<acc_t>(flow_x[i]) : acc_t(0);
      gy[r] = inside ? t * static_cast<acc_t>(flow_y[i]) : acc_t(0);
      d[r] = inside ? static_cast<acc_t>(depth_b[i]) : acc_t(1);
    }
#pragma unroll
    for (int r = 0; r < kScatterRows; ++r) {
      if (r >= rows) break;
      ProjectionCorners c;
      if (depth_is_valid(d[r], inverse_depth) &&
          project_pixel(x, y0 + r, gx[r], gy[r], width, height, &c)) {
        const acc_t w = projection_weight(d[r], inverse_depth);
        accumulator.add(b * plane + static_cast<int64_t>(c.top) * width + c.left, -w * gx[r],
                        -w * gy[r], w);
      }
    }
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
};

struct DoubleSlots : PlainSlots<double> {
  using calc_type = double;
  __device__ __forceinline__ DoubleSlots bind() const { return *this; }
};

// 64-bit fixed point (deterministic mode).
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
};

// ---- normalise without hole filling -------------------------------------------------------

// Thread = pixel; grid-stride over the image rows (no index division per pixel).
template <typename scalar_t, typename count_t, typename Slots>
__global__ void normalize_kernel(Slots slots_arg, int64_t batch, int height, int width,
                                 scalar_t* __restrict__ out, count_t* __restrict__ count) {
  using calc_t = typename Slots::calc_type;
  const Slots slots = slots_arg.bind();
  const int64_t plane = static_cast<int64_t>(height) * width;
  for (int64_t image_row = blockIdx.y; image_row < batch * height; image_row += gridDim.y) {
    const int64_t b = image_row / height;
    const int y = static_cast<int>(image_row - b * height);
    for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < width; x += blockDim.x * gridDim.x) {
      const Sums<calc_t> s = pixel_sums<calc_t>(slots, b * plane, x, y, width, height);
      const auto p = project_slot<count_t>(s.x, s.y, s.c);  // a hole gives (0, 0, 0)
      const int64_t i = image_row * width + x;
      out[i + b * plane] = static_cast<scalar_t>(p.x);  // (b, 0, y, x) of the output
      out[i + b * plane + plane] = static_cast<scalar_t>(p.y);
      count[i] = p.count;
    }
  }
}

// ---- host ---------------------------------------------------------------------------------

// Upper bounds of any pixel's count and |sum|, on the device: each source adds to a pixel at most
// 4 times (the corner case), so 4·H·W·max(w) and that times t·max|F|, w over the valid depth
// values only (the others contribute nothing: depth_is_valid).
at::Tensor fixed_point_bounds(const at::Tensor& flow, const at::Tensor& depth, double t,
                              bool inverse_depth) {
  const double per_pixel = 4.0 * static_cast<double>(flow.size(2) * flow.size(3));
  const auto d = depth.to(at::kDouble);
  const auto valid = inverse_depth ? d.ge(0).logical_and(at::isfinite(d)) : d.gt(0);
  const auto w = inverse_depth ? d : d.reciprocal();
  const auto w_max = at::where(valid, w, at::zeros_like(w)).amax();
  const auto f = flow.to(at::kDouble).abs();
  const auto f_max = at::where(at::isfinite(f), f, at::zeros_like(f)).amax();
  const auto count_bound = w_max * per_pixel;
  return at::stack({count_bound, count_bound * f_max * t});
}

// What the scatter and the finalisation share, zeroed by zero_and_check_kernel: the accumulators
// (4 values per pixel, so a multiple of 16 bytes), then (when filling) the hole masks' words,
// their summaries last.
struct Workspace {
  at::Tensor acc;
  uint32_t* mask_words;  // HoleMasks::in's `words`; its summaries follow them
};

Workspace workspace_for(int64_t pixels, int64_t mask_words, const at::TensorOptions& options) {
  const int64_t slot_bytes =
      4 * static_cast<int64_t>(c10::elementSize(options.dtype().toScalarType()));
  const int64_t mask_slots = (mask_words * 4 + slot_bytes - 1) / slot_bytes;
  auto acc = at::empty({pixels + mask_slots, 4}, options);
  return {acc, reinterpret_cast<uint32_t*>(static_cast<char*>(acc.data_ptr()) + pixels * slot_bytes)};
}

// Normalisation, or the two kernels of the hole filling.
template <typename scalar_t, typename count_t, typename Slots>
void launch_finalize(const Slots& slots, const FlowProjectionForward& io, bool fill_holes,
                     uint32_t* mask_words, cudaStream_t stream) {
  scalar_t* out = io.output.data_ptr<scalar_t>();
  count_t* count = io.count.data_ptr<count_t>();
  if (!fill_holes) {
    const dim3 grid((io.width + kThreads - 1) / kThreads,
                    static_cast<unsigned>(std::min<int64_t>(io.batch * io.height, 65535)));
    normalize_kernel<scalar_t, count_t><<<grid, kThreads, 0, stream>>>(slots, io.batch, io.height,
                                                                      io.width, out, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  // The non-hole masks (hole_fill_kernels.cuh), zeroed, in the workspace.
  const HoleMasks masks = HoleMasks::in(mask_words, io.batch, io.height, io.width);
  const int64_t tiles = io.batch * chunks_of(io.height) * chunks_of(io.width);
  // Few tiles (448 at (4, 2, 256, 448)): four warps share each, so that the multiprocessors have
  // enough loads in flight; two warps per block, or most multiprocessors would idle.
  const int warps_per_tile = tiles < 8 * multiprocessor_count() ? 4 : 1;
  // float output of fixed-point sums: the non-holes' unrounded values, for the fill
  using calc_t = typename Slots::calc_type;
  at::Tensor exact;
  if constexpr (keeps_unrounded_copy<scalar_t, calc_t>) {
    exact = at::empty({io.batch * io.height * io.width, 2},
                      io.output.options().dtype(c10::CppTypeToScalarType<calc_t>::value));
  }
  calc_t* exact_data = exact.defined() ? exact.data_ptr<calc_t>() : nullptr;
  constexpr int kMarkThreads = 2 * kWarp;
  const int mark_blocks = blocks_for(tiles * warps_per_tile * kWarp, kMarkThreads);
  mark_tiles_kernel<scalar_t, count_t><<<mark_blocks, kMarkThreads, 0, stream>>>(
      slots, io.batch, io.height, io.width, warps_per_tile, out, count, masks, exact_data);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t chunk_items = io.batch * io.height * chunks_of(io.width);  // a warp each
  fill_holes_kernel<scalar_t, count_t><<<blocks_for(chunk_items * kWarp), kThreads, 0, stream>>>(
      slots, masks, io.batch, io.height, io.width, out, count, exact_data);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

FlowProjectionResult depth_flow_projection_forward_cuda(const at::Tensor& flow_,
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
  const int64_t scatter_warps = io.batch * ((io.height + kScatterRows - 1) / kScatterRows) *
                                ((io.width + 31) / 32);  // one per work item of scatter_kernel
  const int scatter_blocks = blocks_for(scatter_warps * 32);
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const auto acc_type = deterministic ? at::kLong : flow_projection_acc_type(flow.scalar_type());
  const auto workspace = workspace_for(
      n, fill_holes ? HoleMasks::word_count(io.batch, io.height, io.width) : 0,
      flow.options().dtype(acc_type));
  const at::Tensor& acc = workspace.acc;
  const int64_t zero_units = static_cast<int64_t>(acc.nbytes() / sizeof(uint4));
  // Checked eager calls only: the flag is asked once the fill is enqueued. In a CUDA graph nothing
  // is checked (a host wait is illegal there): invalid depth values contribute nothing.
  const bool check_on_device = check_depth && !capturing_cuda_graph();
  std::optional<HostFlag> depth_flag;
  if (check_on_device) depth_flag.emplace(flow.device().index());

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, flow.scalar_type(), "depth_flow_projection_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int zero_blocks = blocks_for(zero_units);
    const int check_blocks = check_on_device ? blocks_for(n) : 0;
    zero_and_check_kernel<scalar_t><<<zero_blocks + check_blocks, kThreads, 0, stream>>>(
        static_cast<uint4*>(acc.data_ptr()), zero_units, zero_blocks, depth.data_ptr<scalar_t>(), n,
        inverse_depth, depth_flag ? depth_flag->device_word() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (depth_flag) depth_flag->arm(stream);
    auto scatter = [&](auto accumulator) {
      scatter_kernel<scalar_t, acc_t><<<scatter_blocks, kThreads, 0, stream>>>(
          flow.data_ptr<scalar_t>(), depth.data_ptr<scalar_t>(), io.batch, io.height, io.width,
          static_cast<acc_t>(t), inverse_depth, accumulator);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (deterministic) {
      const auto bound = fixed_point_bounds(flow, depth, t, inverse_depth);
      long long* a = reinterpret_cast<long long*>(acc.data_ptr<int64_t>());
      scatter(FixedPointAccumulator{a, bound.data_ptr<double>()});
      launch_finalize<scalar_t, acc_t>(FixedPointSlots{a, bound.data_ptr<double>(), 0.0, 0.0}, io,
                                       fill_holes, workspace.mask_words, stream);
    } else if constexpr (std::is_same_v<acc_t, double>) {
      scatter(DoubleAccumulator{acc.data_ptr<double>()});
      launch_finalize<scalar_t, acc_t>(DoubleSlots{{acc.data_ptr<double>()}}, io, fill_holes,
                                       workspace.mask_words, stream);
    } else {
      scatter(FloatAccumulator{acc.data_ptr<float>()});
      launch_finalize<scalar_t, acc_t>(FloatSlots{acc.data_ptr<float>()}, io, fill_holes,
                                       workspace.mask_words, stream);
    }
  });
  if (depth_flag && depth_flag->is_set()) {
    check_depth_values(depth, inverse_depth, op);  // names the first bad value
  }
  return {io.output, io.count};
}

}  // namespace redet
