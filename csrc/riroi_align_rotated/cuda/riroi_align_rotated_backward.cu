// RiRoIAlignRotated's backward on CUDA (single- and multi-level share these kernels; single = one
// level). The forward: riroi_align_rotated_forward.cu.
//
// Backward (nO <= 32): the forward's mapping run backwards, a channels-last scatter. One warp per
// (RoI, channel chunk), lane = channel, as in the forward. Per bin, input orientation j (the
// lane's) feeds two outputs of its group, main_target(j) with weight 1 - frac and
// neighbour_target(j) with weight frac (riroi_align_rotated_math.h); the warp loads the chunk's
// grad_output once per 32 bins through a ChannelTile (coalesced: grad_output is (K, C, bins), bins
// contiguous) and each lane takes its two outputs from its group's lanes by shuffles. Then every
// tap is one atomic request of 32 adjacent words: the chunk's channels of one pixel of a scratch
// laid out [level][n][pixel][C]. Why a warp per (RoI, chunk): one thread per (group, RoI, bin, j)
// would spread a warp's request over the pixels of 4 bins (nO = 8: 4 lines, 8 words each),
// recompute the RoI geometry and the sample taps in every thread, and read grad_output at 2
// scattered words per thread; here the geometry is computed once per warp (with num_samples == 2
// the taps of 8 bins at once, shared through shared memory, as in the forward), the reads are
// coalesced, and a float request is one 128-byte line. Then one tiled transpose per level
// (channels_last_to_nchw, common/cuda/channels_last.cuh) turns the scratch into the level's (N, C,
// H, W) gradient, converting to its dtype on the way; when the features are channels-last the
// scratch is already the gradients' layout and at most one flat conversion remains. nO > 32 (a group wider than a warp): one
// thread per (group, RoI, bin, j), scattering into a scratch [level][n][group][pixel][j] (nO
// adjacent words per bin).
// Fast path: float atomics (double for double). Deterministic mode: the same mappings with 64-bit
// fixed point and integer atomics (order-independent sums, bitwise repeatable), scaled by
// sum |grad_output|, which bounds every input's total since each output's weights onto the input
// sum to <= 1.
// Bad rows: the RoI check (common/cuda/roi_checks.cuh) is enqueued before the kernels and read
// after them, or skipped in a CUDA graph; every kernel tests each row (roi_level_and_image): the
// backward passes a row that breaks the rules no gradient.
#include <ATen/OpMathType.h>

#include <type_traits>
#include <vector>

#include "common/cuda/channel_tile.cuh"
#include "common/cuda/channels_last.cuh"
#include "common/cuda_utils.cuh"
#include "common/roi_rows.h"
#include "riroi_align_rotated/cuda/kernel_common.cuh"
#include "riroi_align_rotated/riroi_align_rotated.h"
#include "riroi_align_rotated/riroi_align_rotated_math.h"

namespace redet {
namespace {

// One sample's bilinear taps, computed by one lane and read by the whole warp (shared memory).
// The offsets are in bytes of the channels-last map (pixel offset * channels * element size),
// multiplied once here: a load then costs one 64-bit add.
template <typename acc_t>
struct alignas(16) SharedTaps {
  int64_t byte_offset[4];  // byte_offset[0] < 0: the sample is off the map and reads nothing
  acc_t weight[4];
};

// The backward's taps (the forward's fixed grid has compute_byte_taps): lane `lane` computes
// sample lane % kSamples (row-major in the bin's grid) of bin first + lane / kSamples. element_t:
// the words of the channels-last scratch the byte offsets address.
template <int kGrid, typename element_t, typename acc_t>
__device__ __forceinline__ void compute_shared_taps(const RiRoIGeometry<acc_t>& g, int first,
                                                    int bins, int out_w, int height, int width,
                                                    int channels, int lane,
                                                    SharedTaps<acc_t>* taps) {
  constexpr int kSamples = kGrid * kGrid;
  const int bin = first + lane / kSamples, s = lane % kSamples;
  if (lane >= (kWarp / kSamples) * kSamples || bin >= bins) return;
  BilinearTaps<acc_t> t;
  SharedTaps<acc_t> entry{};
  if (sample_taps(g, bin / out_w, bin % out_w, s / kGrid, s % kGrid, height, width, &t)) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      entry.byte_offset[q] = static_cast<int64_t>(t.offset[q]) * channels *
                             static_cast<int64_t>(sizeof(element_t));
      entry.weight[q] = t.weight[q];
    }
  } else {
    entry.byte_offset[0] = -1;
  }
  taps[lane] = entry;
}

