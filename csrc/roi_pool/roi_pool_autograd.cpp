// Autograd of RoIPool, in C++ like every op's (a Python autograd function would run Python on
// every call); registered at the Autograd key in roi_pool.cpp. The fake kernels are in
// redet_plugin/ops/roi_pool.py.
// The gradient flows to the input (the features) only; argmax is not differentiable. The
// multi-level op's backward is the single-level one onto the levels' maps laid end to end, cut
// into one gradient per level. The backward op is linear
// in grad_output, so its own gradient (double backward) gathers the incoming gradient at the
// argmax pixels: every order of derivative is available.
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

#include "roi_pool/roi_pool.h"

namespace redet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using TensorPair = std::tuple<at::Tensor, at::Tensor>;

TensorPair pool(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                const c10::SymInt& pooled_h, const c10::SymInt& pooled_w) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("redet::roi_pool", "")
          .typed<TensorPair(const at::Tensor&, const at::Tensor&, double, c10::SymInt,
                            c10::SymInt)>();
  return op.call(input, rois, spatial_scale, pooled_h, pooled_w);
}

at::Tensor pool_backward(const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& argmax,
                         c10::SymIntArrayRef input_sizes, bool channels_last) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("redet::_roi_pool_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, c10::SymInt, c10::SymInt,
                                               c10::SymInt, c10::SymInt, bool)>();
  return op.call(grad, rois, argmax, input_sizes[0], input_sizes[1], input_sizes[2],
                 input_sizes[3], channels_last);
}

TensorPair pool_levels(at::TensorList features, const at::Tensor& rois, const at::Tensor& levels,
                       at::ArrayRef<double> spatial_scales, const c10::SymInt& pooled_h,
                       const c10::SymInt& pooled_w) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("redet::roi_pool_multilevel", "")
          .typed<TensorPair(at::TensorList, const at::Tensor&, const at::Tensor&,
                            at::ArrayRef<double>, c10::SymInt, c10::SymInt)>();
  return op.call(features, rois, levels, spatial_scales, pooled_h, pooled_w);
}

class RoIPool : public torch::autograd::Function<RoIPool> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, c10::SymInt pooled_h,
                               c10::SymInt pooled_w) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, argmax] = pool(input, rois, spatial_scale, pooled_h, pooled_w);
    ctx->mark_non_differentiable({argmax});
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois, argmax});
    ctx->saved_data["input_sizes"] = input.sym_sizes();
    ctx->saved_data["channels_last"] = is_channels_last_map(input);
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      grad_input = pool_backward(grads[0], saved[0], saved[1],
                                 ctx->saved_data["input_sizes"].toSymIntVector(),
                                 ctx->saved_data["channels_last"].toBool());
    }
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class RoIPoolMultilevel : public torch::autograd::Function<RoIPoolMultilevel> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList features,
                               const at::Tensor& rois, const at::Tensor& levels,
                               std::vector<double> spatial_scales, c10::SymInt pooled_h,
                               c10::SymInt pooled_w) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, argmax] = pool_levels(features, rois, levels, spatial_scales, pooled_h, pooled_w);
    ctx->mark_non_differentiable({argmax});
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois, argmax});
    std::vector<c10::SymInt> heights, widths;
    bool channels_last = true;
    for (const auto& f : features) {
      heights.push_back(f.sym_size(2));
      widths.push_back(f.sym_size(3));
      channels_last = channels_last && is_channels_last_map(f);
    }
    ctx->saved_data["batch_size"] = features[0].sym_size(0);
    ctx->saved_data["channels"] = features[0].sym_size(1);
    ctx->saved_data["heights"] = heights;
    ctx->saved_data["widths"] = widths;
    ctx->saved_data["channels_last"] = channels_last;
    return {output, argmax};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto heights = ctx->saved_data["heights"].toSymIntVector();
    const auto widths = ctx->saved_data["widths"].toSymIntVector();
    variable_list result(heights.size() + 5);  // one per level, then rois .. pooled_w
    bool needed = false;
    for (size_t l = 0; l < heights.size(); ++l) needed = needed || ctx->needs_input_grad(l);
    if (!needed || !grads[0].defined()) return result;
    const auto batch_size = ctx->saved_data["batch_size"].toSymInt();
    const auto channels = ctx->saved_data["channels"].toSymInt();
    c10::SymInt total = 0;
    for (size_t l = 0; l < heights.size(); ++l) total = total + batch_size * heights[l] * widths[l];
    const auto saved = ctx->get_saved_variables();
    // The argmax indexes one map of all levels and images (roi_pool.h): every RoI is of its image 0.
    auto rois_of_one_image = saved[0].clone();
    rois_of_one_image.select(1, 0).zero_();
    const bool channels_last = ctx->saved_data["channels_last"].toBool();
    const std::vector<c10::SymInt> one_map{1, channels, 1, total};
    const auto all_levels =
        pool_backward(grads[0], rois_of_one_image, saved[1], one_map, channels_last);
    // Level l's slice, (C, N, H_l, W_l) in the map's order, as (N, C, H_l, W_l): channels-last it
    // is a channels-last map as it is; NCHW it strides over channels, and is copied.
    c10::SymInt start = 0;
    for (size_t l = 0; l < heights.size(); ++l) {
      const auto end = start + batch_size * heights[l] * widths[l];
      result[l] = all_levels.slice_symint(3, start, end)
                      .view_symint({channels, batch_size, heights[l], widths[l]})
                      .permute({1, 0, 2, 3})
                      .contiguous(gradient_format(channels_last));
      start = end;
    }
    return result;
  }
};

