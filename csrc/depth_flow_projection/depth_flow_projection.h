// Depth-aware flow projection (DAIN): the functions registered for its ops
// (depth_flow_projection.cpp), and the argument checks and host setup both backends share.
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "depth_flow_projection/depth_flow_projection_backward_math.h"

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

// depth must be > 0 (+inf allowed: weight 0); an inverse depth must be finite and >= 0: the rule
// of depth_is_valid (depth_flow_projection_math.h), over the whole tensor. The CPU forward runs it first; the
// CUDA forward only once its kernels flagged a bad value (to name it). Skipped when the caller
// asks (check_depth=False): the kernels then drop invalid pixels.
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
  TORCH_CHECK(grad.scalar_type() == flow.scalar_type() && output.scalar_type() == flow.scalar_type(),
              op, ": grad_output and output must have the dtype of flow (", flow.scalar_type(),
              "), got ", grad.scalar_type(), " and ", output.scalar_type());
  TORCH_CHECK(grad.device() == flow.device() && output.device() == flow.device() &&
                  count.device() == flow.device(),
              op, ": all tensors must be on one device (", flow.device(), ")");
}

// ---- host setup shared by both backends (after the checks; a CUDA caller holds its device guard) ----

// Contiguous inputs, their sizes and the allocated forward outputs: output F_t->0 like flow,
// count (B, 1, H, W) in the accumulation dtype.
struct FlowProjectionForward {
  at::Tensor flow, depth, output, count;
  int64_t batch;
  int height, width;
};

inline FlowProjectionForward prepare_flow_projection_forward(const at::Tensor& flow_,
                                                             const at::Tensor& depth_) {
  FlowProjectionForward f;
  f.flow = flow_.contiguous();
  f.depth = depth_.contiguous();
  f.batch = f.flow.size(0);
  f.height = f.flow.size(2);
  f.width = f.flow.size(3);
  const auto acc_type = flow_projection_acc_type(f.flow.scalar_type());
  f.output = at::empty_like(f.flow, at::MemoryFormat::Contiguous);
  f.count = at::empty({f.batch, 1, f.height, f.width}, f.flow.options().dtype(acc_type));
  return f;
}

// Contiguous backward inputs but grad_output (read in place through its strides: a
// non-contiguous one is common, .expand, .sum; DAIN reads one wrongly), sizes, the allocated
// gradients.
struct FlowProjectionBackward {
  at::Tensor grad, flow, depth, output, count, grad_flow, grad_depth;
  int64_t batch;
  int height, width;
};

inline FlowProjectionBackward prepare_flow_projection_backward(const at::Tensor& grad_,
                                                               const at::Tensor& flow_,
                                                               const at::Tensor& depth_,
                                                               const at::Tensor& output_,
                                                               const at::Tensor& count_) {
  FlowProjectionBackward b;
  b.grad = grad_;
  b.flow = flow_.contiguous();
  b.depth = depth_.contiguous();
  b.output = output_.contiguous();
  b.count = count_.contiguous();
  b.batch = b.flow.size(0);
  b.height = b.flow.size(2);
  b.width = b.flow.size(3);
  b.grad_flow = at::empty_like(b.flow, at::MemoryFormat::Contiguous);
  b.grad_depth = at::empty_like(b.depth, at::MemoryFormat::Contiguous);
  return b;
}

template <typename scalar_t>
GradView<scalar_t> grad_view(const at::Tensor& grad) {
  return {grad.data_ptr<scalar_t>(), grad.stride(0), grad.stride(1), grad.stride(2),
          grad.stride(3)};
}

// The backward's scratch memory, one allocation: the per-pixel terms, then, with hole filling, the
// run summaries (depth_flow_projection_backward_math.h). Everything in it is written
// before it is read: nothing to zero.
struct FlowBackwardWorkspace {
  at::Tensor buffer;
  int64_t pixels = 0, row_segments = 0, column_segments = 0;
  int height = 0, width = 0;

  template <typename acc_t>
  GradientTerms<acc_t>* terms() const {
    return reinterpret_cast<GradientTerms<acc_t>*>(buffer.data_ptr());
  }
  // (All offsets are multiples of sizeof(GradPair<acc_t>); the words come last.)
  template <typename acc_t>
  RunSummaries<acc_t> summaries() const {
    auto* pairs = reinterpret_cast<GradPair<acc_t>*>(terms<acc_t>() + pixels);
    GradPair<acc_t>* row_heads = pairs;
    GradPair<acc_t>* row_tails = row_heads + row_segments;
    GradPair<acc_t>* column_heads = row_tails + row_segments;
    GradPair<acc_t>* column_tails = column_heads + column_segments;
    auto* row_words = reinterpret_cast<uint32_t*>(column_tails + column_segments);
    uint32_t* column_words = row_words + row_segments;
    return {row_words, row_heads, row_tails, column_words, column_heads, column_tails, height,
            width};
  }
};

inline FlowBackwardWorkspace allocate_flow_backward_workspace(const FlowProjectionBackward& io,
                                                              bool fill_holes) {
  FlowBackwardWorkspace w;
  w.height = io.height;
  w.width = io.width;
  w.pixels = io.batch * io.height * io.width;
  const int64_t acc_bytes =
      static_cast<int64_t>(c10::elementSize(flow_projection_acc_type(io.flow.scalar_type())));
  int64_t bytes = w.pixels * 4 * acc_bytes;
  if (fill_holes) {
    w.row_segments = RunSummaries<float>::row_segments(io.batch, io.height, io.width);
    w.column_segments = RunSummaries<float>::column_segments(io.batch, io.height, io.width);
    bytes += (w.row_segments + w.column_segments) * (2 * 2 * acc_bytes + 4);
  }
  w.buffer = at::empty({bytes}, io.flow.options().dtype(at::kByte));
  return w;
}

// (output, count) from the forward, (grad_flow, grad_depth) from the backward.
using FlowProjectionResult = std::tuple<at::Tensor, at::Tensor>;

FlowProjectionResult depth_flow_projection_forward_cpu(const at::Tensor& flow,
                                                       const at::Tensor& depth, double t,
                                                       bool inverse_depth, bool fill_holes,
                                                       bool check_depth);
FlowProjectionResult depth_flow_projection_backward_cpu(
    const at::Tensor& grad_output, const at::Tensor& flow, const at::Tensor& depth,
    const at::Tensor& output, const at::Tensor& count, double t, bool inverse_depth,
    bool fill_holes);

FlowProjectionResult depth_flow_projection_forward_cuda(const at::Tensor& flow,
                                                        const at::Tensor& depth, double t,
                                                        bool inverse_depth, bool fill_holes,
                                                        bool check_depth);
FlowProjectionResult depth_flow_projection_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& flow, const at::Tensor& depth,
    const at::Tensor& output, const at::Tensor& count, double t, bool inverse_depth,
    bool fill_holes);

FlowProjectionResult depth_flow_projection_forward_autograd(const at::Tensor& flow,
                                                            const at::Tensor& depth, double t,
                                                            bool inverse_depth, bool fill_holes,
                                                            bool check_depth);
FlowProjectionResult depth_flow_projection_backward_autograd(
    const at::Tensor& grad_output, const at::Tensor& flow, const at::Tensor& depth,
    const at::Tensor& output, const at::Tensor& count, double t, bool inverse_depth,
    bool fill_holes);

}  // namespace redet
