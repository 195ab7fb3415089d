// Depth-aware flow projection (DAIN): argument checks and helpers shared by both backends.
#pragma once
#include <ATen/ATen.h>

namespace redet {

// Accumulation dtype: float64 for float64 inputs, float32 otherwise (float16/bfloat16 included).
inline at::ScalarType flow_projection_acc_type(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_depth_flow_projection_args(const at::Tensor& flow, const at::Tensor& depth,
                                             double t, const char* op) {
  TORCH_CHECK(flow.dim() == 4 && flow.size(1) == 2, op,
              ": flow must have shape (B, 2, H, W), got ", flow.sizes());
  TORCH_CHECK(depth.dim() == 4 && depth.size(0) == flow.size(0) && depth.size(1) == 1 &&
                  depth.size(2) == flow.size(2) && depth.size(3) == flow.size(3),
              op, ": depth must have shape (B, 1, H, W) = (", flow.size(0), ", 1, ", flow.size(2),
              ", ", flow.size(3), ") to match flow, got ", depth.sizes());
  TORCH_CHECK(at::isFloatingType(flow.scalar_type()), op,
              ": flow must be float16, bfloat16, float32 or float64, got ", flow.scalar_type());
  TORCH_CHECK(depth.scalar_type() == flow.scalar_type(), op,
              ": depth must have the same dtype as flow (", flow.scalar_type(), "), got ",
              depth.scalar_type());
  TORCH_CHECK(depth.device() == flow.device(), op, ": depth must be on the same device as flow (",
              flow.device(), "), got ", depth.device());
  TORCH_CHECK(t >= 0.0 && t <= 1.0, op, ": t must be in [0, 1], got ", t);
  TORCH_CHECK(flow.size(2) < (1 << 30) && flow.size(3) < (1 << 30), op,
              ": image too large, got ", flow.sizes());
}

// depth must be > 0 (+inf allowed: weight 0); an inverse depth must be finite and >= 0.
// One host sync on CUDA; skipped when the caller asks (check_depth=False).
inline void check_depth_values(const at::Tensor& depth, bool inverse_depth, const char* op) {
  if (depth.numel() == 0) return;
  const auto valid = inverse_depth ? depth.ge(0).logical_and(at::isfinite(depth)) : depth.gt(0);
  if (valid.all().item<bool>()) return;
  const auto first = valid.logical_not().flatten().nonzero().select(1, 0)[0].item<int64_t>();
  TORCH_CHECK(false, op, ": ",
              inverse_depth ? "inverse_depth must be finite and >= 0" : "depth must be > 0 (and not NaN)",
              ", got ", depth.flatten()[first].item<double>(), " at flat index ", first,
              " of shape ", depth.sizes());
}

inline void check_depth_flow_projection_backward_args(const at::Tensor& grad, const at::Tensor& flow,
                                                      const at::Tensor& depth, const at::Tensor& output,
                                                      const at::Tensor& count, double t) {
  constexpr const char* op = "_depth_flow_projection_backward";
  check_depth_flow_projection_args(flow, depth, t, op);
  TORCH_CHECK(grad.sizes() == flow.sizes() && output.sizes() == flow.sizes(), op,
              ": grad_output and output must have the shape of flow ", flow.sizes(), ", got ",
              grad.sizes(), " and ", output.sizes());
  TORCH_CHECK(count.dim() == 4 && count.size(0) == flow.size(0) && count.size(1) == 1 &&
                  count.size(2) == flow.size(2) && count.size(3) == flow.size(3),
              op, ": count must have shape (B, 1, H, W), got ", count.sizes());
  TORCH_CHECK(count.scalar_type() == flow_projection_acc_type(flow.scalar_type()), op,
              ": count must be ", flow_projection_acc_type(flow.scalar_type()), ", got ",
              count.scalar_type());
  TORCH_CHECK(grad.device() == flow.device() && output.device() == flow.device() &&
                  count.device() == flow.device(),
              op, ": all tensors must be on one device (", flow.device(), ")");
}

}  // namespace redet
