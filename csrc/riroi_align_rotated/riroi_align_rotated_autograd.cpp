// Autograd of RiRoIAlignRotated (single- and multi-level), in C++ like every op's (a Python
// autograd function would run Python on every call); registered at the Autograd key in
// riroi_align_rotated.cpp. The fake kernels are in redet_plugin/ops/riroi_align_rotated.py.
// The op is linear in its features and its backward op is its transpose, so one autograd Function
// serves all four ops: it applies one of the two maps, and its backward applies the other (through
// the dispatcher, so that it is differentiable again): every order of derivative is available.
// The gradient flows to the features (of the forward) or grad_output (of the backward) only.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "riroi_align_rotated/riroi_align_rotated.h"

namespace redet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Everything of a call but its tensors. levels (a tensor) undefined: the single-level ops.
struct Args {
  std::vector<double> spatial_scales;
  c10::SymInt out_h, out_w;  // the output's size
  int64_t num_samples, num_orientations;
  bool clockwise, legacy;
  c10::SymInt batch_size, channels;          // the features' sizes
  std::vector<c10::SymInt> heights, widths;  // (one per level)
  bool channels_last;                        // the features' layout (every level's)
};

// The forward map (features -> output) or its transpose (grad_output -> one gradient per level),
// through the dispatcher.
variable_list apply_map(at::TensorList x, const at::Tensor& rois, const at::Tensor& levels,
                        const Args& a, bool transposed) {
  auto& dispatcher = c10::Dispatcher::singleton();
  if (!transposed && !levels.defined()) {
    static const auto op = dispatcher.findSchemaOrThrow("redet::riroi_align_rotated", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                                 c10::SymInt, c10::SymInt, int64_t, int64_t,
                                                 bool, bool)>();
    return {op.call(x[0], rois, a.spatial_scales[0], a.out_h, a.out_w, a.num_samples,
                    a.num_orientations, a.clockwise, a.legacy)};
  }
  if (!transposed) {
    static const auto op = dispatcher.findSchemaOrThrow("redet::riroi_align_rotated_multilevel", "")
                               .typed<at::Tensor(at::TensorList, const at::Tensor&,
                                                 const at::Tensor&, at::ArrayRef<double>,
                                                 c10::SymInt, c10::SymInt, int64_t, int64_t,
                                                 bool, bool)>();
    return {op.call(x, rois, levels, a.spatial_scales, a.out_h, a.out_w, a.num_samples,
                    a.num_orientations, a.clockwise, a.legacy)};
  }
  if (!levels.defined()) {
    static const auto op = dispatcher.findSchemaOrThrow("redet::_riroi_align_rotated_backward", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&, double,
                                                 int64_t, int64_t, bool, bool, c10::SymInt,
                                                 c10::SymInt, c10::SymInt, c10::SymInt, bool)>();
    return {op.call(x[0], rois, a.spatial_scales[0], a.num_samples, a.num_orientations,
                    a.clockwise, a.legacy, a.batch_size, a.channels, a.heights[0], a.widths[0],
                    a.channels_last)};
  }
  static const auto op =
      dispatcher.findSchemaOrThrow("redet::_riroi_align_rotated_multilevel_backward", "")
          .typed<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         at::ArrayRef<double>, int64_t, int64_t, bool, bool,
                                         c10::SymInt, c10::SymInt, c10::SymIntArrayRef,
                                         c10::SymIntArrayRef, bool)>();
  return op.call(x[0], rois, levels, a.spatial_scales, a.num_samples, a.num_orientations,
                 a.clockwise, a.legacy, a.batch_size, a.channels, a.heights, a.widths,
                 a.channels_last);
}

void save_args(AutogradContext* ctx, const Args& a) {
  ctx->saved_data["spatial_scales"] = a.spatial_scales;
  ctx->saved_data["out_h"] = a.out_h;
  ctx->saved_data["out_w"] = a.out_w;
  ctx->saved_data["num_samples"] = a.num_samples;
  ctx->saved_data["num_orientations"] = a.num_orientations;
  ctx->saved_data["clockwise"] = a.clockwise;
  ctx->saved_data["legacy"] = a.legacy;
  ctx->saved_data["batch_size"] = a.batch_size;
  ctx->saved_data["channels"] = a.channels;
  ctx->saved_data["heights"] = c10::SymIntArrayRef(a.heights);
  ctx->saved_data["widths"] = c10::SymIntArrayRef(a.widths);
  ctx->saved_data["channels_last"] = a.channels_last;
}

Args saved_args(AutogradContext* ctx) {
  auto& d = ctx->saved_data;
  return {d["spatial_scales"].toDoubleVector(), d["out_h"].toSymInt(), d["out_w"].toSymInt(),
          d["num_samples"].toInt(), d["num_orientations"].toInt(), d["clockwise"].toBool(),
          d["legacy"].toBool(), d["batch_size"].toSymInt(), d["channels"].toSymInt(),
          d["heights"].toSymIntVector(), d["widths"].toSymIntVector(),
          d["channels_last"].toBool()};
}

