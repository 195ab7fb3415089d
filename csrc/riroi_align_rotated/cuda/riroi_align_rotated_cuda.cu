// RiRoIAlignRotated on CUDA (single- and multi-level share these kernels; single = one level).
//
// Forward: one thread per (channel group, RoI, bin) computes all nO outputs of the bin: at each
// sample point the bilinear taps are computed once and the nO orientation channels are read once
// (the peer computes taps per output and reads 2 channels per output: 2x the loads). Work is
// ordered group-major so one group's planes stay in L2 while every RoI reads them.
//
// Backward: one thread per (group, RoI, bin, input orientation j). The gradient is scattered into
// a scratch buffer laid out [level][n][group][pixel][j] so the nO threads of one bin hit nO
// adjacent words (one or two sectors per warp request instead of nO scattered planes), then one
// pass converts the scratch into the (N, C, H, W) gradients of every level. Fast path: float
// atomics (double for double). Deterministic mode: 64-bit fixed point with integer atomics
// (order-independent sums, bitwise repeatable), scaled by sum |grad_output|, which bounds every
// input's total since each output's weights onto the input sum to <= 1.
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <vector>

#include "common/cuda_utils.cuh"
#include "common/riroi_geometry.h"
#include "riroi_align_rotated/riroi_align_rotated.h"

namespace redet {
namespace {

constexpr const char* kOp = "riroi_align_rotated";
constexpr const char* kMultiOp = "riroi_align_rotated_multilevel";

struct KernelOptions {
  int out_h, out_w, num_samples, num_orientations;
  bool clockwise, legacy;
};

KernelOptions kernel_options(const RiRoIOptions& o) {
  return {static_cast<int>(o.out_h), static_cast<int>(o.out_w), static_cast<int>(o.num_samples),
          static_cast<int>(o.num_orientations), o.clockwise, o.legacy_orientation};
}

// Level and image of RoI k; false for indices the host checks rejected (a guard, not a path).
template <typename scalar_t>
__device__ __forceinline__ bool roi_level_and_image(const scalar_t* roi, const int64_t* roi_levels,
                                                    int64_t k, int num_levels, int batch_size,
                                                    int* level, int* image) {
  const int64_t l = roi_levels ? roi_levels[k] : 0;
  const float n = static_cast<float>(roi[0]);
  if (l < 0 || l >= num_levels || !(n >= 0.f && n < static_cast<float>(batch_size))) return false;
  *level = static_cast<int>(l);
  *image = static_cast<int>(n);
  return true;
}

// ------------------------------------------ forward ------------------------------------------
// R[m] accumulates input orientation (m - shift) mod NO: the rotation is applied when loading,
// so the register array is only indexed by compile-time constants (no local-memory spill).
template <typename scalar_t, int NO>
__global__ void __launch_bounds__(kThreads)
forward_kernel(FeatureLevels<scalar_t, at::opmath_type<scalar_t>> levels,
               const scalar_t* __restrict__ rois, const int64_t* __restrict__ roi_levels,
               int64_t num_rois, int groups, int batch_size, KernelOptions opt,
               scalar_t* __restrict__ output) {
  using acc_t = at::opmath_type<scalar_t>;
  const int bins = opt.out_h * opt.out_w;
  const int64_t channels = static_cast<int64_t>(groups) * NO;
  const int64_t total = static_cast<int64_t>(groups) * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int bin = static_cast<int>(i % bins);
    const int64_t k = (i / bins) % num_rois;
    const int c = static_cast<int>(i / (bins * num_rois));
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, levels.count, batch_size, &l, &n)) continue;
    const int height = levels.height[l], width = levels.width[l];
    const int64_t plane = static_cast<int64_t>(height) * width;
    const auto g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[l], opt.out_h,
                                                   opt.out_w, opt.num_samples, NO, opt.clockwise);
    const scalar_t* planes = levels.data[l] + (n * channels + static_cast<int64_t>(c) * NO) * plane;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    acc_t rotated[NO];
#pragma unroll
    for (int m = 0; m < NO; ++m) rotated[m] = acc_t(0);
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        acc_t y, x;
        riroi_sample_point(g, ph, pw, iy, ix, &y, &x);
        BilinearTaps<acc_t> t;
        if (!bilinear_taps(height, width, y, x, &t)) continue;
