// Autograd of the depth-aware flow projection, in C++ (registered at the Autograd key in
// depth_flow_projection.cpp) rather than with torch.library.register_autograd: that runs a Python
// function on every call, even without gradients, which costs as much host time as a small GPU
// forward takes. The fake kernels are in redet_plugin/ops/depth_flow_projection.py.
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "depth_flow_projection/depth_flow_projection.h"

namespace redet {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using TensorPair = std::tuple<at::Tensor, at::Tensor>;

TensorPair project(const at::Tensor& flow, const at::Tensor& depth, double t, bool inverse_depth,
                   bool fill_holes, bool check_depth) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("redet::depth_flow_projection", "")
          .typed<TensorPair(const at::Tensor&, const at::Tensor&, double, bool, bool, bool)>();
  return op.call(flow, depth, t, inverse_depth, fill_holes, check_depth);
}

TensorPair project_backward(const at::Tensor& grad, const at::Tensor& flow,
                            const at::Tensor& depth, const at::Tensor& output,
                            const at::Tensor& count, double t, bool inverse_depth,
                            bool fill_holes) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("redet::_depth_flow_projection_backward", "")
                             .typed<TensorPair(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, double, bool, bool)>();
  return op.call(grad, flow, depth, output, count, t, inverse_depth, fill_holes);
}

// Gradients for flow and depth from the backward op; count is not differentiable.
class Projection : public torch::autograd::Function<Projection> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& flow,
                               const at::Tensor& depth, double t, bool inverse_depth,
                               bool fill_holes, bool check_depth) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, count] = project(flow, depth, t, inverse_depth, fill_holes, check_depth);
    ctx->mark_non_differentiable({count});
    ctx->set_materialize_grads(false);  // no zeros for unused outputs: backward checks defined()
    ctx->save_for_backward({flow, depth, output, count});
    ctx->saved_data["t"] = t;
    ctx->saved_data["inverse_depth"] = inverse_depth;
    ctx->saved_data["fill_holes"] = fill_holes;
    return {output, count};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad_flow, grad_depth;
    if (grads[0].defined() && (ctx->needs_input_grad(0) || ctx->needs_input_grad(1))) {
      // Without create_graph nothing differentiates the result: skip the backward op's own
      // autograd layer (a node per call) and go straight to the kernel.
      std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
      if (!at::GradMode::is_enabled()) below_autograd.emplace();
      std::tie(grad_flow, grad_depth) = project_backward(
          grads[0], saved[0], saved[1], saved[2], saved[3], ctx->saved_data["t"].toDouble(),
          ctx->saved_data["inverse_depth"].toBool(), ctx->saved_data["fill_holes"].toBool());
    }
    return {grad_flow, grad_depth, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The backward op itself: its own derivative is not implemented.
class ProjectionBackward : public torch::autograd::Function<ProjectionBackward> {
 public:
  static variable_list forward(AutogradContext* /*ctx*/, const at::Tensor& grad,
                               const at::Tensor& flow, const at::Tensor& depth,
                               const at::Tensor& output, const at::Tensor& count, double t,
                               bool inverse_depth, bool fill_holes) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [grad_flow, grad_depth] =
        project_backward(grad, flow, depth, output, count, t, inverse_depth, fill_holes);
    return {grad_flow, grad_depth};
  }

  static variable_list backward(AutogradContext* /*ctx*/, variable_list /*grads*/) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "depth_flow_projection: double backward (gradient of the "
                                       "gradient) is not implemented");
  }
};

}  // namespace

FlowProjectionResult depth_flow_projection_forward_autograd(const at::Tensor& flow,
                                                            const at::Tensor& depth, double t,
                                                            bool inverse_depth, bool fill_holes,
                                                            bool check_depth) {
  const auto result = Projection::apply(flow, depth, t, inverse_depth, fill_holes, check_depth);
  return {result[0], result[1]};
}

FlowProjectionResult depth_flow_projection_backward_autograd(
    const at::Tensor& grad, const at::Tensor& flow, const at::Tensor& depth,
    const at::Tensor& output, const at::Tensor& count, double t, bool inverse_depth,
    bool fill_holes) {
  const auto result = ProjectionBackward::apply(grad, flow, depth, output, count, t,
                                                inverse_depth, fill_holes);
  return {result[0], result[1]};
}

}  // namespace redet