// Shapes of every level and where its block starts in the scratch buffer. Both scratch layouts
// hold N * C * H * W words per level: [n][pixel][C] (channels-last kernel) or [n][group][pixel][nO]
// (nO > 32).
template <typename acc_t>
struct LevelLayout {
  int count;
  int height[kMaxFeatureLevels];
  int width[kMaxFeatureLevels];
  acc_t spatial_scale[kMaxFeatureLevels];
  int64_t word_offset[kMaxFeatureLevels + 1];  // scratch words before each level
};

template <typename scalar_t>
struct GradientLevels {
  scalar_t* data[kMaxFeatureLevels];
};

// Scratch accumulators: float (double for double), or int64 fixed point in deterministic mode.
template <typename scalar_t, bool kFixedPoint>
using ScratchType = std::conditional_t<kFixedPoint, long long, at::opmath_type<scalar_t>>;

__device__ __forceinline__ void scratch_add(float* word, float value, double) {
  atomicAdd(word, value);
}
__device__ __forceinline__ void scratch_add(double* word, double value, double) {
  atomicAdd(word, value);
}
template <typename acc_t>
__device__ __forceinline__ void scratch_add(long long* word, acc_t value, double scale) {
  atomic_add_fixed_point(word, static_cast<double>(value), scale);
}

// Scatters one bin's gradient `grad` of the lane's channel onto the taps of its samples (any grid,
// walked by every lane; warp-uniform). `lane_scratch` points at the lane's channel of pixel 0 of
// the image, pixels `channels` words apart. Zero weights (border clamps) and lanes with
// write == false add nothing.
template <typename scratch_t, typename acc_t>
__device__ __forceinline__ void any_grid_bin_scatter(const RiRoIGeometry<acc_t>& g, int ph, int pw,
                                                     int height, int width,
                                                     scratch_t* __restrict__ lane_scratch,
                                                     int64_t channels, acc_t grad, bool write,
                                                     double scale) {
  for (int iy = 0; iy < g.grid_h; ++iy) {
    for (int ix = 0; ix < g.grid_w; ++ix) {
      BilinearTaps<acc_t> t;
      if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        if (write && t.weight[q] != acc_t(0)) {
          scratch_add(lane_scratch + t.offset[q] * channels, t.weight[q] * grad, scale);
        }
      }
    }
  }
}

// The same with the bin's kSamples taps computed once for the warp (compute_shared_taps, byte
// offsets into the scratch).
template <int kSamples, typename scratch_t, typename acc_t>
__device__ __forceinline__ void shared_taps_bin_scatter(const SharedTaps<acc_t>* taps,
                                                        scratch_t* __restrict__ lane_scratch,
                                                        acc_t grad, bool write, double scale) {
  char* lane_bytes = reinterpret_cast<char*>(lane_scratch);
#pragma unroll
  for (int s = 0; s < kSamples; ++s) {
    const SharedTaps<acc_t> t = taps[s];
    if (t.byte_offset[0] < 0) continue;  // off the map (warp-uniform)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (write && t.weight[q] != acc_t(0)) {
        scratch_add(reinterpret_cast<scratch_t*>(lane_bytes + t.byte_offset[q]),
                    t.weight[q] * grad, scale);
      }
    }
  }
}

