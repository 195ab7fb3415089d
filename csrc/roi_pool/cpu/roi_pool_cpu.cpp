// RoIPool on the CPU. Forward (one level or several): parallel over (roi, channel) planes.
// Backward: parallel over channels, each thread visiting RoIs in a fixed order, so it is race-free
// and deterministic.
#include <ATen/Parallel.h>
#include <ATen/OpMathType.h>

#include <vector>

#include "common/roi_rows.h"
#include "roi_pool/roi_pool.h"
#include "roi_pool/roi_pool_math.h"

namespace redet {

namespace {

// bin_max_strided's result (roi_pool_math.h) over one contiguous plane, row by row: its batched
// loads are for a GPU's memory latency, and on a CPU they cost more than they save on bins of a few
// pixels.
template <typename scalar_t, typename acc_t>
int bin_max_rows(const scalar_t* plane, int width, const PoolBin& b, acc_t* value) {
  if (b.empty()) {
    *value = acc_t(0);
    return -1;
  }
  acc_t best = acc_t(-3.402823466e+38f);
  int best_index = -1;
  for (int h = b.h_start; h < b.h_end; ++h) {
    const scalar_t* row = plane + h * width;
    for (int w = b.w_start; w < b.w_end; ++w) {
      const acc_t v = static_cast<acc_t>(row[w]);
      if (v > best) {  // (NaN never wins; ties keep the first in row-major order)
        best = v;
        best_index = h * width + w;
      }
    }
  }
  *value = best;
  return best_index;
}

// Pools RoI k from features[levels[k]] (levels undefined: features holds one map); the arguments
// are checked, the values of rois and levels included.
RoIPoolResult pool_levels(at::TensorList features_, const at::Tensor& rois_,
                          const at::Tensor& levels_, at::ArrayRef<double> scales, int64_t pooled_h,
                          int64_t pooled_w) {
  const auto features = contiguous_all(features_);
  const auto rois = rois_.contiguous();
  const auto levels = levels_.defined() ? levels_.contiguous() : levels_;
  const int64_t num_rois = rois.size(0), channels = features[0].size(1);
  auto output = at::empty({num_rois, channels, pooled_h, pooled_w}, features[0].options());
  auto argmax = at::empty({num_rois, channels, pooled_h, pooled_w},
                          features[0].options().dtype(at::kInt));
  if (output.numel() == 0) return {output, argmax};
  const bool multilevel = levels.defined();
  const auto starts = level_pixel_starts(features);
  const int64_t* level_data = levels.defined() ? levels.data_ptr<int64_t>() : nullptr;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, features[0].scalar_type(), "roi_pool_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto table = feature_levels<scalar_t, acc_t>(features, scales);
    const scalar_t* roi_data = rois.data_ptr<scalar_t>();
    scalar_t* out = output.data_ptr<scalar_t>();
    int* arg = argmax.data_ptr<int>();
    const int64_t bins = pooled_h * pooled_w;
    at::parallel_for(0, num_rois * channels, 1, [&](int64_t begin, int64_t end) {
      // A RoI's bins are the same in every channel, and a thread's planes come RoI by RoI: they
      // are computed once per RoI (per bin and channel, their arithmetic would dominate).
      std::vector<PoolBin> roi_bins(bins);
      int64_t bins_of = -1;
      for (int64_t kc = begin; kc < end; ++kc) {
        const int64_t k = kc / channels, c = kc % channels;
        const scalar_t* roi = roi_data + k * 5;
        const int l = level_data ? static_cast<int>(level_data[k]) : 0;
        const int height = table.height[l], width = table.width[l];
        if (k != bins_of) {
          for (int ph = 0; ph < pooled_h; ++ph)
            for (int pw = 0; pw < pooled_w; ++pw)
              roi_bins[ph * pooled_w + pw] = roi_pool_bin<scalar_t, acc_t>(
                  roi, table.spatial_scale[l], ph, pw, pooled_h, pooled_w, height, width);
          bins_of = k;
        }
        const int64_t n = static_cast<int64_t>(roi[0]);
        const scalar_t* plane = table.data[l] + (n * channels + c) * height * width;
        // (roi_pool.h; the single-level argmax indexes its image's map)
        const int start = multilevel ? starts[l] + static_cast<int>(n) * height * width : 0;
        for (int64_t i = 0; i < bins; ++i) {
          acc_t value;
          const int64_t o = kc * bins + i;
          const int index = bin_max_rows<scalar_t, acc_t>(plane, width, roi_bins[i], &value);
          arg[o] = index < 0 ? index : start + index;
          out[o] = static_cast<scalar_t>(value);
        }
      }
    });
  });
  return {output, argmax};
}

}  // namespace