// x: the features (one tensor per level) of the forward, or {grad_output} of a backward op
// (transposed). The sizes on the other side of the map come in `args`; those of x are read here.
class RiRoIAlignRotated : public torch::autograd::Function<RiRoIAlignRotated> {
 public:
  // levels: absent for the single-level ops (an undefined tensor cannot be a Function's input).
  static variable_list forward(AutogradContext* ctx, at::TensorList x, const at::Tensor& rois,
                               const std::optional<at::Tensor>& levels_or_none, Args args,
                               bool transposed) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::Tensor levels = levels_or_none.value_or(at::Tensor());
    auto y = apply_map(x, rois, levels, args, transposed);  // (the op checks x's shapes)
    if (transposed) {
      args.out_h = x[0].sym_size(2);
      args.out_w = x[0].sym_size(3);
    } else {
      args.batch_size = x[0].sym_size(0);
      args.channels = x[0].sym_size(1);
      args.heights.clear();
      args.widths.clear();
      args.channels_last = true;
      for (const auto& f : x) {
        args.heights.push_back(f.sym_size(2));
        args.widths.push_back(f.sym_size(3));
        args.channels_last = args.channels_last && is_channels_last_map(f);
      }
    }
    // The forward of the level gradients needs every level's: autograd gives zeros for a level
    // whose gradient was not used. Everywhere else an unused output's gradient is skipped.
    ctx->set_materialize_grads(transposed && levels.defined());
    ctx->save_for_backward({rois, levels});
    ctx->saved_data["num_inputs"] = static_cast<int64_t>(x.size());
    ctx->saved_data["transposed"] = transposed;
    save_args(ctx, args);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t num_inputs = ctx->saved_data["num_inputs"].toInt();
    variable_list result(num_inputs + 4);  // one per forward argument, x's tensors first
    bool needed = false;
    for (int64_t i = 0; i < num_inputs; ++i) needed = needed || ctx->needs_input_grad(i);
    if (!needed || !grads[0].defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const auto x_grads = apply_map(grads, saved[0], saved[1], saved_args(ctx),
                                   !ctx->saved_data["transposed"].toBool());
    for (int64_t i = 0; i < num_inputs; ++i) result[i] = x_grads[i];
    return result;
  }
};

Args make_args(at::ArrayRef<double> spatial_scales, c10::SymInt out_h, c10::SymInt out_w,
               int64_t num_samples, int64_t num_orientations, bool clockwise, bool legacy,
               c10::SymInt batch_size, c10::SymInt channels, std::vector<c10::SymInt> heights,
               std::vector<c10::SymInt> widths, bool channels_last) {
  return {spatial_scales.vec(), std::move(out_h),     std::move(out_w),
          num_samples,          num_orientations,     clockwise,
          legacy,               std::move(batch_size), std::move(channels),
          std::move(heights),   std::move(widths),    channels_last};
}

}  // namespace

// The four ops' Autograd-key functions: the sizes a call does not give are filled in by forward().

at::Tensor riroi_align_rotated_forward_autograd(const at::Tensor& input, const at::Tensor& rois,
                                                double spatial_scale, c10::SymInt out_h,
                                                c10::SymInt out_w, int64_t num_samples,
                                                int64_t num_orientations, bool clockwise,
                                                bool legacy) {
  auto args = make_args({spatial_scale}, std::move(out_h), std::move(out_w), num_samples,
                        num_orientations, clockwise, legacy, 0, 0, {}, {}, false);
  return RiRoIAlignRotated::apply(at::TensorList(input), rois, std::nullopt,
                                          std::move(args), false)[0];
}

at::Tensor riroi_align_rotated_backward_autograd(const at::Tensor& grad, const at::Tensor& rois,
                                                 double spatial_scale, int64_t num_samples,
                                                 int64_t num_orientations, bool clockwise,
                                                 bool legacy, c10::SymInt batch_size,
                                                 c10::SymInt channels, c10::SymInt height,
                                                 c10::SymInt width, bool channels_last) {
  auto args = make_args({spatial_scale}, 0, 0, num_samples, num_orientations, clockwise, legacy,
                        std::move(batch_size), std::move(channels), {std::move(height)},
                        {std::move(width)}, channels_last);
  return RiRoIAlignRotated::apply(at::TensorList(grad), rois, std::nullopt,
                                          std::move(args), true)[0];
}

at::Tensor riroi_align_rotated_multilevel_forward_autograd(
    at::TensorList features, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, c10::SymInt out_h, c10::SymInt out_w,
    int64_t num_samples, int64_t num_orientations, bool clockwise, bool legacy) {
  auto args = make_args(spatial_scales, std::move(out_h), std::move(out_w), num_samples,
                        num_orientations, clockwise, legacy, 0, 0, {}, {}, false);
  return RiRoIAlignRotated::apply(features, rois, std::optional<at::Tensor>(levels),
                                          std::move(args), false)[0];
}

std::vector<at::Tensor> riroi_align_rotated_multilevel_backward_autograd(
    const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
    at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
    bool clockwise, bool legacy, c10::SymInt batch_size, c10::SymInt channels,
    c10::SymIntArrayRef heights, c10::SymIntArrayRef widths, bool channels_last) {
  auto args = make_args(spatial_scales, 0, 0, num_samples, num_orientations, clockwise, legacy,
                        std::move(batch_size), std::move(channels), heights.vec(), widths.vec(),
                        channels_last);
  return RiRoIAlignRotated::apply(at::TensorList(grad), rois,
                                          std::optional<at::Tensor>(levels), std::move(args), true);
}

}  // namespace redet