// The forward's mapping run backwards: one warp per (RoI, channel chunk), lane = channel. Per tile
// of up to 32 bins the warp loads the chunk's grad_output rows coalesced (ChannelTile::load); per
// bin each lane (input orientation j of its group) takes the two outputs that read it from its
// group's lanes by shuffles, then adds its share at every tap: one atomic request covers the
// chunk's adjacent channels of one pixel of the channels-last scratch [level][n][pixel][C].
// kGrid as in the forward (2: the taps of 8 bins shared through shared memory; 0: any grid).
template <typename scalar_t, bool kFixedPoint, int kGrid>
__global__ void __launch_bounds__(kWarp * channels_last_warps_per_block<scalar_t>(), 3)
backward_channels_last_kernel(const scalar_t* __restrict__ grad,
                              const scalar_t* __restrict__ rois,
                              const int64_t* __restrict__ roi_levels, int64_t num_rois,
                              int channels, int batch_size,
                              LevelLayout<at::opmath_type<scalar_t>> layout, KernelOptions opt,
                              ScratchType<scalar_t, kFixedPoint>* __restrict__ scratch,
                              const double* __restrict__ bound) {
  using acc_t = at::opmath_type<scalar_t>;
  using scratch_t = ScratchType<scalar_t, kFixedPoint>;
  constexpr int kWarps = channels_last_warps_per_block<scalar_t>();
  constexpr int kSamples = kGrid * kGrid;
  __shared__ __align__(16) unsigned char tile_memory[channels_last_tile_bytes<scalar_t>()];
  __shared__ SharedTaps<acc_t> shared_taps[kWarps][kGrid > 0 ? kWarp : 1];
  const double scale = kFixedPoint ? fixed_point_scale(*bound) : 1.0;
  const ChunkLane c = chunk_lane(channels, opt.num_orientations);
  const int lane = c.lane;
  ChannelTile<scalar_t> tile = warp_tile<scalar_t>(tile_memory, c.warp);
  SharedTaps<acc_t>* taps = shared_taps[c.warp];
  const int num_o = opt.num_orientations, bins = opt.out_h * opt.out_w;
  const int64_t items = num_rois * c.chunks;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + c.warp; item < items;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const ChunkItem it = chunk_item(item, num_rois, channels, c);
    LevelRoi<acc_t> r;
    if (!level_roi<kGrid>(layout, rois, roi_levels, it.k, batch_size, opt, &r)) continue;
    const RiRoIGeometry<acc_t>& g = r.g;
    // The lanes holding the two outputs that read this lane's input orientation.
    const int main_lane = c.group_lane + main_target(c.orientation, g.shift, num_o);
    const int side_lane =
        c.group_lane + neighbour_target(c.orientation, g.shift, num_o, opt.legacy);
    const acc_t keep = acc_t(1) - g.frac;
    const scalar_t* grad_chunk = grad + (it.k * channels + it.chunk_start) * bins;
    const int64_t image_words = static_cast<int64_t>(r.image) * r.height * r.width * channels;
    scratch_t* lane_scratch =
        scratch + layout.word_offset[r.level] + image_words + it.chunk_start + lane;
    // Gradient reaching this lane's input channel from bin `slot` of the loaded tile (the CPU
    // kernel's expression); 0 on idle lanes. All lanes must call it (shuffles).
    auto source_grad = [&](int slot) {
      const acc_t v = it.active ? static_cast<acc_t>(tile.get(lane, slot)) : acc_t(0);
      const acc_t main = __shfl_sync(kFullWarpMask, v, main_lane);
      const acc_t side = __shfl_sync(kFullWarpMask, v, side_lane);
      return (keep * main + g.frac * side) / g.count;
    };
    for (int tile_first = 0; tile_first < bins; tile_first += kWarp) {
      const int tile_bins = min(kWarp, bins - tile_first);
      tile.load(grad_chunk + tile_first, it.chunk_channels, tile_bins, bins, lane);
      if constexpr (kGrid > 0) {
        constexpr int kBinsPerPass = kWarp / kSamples;
        static_assert(kWarp % kBinsPerPass == 0, "a pass of bins must not straddle two tiles");
        for (int first = tile_first; first < tile_first + tile_bins; first += kBinsPerPass) {
          compute_shared_taps<kGrid, scratch_t>(g, first, bins, opt.out_w, r.height, r.width,
                                                channels, lane, taps);
          __syncwarp();
          const int pass_bins = min(kBinsPerPass, tile_first + tile_bins - first);
          for (int j = 0; j < pass_bins; ++j) {
            const acc_t grad_j = source_grad(first - tile_first + j);
            const bool write = it.active && grad_j != acc_t(0);
            if (!__any_sync(kFullWarpMask, write)) continue;
            shared_taps_bin_scatter<kSamples>(taps + j * kSamples, lane_scratch, grad_j, write,
                                              scale);
          }
          __syncwarp();  // the next pass rewrites the taps
        }
      } else {
        for (int slot = 0; slot < tile_bins; ++slot) {
          const int bin = tile_first + slot;
          const acc_t grad_j = source_grad(slot);
          const bool write = it.active && grad_j != acc_t(0);
          if (!__any_sync(kFullWarpMask, write)) continue;
          any_grid_bin_scatter(g, bin / opt.out_w, bin % opt.out_w, r.height, r.width,
                               lane_scratch, static_cast<int64_t>(channels), grad_j, write, scale);
        }
      }
    }
  }
}

