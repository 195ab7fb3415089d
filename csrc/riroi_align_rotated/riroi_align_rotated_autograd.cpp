// Autograd of RiRoIAlignRotated (single- and multi-level), registered in C++ at the Autograd key
// like every op's (a Python autograd function would run Python on every call). The fake kernels
// stay in redet_plugin/ops/riroi_align_rotated.py.
// The gradient flows to the features only. Each backward op is linear in grad_output and is the
// transpose of its forward, so its own gradient (double backward) is the forward applied to the
// incoming gradient: every order of derivative is available.
#include <torch/autograd.h>
#include <torch/library.h>

#include <vector>

namespace redet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- the ops, called through the dispatcher (below the Autograd key inside forward()) ----

at::Tensor align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                 const c10::SymInt& out_h, const c10::SymInt& out_w, int64_t num_samples,
                 int64_t num_orientations, bool clockwise, bool legacy) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("redet::riroi_align_rotated", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                               c10::SymInt, c10::SymInt, int64_t, int64_t, bool,
                                               bool)>();
  return op.call(input, rois, spatial_scale, out_h, out_w, num_samples, num_orientations,
                 clockwise, legacy);
}

at::Tensor align_backward(const at::Tensor& grad, const at::Tensor& rois, double spatial_scale,
                          int64_t num_samples, int64_t num_orientations, bool clockwise,
                          bool legacy, c10::SymIntArrayRef input_sizes) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("redet::_riroi_align_rotated_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                               int64_t, int64_t, bool, bool, c10::SymInt,
                                               c10::SymInt, c10::SymInt, c10::SymInt)>();
  return op.call(grad, rois, spatial_scale, num_samples, num_orientations, clockwise, legacy,
                 input_sizes[0], input_sizes[1], input_sizes[2], input_sizes[3]);
}

at::Tensor align_levels(at::TensorList features, const at::Tensor& rois, const at::Tensor& levels,
                        at::ArrayRef<double> spatial_scales, const c10::SymInt& out_h,
                        const c10::SymInt& out_w, int64_t num_samples, int64_t num_orientations,
                        bool clockwise, bool legacy) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("redet::riroi_align_rotated_multilevel", "")
                             .typed<at::Tensor(at::TensorList, const at::Tensor&,
                                               const at::Tensor&, at::ArrayRef<double>,
                                               c10::SymInt, c10::SymInt, int64_t, int64_t, bool,
                                               bool)>();
  return op.call(features, rois, levels, spatial_scales, out_h, out_w, num_samples,
                 num_orientations, clockwise, legacy);
}

std::vector<at::Tensor> align_levels_backward(const at::Tensor& grad, const at::Tensor& rois,
                                              const at::Tensor& levels,
                                              at::ArrayRef<double> spatial_scales,
                                              int64_t num_samples, int64_t num_orientations,
                                              bool clockwise, bool legacy,
                                              const c10::SymInt& batch_size,
                                              const c10::SymInt& channels,
                                              c10::SymIntArrayRef heights,
                                              c10::SymIntArrayRef widths) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("redet::_riroi_align_rotated_multilevel_backward", "")
          .typed<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         at::ArrayRef<double>, int64_t, int64_t, bool, bool,
                                         c10::SymInt, c10::SymInt, c10::SymIntArrayRef,
                                         c10::SymIntArrayRef)>();
  return op.call(grad, rois, levels, spatial_scales, num_samples, num_orientations, clockwise,
                 legacy, batch_size, channels, heights, widths);
}

// The options every function below keeps for its backward.
void save_options(AutogradContext* ctx, int64_t num_samples, int64_t num_orientations,
                  bool clockwise, bool legacy) {
  ctx->saved_data["num_samples"] = num_samples;
  ctx->saved_data["num_orientations"] = num_orientations;
  ctx->saved_data["clockwise"] = clockwise;
  ctx->saved_data["legacy"] = legacy;
}

struct SavedOptions {
  int64_t num_samples, num_orientations;
  bool clockwise, legacy;
};

SavedOptions saved_options(AutogradContext* ctx) {
  return {ctx->saved_data["num_samples"].toInt(), ctx->saved_data["num_orientations"].toInt(),
          ctx->saved_data["clockwise"].toBool(), ctx->saved_data["legacy"].toBool()};
}

// ---- single level ----