#pragma unroll
        for (int m = 0; m < NO; ++m) {
          const scalar_t* p = planes + ((m - g.shift + NO) % NO) * plane;
          rotated[m] += t.weight[0] * static_cast<acc_t>(p[t.offset[0]]) +
                        t.weight[1] * static_cast<acc_t>(p[t.offset[1]]) +
                        t.weight[2] * static_cast<acc_t>(p[t.offset[2]]) +
                        t.weight[3] * static_cast<acc_t>(p[t.offset[3]]);
        }
      }
    }
    const acc_t keep = acc_t(1) - g.frac;
    scalar_t* out = output + (k * channels + static_cast<int64_t>(c) * NO) * bins + bin;
#pragma unroll
    for (int o = 0; o < NO; ++o) {
      // neighbour_source(o) = main_source(o -/+ 1): the continuous / legacy neighbour
      const acc_t side = opt.legacy ? rotated[(o + 1) % NO] : rotated[(o + NO - 1) % NO];
      out[o * bins] = static_cast<scalar_t>((keep * rotated[o] + g.frac * side) / g.count);
    }
  }
}

// Any nO: one thread per output, reading its two source channels at every sample.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
forward_any_orientations_kernel(FeatureLevels<scalar_t, at::opmath_type<scalar_t>> levels,
                                const scalar_t* __restrict__ rois,
                                const int64_t* __restrict__ roi_levels, int64_t num_rois,
                                int64_t channels, int batch_size, KernelOptions opt,
                                scalar_t* __restrict__ output) {
  using acc_t = at::opmath_type<scalar_t>;
  const int bins = opt.out_h * opt.out_w, num_o = opt.num_orientations;
  const int64_t total = channels * num_rois * bins;
  REDET_CUDA_GRID_STRIDE(i, total) {
    const int bin = static_cast<int>(i % bins);
    const int o = static_cast<int>((i / bins) % num_o);
    const int64_t k = (i / (bins * num_o)) % num_rois;
    const int64_t c = i / (static_cast<int64_t>(bins) * num_o * num_rois);  // group
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, levels.count, batch_size, &l, &n)) continue;
    const int height = levels.height[l], width = levels.width[l];
    const int64_t plane = static_cast<int64_t>(height) * width;
    const auto g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[l], opt.out_h,
                                                   opt.out_w, opt.num_samples, num_o, opt.clockwise);
    const scalar_t* planes = levels.data[l] + (n * channels + c * num_o) * plane;
    const scalar_t* main = planes + main_source(o, g.shift, num_o) * plane;
    const scalar_t* side = planes + neighbour_source(o, g.shift, num_o, opt.legacy) * plane;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    acc_t main_sum = 0, side_sum = 0;
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        acc_t y, x;
        riroi_sample_point(g, ph, pw, iy, ix, &y, &x);
        BilinearTaps<acc_t> t;
        if (!bilinear_taps(height, width, y, x, &t)) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          main_sum += t.weight[q] * static_cast<acc_t>(main[t.offset[q]]);
          side_sum += t.weight[q] * static_cast<acc_t>(side[t.offset[q]]);
        }
      }
    }
    output[(k * channels + c * num_o + o) * bins + bin] =
        static_cast<scalar_t>(((acc_t(1) - g.frac) * main_sum + g.frac * side_sum) / g.count);
  }
}

// ------------------------------------------ backward ------------------------------------------
// Shapes of every level and where its block starts in the scratch buffer, in units of
// (image, group, pixel); the scratch holds nO words per unit.
template <typename acc_t>
struct LevelLayout {
  int count;
  int height[kMaxFeatureLevels];
  int width[kMaxFeatureLevels];
  acc_t spatial_scale[kMaxFeatureLevels];
  int64_t unit_offset[kMaxFeatureLevels + 1];
};

template <typename scalar_t>
struct GradientLevels {
  scalar_t* data[kMaxFeatureLevels];
};