// nO > 32: one thread per (group, RoI, bin, input orientation j), scattering into a scratch laid
// out [level][n][group][pixel][j] so that the nO threads of one bin hit nO adjacent words.
template <typename scalar_t, bool kFixedPoint>
__global__ void __launch_bounds__(kThreads)
backward_any_orientations_kernel(const scalar_t* __restrict__ grad,
                                 const scalar_t* __restrict__ rois,
                                 const int64_t* __restrict__ roi_levels, int64_t num_rois,
                                 int groups, int batch_size,
                                 LevelLayout<at::opmath_type<scalar_t>> layout, KernelOptions opt,
                                 ScratchType<scalar_t, kFixedPoint>* __restrict__ scratch,
                                 const double* __restrict__ bound) {
  using acc_t = at::opmath_type<scalar_t>;
  const double scale = kFixedPoint ? fixed_point_scale(*bound) : 1.0;
  const int bins = opt.out_h * opt.out_w, num_o = opt.num_orientations;
  const int64_t channels = static_cast<int64_t>(groups) * num_o;
  const int64_t total = static_cast<int64_t>(groups) * num_rois * bins * num_o;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int j = static_cast<int>(i % num_o);
    const int64_t rest = i / num_o;
    const int bin = static_cast<int>(rest % bins);
    const int64_t k = (rest / bins) % num_rois;
    const int c = static_cast<int>(rest / (static_cast<int64_t>(bins) * num_rois));
    LevelRoi<acc_t> r;
    if (!level_roi<0>(layout, rois, roi_levels, k, batch_size, opt, &r)) continue;
    const RiRoIGeometry<acc_t>& g = r.g;
    // Input orientation j feeds two outputs of this bin.
    const scalar_t* grad_bin = grad + (k * channels + static_cast<int64_t>(c) * num_o) * bins + bin;
    const acc_t main = static_cast<acc_t>(grad_bin[main_target(j, g.shift, num_o) * bins]);
    const acc_t side = static_cast<acc_t>(grad_bin[neighbour_target(j, g.shift, num_o, opt.legacy) * bins]);
    const acc_t grad_j = ((acc_t(1) - g.frac) * main + g.frac * side) / g.count;
    if (grad_j == acc_t(0)) continue;
    const int64_t plane = static_cast<int64_t>(r.height) * r.width;
    const int64_t image_group = static_cast<int64_t>(r.image) * groups + c;
    const int64_t base = layout.word_offset[r.level] + image_group * plane * num_o + j;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        BilinearTaps<acc_t> t;
        if (!sample_taps(g, ph, pw, iy, ix, r.height, r.width, &t)) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (t.weight[q] == acc_t(0)) continue;  // border clamps give zero-weight taps
          scratch_add(scratch + base + static_cast<int64_t>(t.offset[q]) * num_o,
                      t.weight[q] * grad_j, scale);
        }
      }
    }
  }
}