class RiRoIAlignRotated : public torch::autograd::Function<RiRoIAlignRotated> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& rois, double spatial_scale, c10::SymInt out_h,
                               c10::SymInt out_w, int64_t num_samples, int64_t num_orientations,
                               bool clockwise, bool legacy) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto output = align(input, rois, spatial_scale, out_h, out_w, num_samples, num_orientations,
                        clockwise, legacy);
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["input_sizes"] = input.sym_sizes();
    save_options(ctx, num_samples, num_orientations, clockwise, legacy);
    return {output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
      const auto rois = ctx->get_saved_variables()[0];
      const auto o = saved_options(ctx);
      const auto sizes = ctx->saved_data["input_sizes"].toSymIntVector();
      grad_input = align_backward(grads[0], rois, ctx->saved_data["spatial_scale"].toDouble(),
                                  o.num_samples, o.num_orientations, o.clockwise, o.legacy, sizes);
    }
    variable_list result(9);  // one per forward argument; only input has a gradient
    result[0] = grad_input;
    return result;
  }
};

// The backward op; its gradient with respect to grad_output is the forward of the incoming one.
class RiRoIAlignRotatedBackward : public torch::autograd::Function<RiRoIAlignRotatedBackward> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad,
                               const at::Tensor& rois, double spatial_scale, int64_t num_samples,
                               int64_t num_orientations, bool clockwise, bool legacy,
                               c10::SymInt batch_size, c10::SymInt channels, c10::SymInt height,
                               c10::SymInt width) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const std::vector<c10::SymInt> sizes{batch_size, channels, height, width};
    auto grad_input = align_backward(grad, rois, spatial_scale, num_samples, num_orientations,
                                     clockwise, legacy, sizes);
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois});
    ctx->saved_data["spatial_scale"] = spatial_scale;
    ctx->saved_data["out_h"] = grad.sym_size(2);
    ctx->saved_data["out_w"] = grad.sym_size(3);
    save_options(ctx, num_samples, num_orientations, clockwise, legacy);
    return {grad_input};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_grad_output;
    if (ctx->needs_input_grad(0) && grads[0].defined()) {
      const auto rois = ctx->get_saved_variables()[0];
      const auto o = saved_options(ctx);
      grad_grad_output = align(grads[0], rois, ctx->saved_data["spatial_scale"].toDouble(),
                               ctx->saved_data["out_h"].toSymInt(),
                               ctx->saved_data["out_w"].toSymInt(), o.num_samples,
                               o.num_orientations, o.clockwise, o.legacy);
    }
    variable_list result(11);
    result[0] = grad_grad_output;
    return result;
  }
};

// ---- multi-level: features is a list, so the gradients of its maps come first ----

class RiRoIAlignRotatedMultilevel : public torch::autograd::Function<RiRoIAlignRotatedMultilevel> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList features,
                               const at::Tensor& rois, const at::Tensor& levels,
                               std::vector<double> spatial_scales, c10::SymInt out_h,
                               c10::SymInt out_w, int64_t num_samples, int64_t num_orientations,
                               bool clockwise, bool legacy) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto output = align_levels(features, rois, levels, spatial_scales, out_h, out_w, num_samples,
                               num_orientations, clockwise, legacy);
    std::vector<c10::SymInt> heights, widths;
    for (const auto& f : features) {
      heights.push_back(f.sym_size(2));
      widths.push_back(f.sym_size(3));
    }
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({rois, levels});
    ctx->saved_data["num_levels"] = static_cast<int64_t>(features.size());
    ctx->saved_data["spatial_scales"] = spatial_scales;
    ctx->saved_data["batch_size"] = features[0].sym_size(0);
    ctx->saved_data["channels"] = features[0].sym_size(1);
    ctx->saved_data["heights"] = c10::SymIntArrayRef(heights);
    ctx->saved_data["widths"] = c10::SymIntArrayRef(widths);
    save_options(ctx, num_samples, num_orientations, clockwise, legacy);
    return {output};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t num_levels = ctx->saved_data["num_levels"].toInt();
    bool any_feature = false;
    for (int64_t l = 0; l < num_levels; ++l) any_feature = any_feature || ctx->needs_input_grad(l);
    variable_list result(num_levels + 9);
    if (any_feature && grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      const auto o = saved_options(ctx);
      const auto heights = ctx->saved_data["heights"].toSymIntVector();
      const auto widths = ctx->saved_data["widths"].toSymIntVector();
      const auto level_grads = align_levels_backward(
          grads[0], saved[0], saved[1], ctx->saved_data["spatial_scales"].toDoubleVector(),
          o.num_samples, o.num_orientations, o.clockwise, o.legacy,
          ctx->saved_data["batch_size"].toSymInt(), ctx->saved_data["channels"].toSymInt(),
          heights, widths);
      for (int64_t l = 0; l < num_levels; ++l) result[l] = level_grads[l];
    }
    return result;
  }
};

