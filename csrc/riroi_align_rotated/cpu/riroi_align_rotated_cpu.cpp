// RiRoIAlignRotated on the CPU (single- and multi-level share one implementation).
// Forward: parallel over (RoI, channel group); each task reads the nO orientation channels of its
// group at every sample point once and forms all nO outputs from the sums.
// Backward: parallel over (level, image, channel group); each task owns its gradient planes and
// visits its RoIs in index order, so it is race-free and bitwise deterministic by construction.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <vector>

#include "common/roi_rows.h"
#include "riroi_align_rotated/riroi_align_rotated.h"
#include "riroi_align_rotated/riroi_align_rotated_math.h"

namespace redet {
namespace {

int64_t level_of(const int64_t* roi_levels, int64_t k) { return roi_levels ? roi_levels[k] : 0; }

template <typename scalar_t>
void forward_kernel(const FeatureLevels<scalar_t, at::opmath_type<scalar_t>>& levels,
                    const scalar_t* rois, const int64_t* roi_levels, int64_t num_rois,
                    int64_t channels, const RiRoIOptions& opt, scalar_t* output) {
  using acc_t = at::opmath_type<scalar_t>;
  const int num_o = static_cast<int>(opt.num_orientations);
  const int out_h = static_cast<int>(opt.out_h), out_w = static_cast<int>(opt.out_w);
  const int64_t groups = channels / num_o, bins = opt.out_h * opt.out_w;
  at::parallel_for(0, num_rois * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sums(num_o);
    for (int64_t kc = begin; kc < end; ++kc) {
      const int64_t k = kc / groups, c = kc % groups;
      const scalar_t* roi = rois + k * 6;
      const int64_t l = level_of(roi_levels, k), n = static_cast<int64_t>(roi[0]);
      const int height = levels.height[l], width = levels.width[l];
      const int64_t plane = static_cast<int64_t>(height) * width;
      const auto g = riroi_geometry<scalar_t, acc_t>(roi, levels.spatial_scale[l], out_h, out_w,
                                                     static_cast<int>(opt.num_samples), num_o,
                                                     opt.clockwise);
      const scalar_t* planes = levels.data[l] + (n * channels + c * num_o) * plane;
      scalar_t* out = output + (k * channels + c * num_o) * bins;
      for (int ph = 0; ph < out_h; ++ph) {
        for (int pw = 0; pw < out_w; ++pw) {
          std::fill(sums.begin(), sums.end(), acc_t(0));
          for (int iy = 0; iy < g.grid_h; ++iy) {
            for (int ix = 0; ix < g.grid_w; ++ix) {
              BilinearTaps<acc_t> t;
              if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
              for (int j = 0; j < num_o; ++j) {
                const scalar_t* p = planes + j * plane;
                sums[j] += t.weight[0] * static_cast<acc_t>(p[t.offset[0]]) +
                           t.weight[1] * static_cast<acc_t>(p[t.offset[1]]) +
                           t.weight[2] * static_cast<acc_t>(p[t.offset[2]]) +
                           t.weight[3] * static_cast<acc_t>(p[t.offset[3]]);
              }
            }
          }
          const int64_t bin = ph * out_w + pw;
          for (int o = 0; o < num_o; ++o) {
            const acc_t v = (acc_t(1) - g.frac) * sums[main_source(o, g.shift, num_o)] +
                            g.frac * sums[neighbour_source(o, g.shift, num_o, opt.legacy_orientation)];
            out[o * bins + bin] = static_cast<scalar_t>(v / g.count);
          }
        }
      }
    }
  });
}

// grad_levels[l]: (N, C, H_l, W_l) accumulators (float, or double for double), zero-filled.
template <typename scalar_t>
void backward_kernel(const scalar_t* grad, const scalar_t* rois, const int64_t* roi_levels,
                     int64_t num_rois, int64_t batch_size, int64_t channels,
                     at::IntArrayRef heights, at::IntArrayRef widths, at::ArrayRef<double> scales,
                     const RiRoIOptions& opt,
                     const std::vector<at::opmath_type<scalar_t>*>& grad_levels) {
  using acc_t = at::opmath_type<scalar_t>;
  const int num_o = static_cast<int>(opt.num_orientations);
  const int out_h = static_cast<int>(opt.out_h), out_w = static_cast<int>(opt.out_w);
  const int64_t groups = channels / num_o, bins = opt.out_h * opt.out_w;
  const int64_t num_levels = static_cast<int64_t>(grad_levels.size());
  // RoIs of each (level, image), in index order: the fixed visiting order of each task. A row that
  // breaks the rules of common/roi_rows.h (the forward rejects it; only a raw call of the backward
  // op can pass one) gets no gradient, as on CUDA.
  std::vector<std::vector<int64_t>> buckets(num_levels * batch_size);
  for (int64_t k = 0; k < num_rois; ++k) {
    const int64_t l = level_of(roi_levels, k);
    int64_t n;
    if (!roi_row_image(rois + k * 6, 6, batch_size, l, num_levels, &n)) continue;
    buckets[l * batch_size + n].push_back(k);
  }
  at::parallel_for(0, num_levels * batch_size * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> source_grad(num_o);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t ln = task / groups, c = task % groups;
      const int64_t l = ln / batch_size, n = ln % batch_size;
      const int height = static_cast<int>(heights[l]), width = static_cast<int>(widths[l]);
      const int64_t plane = static_cast<int64_t>(height) * width;
      acc_t* planes = grad_levels[l] + (n * channels + c * num_o) * plane;
      for (const int64_t k : buckets[ln]) {
        const scalar_t* roi = rois + k * 6;
        const auto g = riroi_geometry<scalar_t, acc_t>(roi, static_cast<acc_t>(scales[l]), out_h,
                                                       out_w, static_cast<int>(opt.num_samples),
                                                       num_o, opt.clockwise);
        const scalar_t* grad_k = grad + (k * channels + c * num_o) * bins;
        for (int ph = 0; ph < out_h; ++ph) {
          for (int pw = 0; pw < out_w; ++pw) {
            const int64_t bin = ph * out_w + pw;
            // Gradient reaching input orientation j through both outputs that read it.
            bool any = false;
            for (int j = 0; j < num_o; ++j) {
              const acc_t main = static_cast<acc_t>(grad_k[main_target(j, g.shift, num_o) * bins + bin]);
              const acc_t side = static_cast<acc_t>(
                  grad_k[neighbour_target(j, g.shift, num_o, opt.legacy_orientation) * bins + bin]);
              source_grad[j] = ((acc_t(1) - g.frac) * main + g.frac * side) / g.count;
              any = any || source_grad[j] != acc_t(0);
            }
            if (!any) continue;
            for (int iy = 0; iy < g.grid_h; ++iy) {
              for (int ix = 0; ix < g.grid_w; ++ix) {
                BilinearTaps<acc_t> t;
                if (!sample_taps(g, ph, pw, iy, ix, height, width, &t)) continue;
                for (int j = 0; j < num_o; ++j) {
                  acc_t* p = planes + j * plane;
                  for (int q = 0; q < 4; ++q) p[t.offset[q]] += t.weight[q] * source_grad[j];
                }
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace

at::Tensor riroi_align_rotated_forward_cpu(at::TensorList features_, const at::Tensor& rois_,
                                           const at::Tensor& levels_, at::ArrayRef<double> scales,
                                           const RiRoIOptions& opt, const char* name,
                                           const char* op) {
  check_riroi_forward(features_, rois_, levels_, scales, opt, name, op);
  check_roi_values_cpu(rois_, features_[0].size(0), op, levels_, features_.size());
  const auto features = contiguous_all(features_);
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_rois = rois.size(0), channels = features[0].size(1);
  auto output = at::empty({num_rois, channels, opt.out_h, opt.out_w}, features[0].options());
  if (output.numel() == 0) return output;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, features[0].scalar_type(), "riroi_align_rotated_cpu", [&] {
    const auto table = feature_levels<scalar_t, at::opmath_type<scalar_t>>(features, scales);
    forward_kernel<scalar_t>(table, rois.data_ptr<scalar_t>(),
                             levels.defined() ? levels.data_ptr<int64_t>() : nullptr, num_rois,
                             channels, opt, output.data_ptr<scalar_t>());
  });
  return output;
}

std::vector<at::Tensor> riroi_align_rotated_backward_cpu(
    const at::Tensor& grad_, const at::Tensor& rois_, const at::Tensor& levels_,
    at::ArrayRef<double> scales, const RiRoIOptions& opt, int64_t batch_size, int64_t channels,
    at::IntArrayRef heights, at::IntArrayRef widths, bool channels_last, const char* op) {
  check_riroi_backward(grad_, rois_, levels_, scales, opt, batch_size, channels, heights, widths,
                       op);
  const auto grad = grad_.contiguous();
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  // Accumulate in float (double for double) and convert once: float16 sums stay accurate.
  const auto acc_dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  std::vector<at::Tensor> acc;
  for (size_t l = 0; l < heights.size(); ++l) {
    acc.push_back(at::zeros({batch_size, channels, heights[l], widths[l]},
                            grad.options().dtype(acc_dtype)));
  }
  if (grad.numel() > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "riroi_align_rotated_backward_cpu", [&] {
      std::vector<at::opmath_type<scalar_t>*> planes;
      for (auto& a : acc) planes.push_back(a.data_ptr<at::opmath_type<scalar_t>>());
      backward_kernel<scalar_t>(grad.data_ptr<scalar_t>(), rois.data_ptr<scalar_t>(),
                                levels.defined() ? levels.data_ptr<int64_t>() : nullptr,
                                rois.size(0), batch_size, channels, heights, widths, scales, opt,
                                planes);
    });
  }
  // The sums run over NCHW planes; each gradient takes the dtype and layout asked for in one pass.
  for (auto& a : acc) a = a.to(grad.scalar_type(), false, false, gradient_format(channels_last));
  return acc;
}

}  // namespace redet