// nO > 32: scratch [level][n][group][pixel][j] -> gradient[level] (N, C, H, W); one thread per
// (level, n, group, pixel) reads its nO contiguous words and writes nO coalesced rows.
template <typename scalar_t, typename scratch_t, typename Convert>
__global__ void __launch_bounds__(kThreads)
group_scratch_to_gradients_kernel(const scratch_t* __restrict__ scratch,
                                  LevelLayout<at::opmath_type<scalar_t>> layout,
                                  GradientLevels<scalar_t> gradients, int num_o, Convert convert) {
  convert.prepare();
  const int64_t total = layout.word_offset[layout.count] / num_o;
  REDET_CUDA_GRID_STRIDE(u, total) {
    int l = 0;
    while (l + 1 < layout.count && u * num_o >= layout.word_offset[l + 1]) ++l;
    const int64_t plane = static_cast<int64_t>(layout.height[l]) * layout.width[l];
    const int64_t local = u - layout.word_offset[l] / num_o;
    const int64_t image_group = local / plane, pixel = local % plane;
    scalar_t* out = gradients.data[l] + image_group * num_o * plane + pixel;
    const scratch_t* in = scratch + u * num_o;
    for (int j = 0; j < num_o; ++j) out[j * plane] = convert(in[j]);
  }
}

// The backward's kernels for one dtype: the scatter into the zeroed scratch, then its conversion
// into every level's (N, C, H, W) gradient.
template <typename scalar_t>
struct BackwardLaunch {
  const scalar_t* grad;
  const scalar_t* rois;
  const int64_t* roi_levels;
  int64_t num_rois, channels, batch_size;
  LevelLayout<at::opmath_type<scalar_t>> layout;
  KernelOptions opt;
  cudaStream_t stream;