template <typename scalar_t, bool kFixedPoint>
__global__ void __launch_bounds__(kThreads)
backward_scatter_kernel(const scalar_t* __restrict__ grad, const scalar_t* __restrict__ rois,
                        const int64_t* __restrict__ roi_levels, int64_t num_rois, int groups,
                        int batch_size, LevelLayout<at::opmath_type<scalar_t>> layout,
                        KernelOptions opt, at::opmath_type<scalar_t>* __restrict__ float_scratch,
                        long long* __restrict__ fixed_scratch, const double* __restrict__ bound) {
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
    const scalar_t* roi = rois + k * 6;
    int l, n;
    if (!roi_level_and_image(roi, roi_levels, k, layout.count, batch_size, &l, &n)) continue;
    const int height = layout.height[l], width = layout.width[l];
    const auto g = riroi_geometry<scalar_t, acc_t>(roi, layout.spatial_scale[l], opt.out_h,
                                                   opt.out_w, opt.num_samples, num_o, opt.clockwise);
    // Input orientation j feeds two outputs of this bin.
    const scalar_t* grad_bin = grad + (k * channels + static_cast<int64_t>(c) * num_o) * bins + bin;
    const acc_t main = static_cast<acc_t>(grad_bin[main_target(j, g.shift, num_o) * bins]);
    const acc_t side = static_cast<acc_t>(grad_bin[neighbour_target(j, g.shift, num_o, opt.legacy) * bins]);
    const acc_t grad_j = ((acc_t(1) - g.frac) * main + g.frac * side) / g.count;
    if (grad_j == acc_t(0)) continue;
    const int64_t unit = layout.unit_offset[l] +
                         (static_cast<int64_t>(n) * groups + c) * height * static_cast<int64_t>(width);
    const int64_t base = unit * num_o + j;
    const int ph = bin / opt.out_w, pw = bin % opt.out_w;
    for (int iy = 0; iy < g.grid_h; ++iy) {
      for (int ix = 0; ix < g.grid_w; ++ix) {
        acc_t y, x;
        riroi_sample_point(g, ph, pw, iy, ix, &y, &x);
        BilinearTaps<acc_t> t;
        if (!bilinear_taps(height, width, y, x, &t)) continue;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (t.weight[q] == acc_t(0)) continue;  // border clamps give zero-weight taps
          const int64_t index = base + static_cast<int64_t>(t.offset[q]) * num_o;
          if (kFixedPoint) {
            atomic_add_fixed_point(fixed_scratch + index, static_cast<double>(t.weight[q] * grad_j), scale);
          } else {
            atomicAdd(float_scratch + index, t.weight[q] * grad_j);
          }
        }
      }
    }
  }
}

// scratch [level][n][group][pixel][j] -> gradient[level] (N, C, H, W); one thread per unit reads
// its nO contiguous words and writes nO coalesced rows.
template <typename scalar_t, typename scratch_t, bool kFixedPoint>
__global__ void __launch_bounds__(kThreads)
scratch_to_gradients_kernel(const scratch_t* __restrict__ scratch,
                            LevelLayout<at::opmath_type<scalar_t>> layout,
                            GradientLevels<scalar_t> gradients, int num_o,
                            const double* __restrict__ bound) {
  const double scale = kFixedPoint ? fixed_point_scale(*bound) : 1.0;
  const int64_t total = layout.unit_offset[layout.count];
  REDET_CUDA_GRID_STRIDE(u, total) {
    int l = 0;
    while (l + 1 < layout.count && u >= layout.unit_offset[l + 1]) ++l;
    const int64_t plane = static_cast<int64_t>(layout.height[l]) * layout.width[l];
    const int64_t local = u - layout.unit_offset[l];
    const int64_t image_group = local / plane, pixel = local % plane;
    scalar_t* out = gradients.data[l] + image_group * num_o * plane + pixel;
    const scratch_t* in = scratch + u * num_o;
    for (int j = 0; j < num_o; ++j) {
      if (kFixedPoint) {
        out[j * plane] = static_cast<scalar_t>(from_fixed_point(static_cast<long long>(in[j]), scale));
      } else {
        out[j * plane] = static_cast<scalar_t>(in[j]);
      }
    }
  }
}

