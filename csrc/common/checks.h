// Argument checks at the op boundary: every message names the argument and says what was expected.
#pragma once
#include <ATen/ATen.h>

namespace redet {

inline void check_feature_map(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() == 4, op, ": input must be a 4-D (N, C, H, W) tensor, got ",
              input.dim(), "-D with shape ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op,
              ": input must be float16, bfloat16, float32 or float64, got ", input.scalar_type());
}

// rois: (K, ncols) with column 0 the batch index, an integer in [0, num_images).
// One host sync covers every check; details are computed only when something is wrong.
inline void check_rois(const at::Tensor& rois, const at::Tensor& input, int64_t ncols,
                       const char* layout, const char* op) {
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == ncols, op, ": rois must have shape (K, ", ncols,
              ") = ", layout, ", got ", rois.sizes());
  TORCH_CHECK(rois.device() == input.device(), op, ": rois must be on the same device as input (",
              input.device(), "), got ", rois.device());
  TORCH_CHECK(rois.scalar_type() == input.scalar_type(), op,
              ": rois must have the same dtype as input (", input.scalar_type(), "), got ",
              rois.scalar_type());
  if (rois.size(0) == 0) return;
  const auto r = rois.to(at::kDouble);
  const auto batch = r.select(1, 0);
  const auto finite = at::isfinite(r).all();
  const auto index_ok = (batch == batch.floor()).logical_and(batch >= 0)
                            .logical_and(batch < static_cast<double>(input.size(0))).all();
  if (finite.logical_and(index_ok).item<bool>()) return;
  TORCH_CHECK(finite.item<bool>(), op, ": rois contain NaN or infinite values (row ",
              at::isfinite(r).all(1).logical_not().nonzero().select(1, 0)[0].item<int64_t>(), ")");
  const auto bad = (batch == batch.floor()).logical_and(batch >= 0)
                       .logical_and(batch < static_cast<double>(input.size(0))).logical_not()
                       .nonzero().select(1, 0)[0].item<int64_t>();
  TORCH_CHECK(false, op, ": rois[:, 0] must hold integer batch indices in [0, ", input.size(0),
              ") (input has ", input.size(0), " images); row ", bad, " has ",
              batch[bad].item<double>());
}

inline void check_output_size(int64_t h, int64_t w, const char* op) {
  TORCH_CHECK(h > 0 && w > 0, op, ": output_size must be positive, got (", h, ", ", w, ")");
}

inline void check_positive(double value, const char* name, const char* op) {
  TORCH_CHECK(std::isfinite(value) && value > 0, op, ": ", name,
              " must be a positive finite number, got ", value);
}

}  // namespace redet