RoIPoolResult roi_pool_forward_cpu(const at::Tensor& input, const at::Tensor& rois,
                                   double spatial_scale, int64_t pooled_h, int64_t pooled_w) {
  check_roi_pool_forward(input, rois, pooled_h, pooled_w, spatial_scale);
  check_roi_values_cpu(rois, input.size(0), "roi_pool");
  return pool_levels({input}, rois, at::Tensor(), {spatial_scale}, pooled_h, pooled_w);
}

RoIPoolResult roi_pool_multilevel_forward_cpu(at::TensorList features, const at::Tensor& rois,
                                              const at::Tensor& levels,
                                              at::ArrayRef<double> spatial_scales,
                                              int64_t pooled_h, int64_t pooled_w) {
  check_roi_pool_multilevel_forward(features, rois, levels, spatial_scales, pooled_h, pooled_w);
  check_roi_values_cpu(rois, features[0].size(0), "roi_pool_multilevel", levels,
                       static_cast<int64_t>(features.size()));
  return pool_levels(features, rois, levels, spatial_scales, pooled_h, pooled_w);
}

at::Tensor roi_pool_backward_cpu(const at::Tensor& grad_, const at::Tensor& rois_,
                                 const at::Tensor& argmax_, int64_t batch_size, int64_t channels,
                                 int64_t height, int64_t width, bool channels_last) {
  check_roi_pool_backward(grad_, rois_, argmax_, batch_size, channels, height, width);
  const auto grad = grad_.contiguous();
  const auto rois = rois_.contiguous();
  const auto argmax = argmax_.contiguous();
  // Accumulate in float (double for double) and convert once: float16 sums stay accurate.
  const auto acc_dtype = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto grad_input = at::zeros({batch_size, channels, height, width}, grad.options().dtype(acc_dtype));
  const int64_t num_rois = rois.size(0), bins = grad.numel() / std::max<int64_t>(1, num_rois * channels);
  // The sums run over NCHW planes; the result takes the dtype and layout asked for in one pass.
  const auto result = [&] {
    return grad_input.to(grad.scalar_type(), false, false, gradient_format(channels_last));
  };
  if (grad.numel() == 0) return result();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "roi_pool_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* g = grad.data_ptr<scalar_t>();
    const scalar_t* roi_data = rois.data_ptr<scalar_t>();
    const int* arg = argmax.data_ptr<int>();
    acc_t* gin = grad_input.data_ptr<acc_t>();
    at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        for (int64_t k = 0; k < num_rois; ++k) {
          int64_t n;  // a guard: the forward rejects rows that break common/roi_rows.h's rules
          if (!roi_row_image(roi_data + k * 5, 5, batch_size, 0, 1, &n)) continue;
          acc_t* plane = gin + (n * channels + c) * height * width;
          const int64_t base = (k * channels + c) * bins;
          for (int64_t i = 0; i < bins; ++i) {
            const int index = arg[base + i];
            if (index >= 0 && index < height * width) plane[index] += static_cast<acc_t>(g[base + i]);
          }
        }
      }
    });
  });
  return result();
}

}  // namespace redet