  template <bool kFixedPoint, typename Convert>
  void run(ScratchType<scalar_t, kFixedPoint>* scratch, const double* bound,
           const std::vector<at::Tensor>& gradients, const GradientLevels<scalar_t>& outputs,
           Convert convert) const {
    const int num_o = opt.num_orientations;
    if (num_o <= kWarp) {  // channels-last scatter, scratch [level][n][pixel][C]
      scatter_channels_last<kFixedPoint>(scratch, bound);
      for (int l = 0; l < layout.count; ++l) {
        channels_last_to_nchw<scalar_t>(scratch + layout.word_offset[l], gradients[l], convert,
                                        stream);
      }
    } else {  // scratch [level][n][group][pixel][j]
      const int64_t threads = channels * num_rois * opt.out_h * opt.out_w;
      backward_any_orientations_kernel<scalar_t, kFixedPoint>
          <<<blocks_for(threads), kThreads, 0, stream>>>(
              grad, rois, roi_levels, num_rois, static_cast<int>(channels / num_o),
              static_cast<int>(batch_size), layout, opt, scratch, bound);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      group_scratch_to_gradients_kernel<scalar_t>
          <<<blocks_for(layout.word_offset[layout.count] / num_o), kThreads, 0, stream>>>(
              scratch, layout, outputs, num_o, convert);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  template <bool kFixedPoint>
  void scatter_channels_last(ScratchType<scalar_t, kFixedPoint>* scratch,
                             const double* bound) const {
    constexpr int threads = kWarp * channels_last_warps_per_block<scalar_t>();
    const int lanes = chunk_lanes(opt.num_orientations);
    const int64_t warps = num_rois * ((channels + lanes - 1) / lanes);
    const int blocks = blocks_for(warps * kWarp, threads);
    const int c = static_cast<int>(channels), n = static_cast<int>(batch_size);
    if (opt.num_samples == 2) {  // ReDet's setting: the unrolled 2 x 2 grid
      backward_channels_last_kernel<scalar_t, kFixedPoint, 2><<<blocks, threads, 0, stream>>>(
          grad, rois, roi_levels, num_rois, c, n, layout, opt, scratch, bound);
    } else {
      backward_channels_last_kernel<scalar_t, kFixedPoint, 0><<<blocks, threads, 0, stream>>>(
          grad, rois, roi_levels, num_rois, c, n, layout, opt, scratch, bound);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

}  // namespace

std::vector<at::Tensor> riroi_align_rotated_backward_cuda(
    const at::Tensor& grad_, const at::Tensor& rois_, const at::Tensor& levels_,
    at::ArrayRef<double> scales, const RiRoIOptions& opt, int64_t batch_size, int64_t channels,
    at::IntArrayRef heights, at::IntArrayRef widths, bool channels_last, const char* op) {
  check_riroi_backward(grad_, rois_, levels_, scales, opt, batch_size, channels, heights, widths,
                       op);
  const size_t num_levels = heights.size();
  c10::cuda::CUDAGuard guard(grad_.device());
  const auto grad = grad_.contiguous();  // the peer reads a non-contiguous grad wrongly
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  if (grad.numel() == 0) {
    std::vector<at::Tensor> zeros;
    for (size_t l = 0; l < num_levels; ++l) {
      zeros.push_back(at::empty({batch_size, channels, heights[l], widths[l]},
                                grad.options().memory_format(gradient_format(channels_last)))
                          .zero_());  // (at::zeros takes no memory format)
    }
    return zeros;
  }
  // Channels-last gradients asked for and the channels-last scatter (nO <= 32): its scratch
  // [level][n][pixel][C] already is their layout, so they are views of it (float / double sums)
  // or of its conversion to their dtype in one pass; no transpose.
  const bool scratch_is_result = channels_last && opt.num_orientations <= kWarp;
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const auto acc_dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t* roi_levels = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  const auto kopt = kernel_options(opt);
  auto stream = c10::cuda::getCurrentCUDAStream();
  std::vector<at::Tensor> gradients;
  if (!scratch_is_result) {
    for (size_t l = 0; l < num_levels; ++l) {
      gradients.push_back(at::empty({batch_size, channels, heights[l], widths[l]}, grad.options()));
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(),
                                  "riroi_align_rotated_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    LevelLayout<acc_t> layout{};
    GradientLevels<scalar_t> outputs{};
    layout.count = static_cast<int>(num_levels);
    for (size_t l = 0; l < num_levels; ++l) {
      layout.height[l] = static_cast<int>(heights[l]);
      layout.width[l] = static_cast<int>(widths[l]);
      layout.spatial_scale[l] = static_cast<acc_t>(scales[l]);
      layout.word_offset[l + 1] = layout.word_offset[l] + batch_size * channels * heights[l] * widths[l];
      if (!scratch_is_result) outputs.data[l] = gradients[l].data_ptr<scalar_t>();
    }
    const int64_t words = layout.word_offset[num_levels];
    const BackwardLaunch<scalar_t> launch{grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(),
                                          roi_levels, rois.size(0), channels, batch_size,
                                          layout, kopt, stream};
    // the scatter's sums: int64 fixed point scaled by sum |grad| when deterministic, else float
    // (double for double)
    auto scratch = at::zeros({words}, grad.options().dtype(deterministic ? at::kLong : acc_dtype));
    const auto bound = deterministic ? grad.abs().sum(at::kDouble) : at::Tensor();
    const double* bound_data = deterministic ? bound.data_ptr<double>() : nullptr;
    auto* fixed_point = deterministic ? reinterpret_cast<long long*>(scratch.data_ptr<int64_t>())
                                      : nullptr;
    if (scratch_is_result) {
      at::Tensor sums;
      if (deterministic) {
        launch.template scatter_channels_last<true>(fixed_point, bound_data);
        sums = at::empty({words}, grad.options());
        fixed_point_to_tensor(scratch, bound, sums);
      } else {
        launch.template scatter_channels_last<false>(scratch.data_ptr<acc_t>(), nullptr);
        sums = scratch.to(grad.scalar_type());  // itself for float and double
      }
      for (size_t l = 0; l < num_levels; ++l) {
        gradients.push_back(sums.narrow(0, layout.word_offset[l], layout.word_offset[l + 1] -
                                                                      layout.word_offset[l])
                                .view({batch_size, heights[l], widths[l], channels})
                                .permute({0, 3, 1, 2}));
      }
    } else if (deterministic) {
      launch.template run<true>(fixed_point, bound_data, gradients, outputs,
                                FixedPointTo<scalar_t>{bound_data});
    } else {
      launch.template run<false>(scratch.data_ptr<acc_t>(), nullptr, gradients, outputs,
                                 CastTo<scalar_t>{});
    }
  });
  if (channels_last && !scratch_is_result) {  // nO > 32: the scratch is grouped by field
    for (auto& g : gradients) g = g.contiguous(at::MemoryFormat::ChannelsLast);
  }
  return gradients;
}

}  // namespace redet