// d(grad_input)/d(grad_output) picks, for each output bin, the gradient at its argmax pixel of
// its RoI's image. Entries the backward kernels skip (argmax -1 or outside the map, a RoI row
// that breaks the rules of common/roi_rows.h) get 0 here too, with in-range indices for the
// gather.
at::Tensor gather_at_argmax(const at::Tensor& grad_grad_input, const at::Tensor& rois,
                            const at::Tensor& argmax) {
  const auto num_images = grad_grad_input.sym_size(0);
  const auto plane = grad_grad_input.sym_size(2) * grad_grad_input.sym_size(3);
  const auto index_column = rois.select(1, 0);
  const auto finite_row = at::isfinite(rois).all(1);
  const auto good_row = finite_row.logical_and(index_column.eq(index_column.floor()))
                            .logical_and(index_column.ge(0))
                            .logical_and(index_column.lt(num_images));
  const auto image = at::where(good_row, index_column, at::zeros_like(index_column)).to(at::kLong);
  const auto good_pixel = argmax.ge(0).logical_and(argmax.lt(plane));
  const auto pixel = at::where(good_pixel, argmax, at::zeros_like(argmax)).flatten(2).to(at::kLong);
  const auto planes = grad_grad_input.flatten(2).index_select(0, image);  // (K, C, H * W)
  const auto keep = good_pixel.logical_and(good_row.view({-1, 1, 1, 1}));
  return planes.gather(2, pixel).view_as(argmax).mul(keep);
}

class RoIPoolBackward : public torch::autograd::Function<RoIPoolBackward> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad,
                               const at::Tensor& rois, const at::Tensor& argmax,
                               c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                               c10::SymInt width, bool channels_last) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const std::vector<c10::SymInt> sizes{batch_size, channels, height, width};
    auto grad_input = pool_backward(grad, rois, argmax, sizes, channels_last);
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois, argmax});
    return {grad_input};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_grad_output;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      grad_grad_output = gather_at_argmax(grads[0], saved[0], saved[1]);
    }
    variable_list result(8);
    result[0] = grad_grad_output;
    return result;
  }
};

}  // namespace

RoIPoolResult roi_pool_forward_autograd(const at::Tensor& input, const at::Tensor& rois,
                                        double spatial_scale, c10::SymInt pooled_h,
                                        c10::SymInt pooled_w) {
  const auto result =
      RoIPool::apply(input, rois, spatial_scale, std::move(pooled_h), std::move(pooled_w));
  return {result[0], result[1]};
}

RoIPoolResult roi_pool_multilevel_forward_autograd(at::TensorList features,
                                                   const at::Tensor& rois,
                                                   const at::Tensor& levels,
                                                   at::ArrayRef<double> spatial_scales,
                                                   c10::SymInt pooled_h, c10::SymInt pooled_w) {
  const auto result = RoIPoolMultilevel::apply(features, rois, levels, spatial_scales.vec(),
                                               std::move(pooled_h), std::move(pooled_w));
  return {result[0], result[1]};
}

at::Tensor roi_pool_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                      const at::Tensor& argmax, c10::SymInt batch_size,
                                      c10::SymInt channels, c10::SymInt height, c10::SymInt width,
                                      bool channels_last) {
  return RoIPoolBackward::apply(grad, rois, argmax, std::move(batch_size), std::move(channels),
                                std::move(height), std::move(width), channels_last)[0];
}

}  // namespace redet