// ------------------------------------------ host side ------------------------------------------
at::Tensor forward_levels(at::TensorList features_, const at::Tensor& rois_,
                          const at::Tensor& levels_, at::ArrayRef<double> scales,
                          const RiRoIOptions& opt, const char* name, const char* op) {
  check_riroi_forward(features_, rois_, levels_, scales, opt, name, op);
  c10::cuda::CUDAGuard guard(features_[0].device());
  const auto features = contiguous_all(features_);
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_rois = rois.size(0), channels = features[0].size(1);
  const int batch_size = static_cast<int>(features[0].size(0));
  auto output = at::empty({num_rois, channels, opt.out_h, opt.out_w}, features[0].options());
  if (output.numel() == 0) return output;
  const auto kopt = kernel_options(opt);
  const int groups = static_cast<int>(channels / opt.num_orientations);
  const int64_t per_group = num_rois * opt.out_h * opt.out_w;
  const int64_t* roi_levels = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, features[0].scalar_type(),
                                  "riroi_align_rotated_cuda", [&] {
    const auto table = feature_levels<scalar_t, at::opmath_type<scalar_t>>(features, scales);
    const scalar_t* roi_data = rois.data_ptr<scalar_t>();
    scalar_t* out = output.data_ptr<scalar_t>();
    switch (opt.num_orientations) {
      case 8:
        forward_kernel<scalar_t, 8><<<blocks_for(groups * per_group), kThreads, 0, stream>>>(
            table, roi_data, roi_levels, num_rois, groups, batch_size, kopt, out);
        break;
      case 4:
        forward_kernel<scalar_t, 4><<<blocks_for(groups * per_group), kThreads, 0, stream>>>(
            table, roi_data, roi_levels, num_rois, groups, batch_size, kopt, out);
        break;
      default:
        forward_any_orientations_kernel<scalar_t>
            <<<blocks_for(channels * per_group), kThreads, 0, stream>>>(
                table, roi_data, roi_levels, num_rois, channels, batch_size, kopt, out);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return output;
}

std::vector<at::Tensor> backward_levels(const at::Tensor& grad_, const at::Tensor& rois_,
                                        const at::Tensor& levels_, at::ArrayRef<double> scales,
                                        const RiRoIOptions& opt, int64_t batch_size,
                                        int64_t channels, at::IntArrayRef heights,
                                        at::IntArrayRef widths, const char* op) {
  check_riroi_options(opt, op);
  check_riroi_grad(grad_, rois_, channels, opt, op);
  const size_t num_levels = heights.size();
  TORCH_CHECK(widths.size() == num_levels && scales.size() == num_levels && num_levels >= 1 &&
                  num_levels <= kMaxFeatureLevels,
              op, ": heights, widths and spatial_scales must have one entry per level (1 to ",
              kMaxFeatureLevels, " levels)");
  TORCH_CHECK(!levels_.defined() || levels_.device() == rois_.device(), op,
              ": levels must be on the device of rois");
  c10::cuda::CUDAGuard guard(grad_.device());
  const auto grad = grad_.contiguous();  // the peer reads a non-contiguous grad wrongly
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_o = opt.num_orientations, groups = channels / num_o;
  std::vector<at::Tensor> gradients;
  for (size_t l = 0; l < num_levels; ++l) {
    gradients.push_back(at::empty({batch_size, channels, heights[l], widths[l]}, grad.options()));
  }
  if (grad.numel() == 0) {
    for (auto& g : gradients) g.zero_();
    return gradients;
  }
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  const auto acc_dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t* roi_levels = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;
  const auto kopt = kernel_options(opt);
  auto stream = c10::cuda::getCurrentCUDAStream();
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
      layout.unit_offset[l + 1] = layout.unit_offset[l] + batch_size * groups * heights[l] * widths[l];
      outputs.data[l] = gradients[l].data_ptr<scalar_t>();
    }
    const int64_t units = layout.unit_offset[num_levels];
    const int64_t threads = groups * rois.size(0) * opt.out_h * opt.out_w * num_o;
    const scalar_t* grad_data = grad.data_ptr<scalar_t>();
    const scalar_t* roi_data = rois.data_ptr<scalar_t>();
    if (deterministic) {
      auto scratch = at::zeros({units * num_o}, grad.options().dtype(at::kLong));
      auto bound = grad.abs().sum(at::kDouble);
      auto* fixed = reinterpret_cast<long long*>(scratch.data_ptr<int64_t>());
      backward_scatter_kernel<scalar_t, true><<<blocks_for(threads), kThreads, 0, stream>>>(
          grad_data, roi_data, roi_levels, rois.size(0), static_cast<int>(groups),
          static_cast<int>(batch_size), layout, kopt, nullptr, fixed, bound.data_ptr<double>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      scratch_to_gradients_kernel<scalar_t, long long, true>
          <<<blocks_for(units), kThreads, 0, stream>>>(fixed, layout, outputs,
                                                       static_cast<int>(num_o),
                                                       bound.data_ptr<double>());
    } else {
      auto scratch = at::zeros({units * num_o}, grad.options().dtype(acc_dtype));
      backward_scatter_kernel<scalar_t, false><<<blocks_for(threads), kThreads, 0, stream>>>(
          grad_data, roi_data, roi_levels, rois.size(0), static_cast<int>(groups),
          static_cast<int>(batch_size), layout, kopt, scratch.data_ptr<acc_t>(), nullptr, nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      scratch_to_gradients_kernel<scalar_t, acc_t, false>
          <<<blocks_for(units), kThreads, 0, stream>>>(scratch.data_ptr<acc_t>(), layout, outputs,
                                                       static_cast<int>(num_o), nullptr);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return gradients;
}

at::Tensor riroi_align_rotated_cuda(const at::Tensor& input, const at::Tensor& rois,
                                    double spatial_scale, int64_t out_h, int64_t out_w,
                                    int64_t num_samples, int64_t num_orientations, bool clockwise,
                                    bool legacy_orientation) {
  const RiRoIOptions opt{out_h, out_w, num_samples, num_orientations, clockwise, legacy_orientation};
  return forward_levels({input}, rois, at::Tensor(), {spatial_scale}, opt, "input", kOp);
}

at::Tensor riroi_align_rotated_backward_cuda(const at::Tensor& grad, const at::Tensor& rois,
                                             double spatial_scale, int64_t num_samples,
                                             int64_t num_orientations, bool clockwise,
                                             bool legacy_orientation, int64_t batch_size,
                                             int64_t channels, int64_t height, int64_t width) {
  const RiRoIOptions opt{grad.dim() == 4 ? grad.size(2) : 0, grad.dim() == 4 ? grad.size(3) : 0,
                         num_samples, num_orientations, clockwise, legacy_orientation};
  return backward_levels(grad, rois, at::Tensor(), {spatial_scale}, opt, batch_size, channels,
                         {height}, {width}, "_riroi_align_rotated_backward")[0];
}

at::Tensor riroi_align_rotated_multilevel_cuda(at::TensorList features, const at::Tensor& rois,
                                               const at::Tensor& levels,
                                               at::ArrayRef<double> spatial_scales, int64_t out_h,
                                               int64_t out_w, int64_t num_samples,
                                               int64_t num_orientations, bool clockwise,
                                               bool legacy_orientation) {
  const RiRoIOptions opt{out_h, out_w, num_samples, num_orientations, clockwise, legacy_orientation};
  return forward_levels(features, rois, levels, spatial_scales, opt, "features", kMultiOp);
}

std::vector<at::Tensor> riroi_align_rotated_multilevel_backward_cuda(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
    bool clockwise, bool legacy_orientation, int64_t batch_size, int64_t channels,
    at::IntArrayRef heights, at::IntArrayRef widths) {
  constexpr const char* op = "_riroi_align_rotated_multilevel_backward";
  const RiRoIOptions opt{grad.dim() == 4 ? grad.size(2) : 0, grad.dim() == 4 ? grad.size(3) : 0,
                         num_samples, num_orientations, clockwise, legacy_orientation};
  TORCH_CHECK(levels.dim() == 1 && levels.size(0) == rois.size(0) &&
                  levels.scalar_type() == at::kLong,
              op, ": levels must be an int64 tensor of shape (K,)");
  return backward_levels(grad, rois, levels, spatial_scales, opt, batch_size, channels, heights,
                         widths, op);
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, CUDA, m) {
  m.impl("riroi_align_rotated", &riroi_align_rotated_cuda);
  m.impl("_riroi_align_rotated_backward", &riroi_align_rotated_backward_cuda);
  m.impl("riroi_align_rotated_multilevel", &riroi_align_rotated_multilevel_cuda);
  m.impl("_riroi_align_rotated_multilevel_backward", &riroi_align_rotated_multilevel_backward_cuda);
}

}  // namespace redet
