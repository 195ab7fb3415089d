// Argument checks at the op boundary: every message names the argument and says what was expected.
#pragma once
#include <ATen/ATen.h>

#include <cmath>
#include <string>

namespace redet {

inline void check_feature_map(const at::Tensor& input, const char* op) {
  TORCH_CHECK(input.dim() == 4, op, ": input must be a 4-D (N, C, H, W) tensor, got ",
              input.dim(), "-D with shape ", input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op,
              ": input must be float16, bfloat16, float32 or float64, got ", input.scalar_type());
}

// First RoI rows that break the rules (-1 when none): a NaN/inf value, or a batch index that is not
// an integer in [0, num_images). One pass on the rois' own device and a single small copy back.
struct BadRois {
  int64_t non_finite_row = -1;
  int64_t bad_index_row = -1;
};

inline BadRois find_bad_rois_cpu(const at::Tensor& rois, int64_t num_images) {
  const auto r = rois.to(at::kDouble).contiguous();
  const double* p = r.data_ptr<double>();
  BadRois bad;
  for (int64_t k = 0; k < r.size(0); ++k) {
    const double* row = p + k * r.size(1);
    bool finite = true;
    for (int64_t j = 0; j < r.size(1); ++j) finite = finite && std::isfinite(row[j]);
    if (!finite && bad.non_finite_row < 0) bad.non_finite_row = k;
    const bool index_ok = row[0] == std::floor(row[0]) && row[0] >= 0 && row[0] < num_images;
    if (finite && !index_ok && bad.bad_index_row < 0) bad.bad_index_row = k;
  }
  return bad;
}

#ifdef REDET_WITH_CUDA
BadRois find_bad_rois_cuda(const at::Tensor& rois, int64_t num_images);  // common/cuda/roi_checks.cu
#endif

// rois: (K, ncols) with column 0 the batch index, an integer in [0, num_images).
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
  BadRois bad;
#ifdef REDET_WITH_CUDA
  bad = rois.is_cuda() ? find_bad_rois_cuda(rois, input.size(0)) : find_bad_rois_cpu(rois, input.size(0));
#else
  bad = find_bad_rois_cpu(rois, input.size(0));
#endif
  TORCH_CHECK(bad.non_finite_row < 0, op, ": rois contain NaN or infinite values (row ",
              bad.non_finite_row, ")");
  TORCH_CHECK(bad.bad_index_row < 0, op, ": rois[:, 0] must hold integer batch indices in [0, ",
              input.size(0), ") (input has ", input.size(0), " images); row ", bad.bad_index_row,
              " has ", bad.bad_index_row < 0 ? 0.0 : rois[bad.bad_index_row][0].item<double>());
}

// The size of a map a backward op allocates (its gradient): an empty map would put border-clamped
// reads at pixel -1, and the kernels index a plane with int. `level` >= 0 names a pyramid level.
inline void check_map_size(int64_t height, int64_t width, const char* op, int64_t level = -1) {
  TORCH_CHECK(height >= 1 && width >= 1 && height * width < (int64_t(1) << 31), op,
              ": the input map", level >= 0 ? "s" : "", " must be at least 1 x 1 with height * width "
              "< 2^31, got height ", height, " and width ", width,
              level >= 0 ? " at level " + std::to_string(level) : std::string());
}

inline void check_output_size(int64_t h, int64_t w, const char* op) {
  TORCH_CHECK(h > 0 && w > 0, op, ": output_size must be positive, got (", h, ", ", w, ")");
}

inline void check_positive(double value, const char* name, const char* op) {
  TORCH_CHECK(std::isfinite(value) && value > 0, op, ": ", name,
              " must be a positive finite number, got ", value);
}

}  // namespace redet