class RiRoIAlignRotatedMultilevelBackward
    : public torch::autograd::Function<RiRoIAlignRotatedMultilevelBackward> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad,
                               const at::Tensor& rois, const at::Tensor& levels,
                               std::vector<double> spatial_scales, int64_t num_samples,
                               int64_t num_orientations, bool clockwise, bool legacy,
                               c10::SymInt batch_size, c10::SymInt channels,
                               std::vector<c10::SymInt> heights, std::vector<c10::SymInt> widths) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto level_grads = align_levels_backward(grad, rois, levels, spatial_scales, num_samples,
                                             num_orientations, clockwise, legacy, batch_size,
                                             channels, heights, widths);
    ctx->save_for_backward({rois, levels});
    ctx->saved_data["spatial_scales"] = spatial_scales;
    ctx->saved_data["out_h"] = grad.sym_size(2);
    ctx->saved_data["out_w"] = grad.sym_size(3);
    save_options(ctx, num_samples, num_orientations, clockwise, legacy);
    return level_grads;
  }

  // grads: one per level (zeros where a level's gradient was not used: materialized).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_grad_output;
    if (ctx->needs_input_grad(0)) {
      const auto saved = ctx->get_saved_variables();
      const auto o = saved_options(ctx);
      grad_grad_output = align_levels(
          grads, saved[0], saved[1], ctx->saved_data["spatial_scales"].toDoubleVector(),
          ctx->saved_data["out_h"].toSymInt(), ctx->saved_data["out_w"].toSymInt(),
          o.num_samples, o.num_orientations, o.clockwise, o.legacy);
    }
    variable_list result(12);
    result[0] = grad_grad_output;
    return result;
  }
};

// ---- the Autograd-key kernels ----

at::Tensor align_autograd(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                          c10::SymInt out_h, c10::SymInt out_w, int64_t num_samples,
                          int64_t num_orientations, bool clockwise, bool legacy) {
  return RiRoIAlignRotated::apply(input, rois, spatial_scale, std::move(out_h), std::move(out_w),
                                  num_samples, num_orientations, clockwise, legacy)[0];
}

at::Tensor align_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                   double spatial_scale, int64_t num_samples,
                                   int64_t num_orientations, bool clockwise, bool legacy,
                                   c10::SymInt batch_size, c10::SymInt channels,
                                   c10::SymInt height, c10::SymInt width) {
  return RiRoIAlignRotatedBackward::apply(grad, rois, spatial_scale, num_samples,
                                          num_orientations, clockwise, legacy,
                                          std::move(batch_size), std::move(channels),
                                          std::move(height), std::move(width))[0];
}

at::Tensor align_levels_autograd(at::TensorList features, const at::Tensor& rois,
                                 const at::Tensor& levels, at::ArrayRef<double> spatial_scales,
                                 c10::SymInt out_h, c10::SymInt out_w, int64_t num_samples,
                                 int64_t num_orientations, bool clockwise, bool legacy) {
  return RiRoIAlignRotatedMultilevel::apply(features, rois, levels, spatial_scales.vec(),
                                            std::move(out_h), std::move(out_w), num_samples,
                                            num_orientations, clockwise, legacy)[0];
}

std::vector<at::Tensor> align_levels_backward_autograd(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
    bool clockwise, bool legacy, c10::SymInt batch_size, c10::SymInt channels,
    c10::SymIntArrayRef heights, c10::SymIntArrayRef widths) {
  return RiRoIAlignRotatedMultilevelBackward::apply(
      grad, rois, levels, spatial_scales.vec(), num_samples, num_orientations, clockwise, legacy,
      std::move(batch_size), std::move(channels), heights.vec(), widths.vec());
}

}  // namespace

TORCH_LIBRARY_IMPL(redet, Autograd, m) {
  m.impl("riroi_align_rotated", &align_autograd);
  m.impl("_riroi_align_rotated_backward", &align_backward_autograd);
  m.impl("riroi_align_rotated_multilevel", &align_levels_autograd);
  m.impl("_riroi_align_rotated_multilevel_backward", &align_levels_backward_autograd);
}

}  // namespace redet
