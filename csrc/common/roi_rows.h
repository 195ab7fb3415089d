// The rules a RoI row must follow, written once for the host and the device. The ops check them
// at their boundary (common/checks.h on the CPU, common/cuda/roi_checks.cuh on CUDA) and every
// kernel that reads rois tests them again before using a row, so that a row breaking them never
// reaches memory outside the tensors: it pools zeros and passes no gradient (this is all that
// protects a CUDA graph replay, where no check can raise).
// A row (K, ncols): column 0 the batch index, an integer in [0, num_images); every value finite;
// for the multi-level op its level (a separate tensor) in [0, num_levels).
#pragma once
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "common/macros.h"

namespace redet {

enum class RoiRowFault : int { kNone = 0, kNonFinite, kBadIndex, kBadLevel };

// The first rule the row breaks, in that order. Single-level ops pass level 0 of 1. The values
// are compared in float for float, float16 and bfloat16 rows (exactly: they convert to float
// without rounding) and in double for double rows.
template <typename scalar_t>
REDET_HOST_DEVICE RoiRowFault roi_row_fault(const scalar_t* row, int ncols, int64_t num_images,
                                            int64_t level, int64_t num_levels) {
  using calc_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;
  for (int j = 0; j < ncols; ++j) {
    if (!isfinite(static_cast<calc_t>(row[j]))) return RoiRowFault::kNonFinite;
  }
  const calc_t index = static_cast<calc_t>(row[0]);
  // num_images as calc_t may round up (above 2^24 images in float): the guards then also clamp
  if (!(index == floor(index) && index >= calc_t(0) && index < static_cast<calc_t>(num_images))) {
    return RoiRowFault::kBadIndex;
  }
  if (level < 0 || level >= num_levels) return RoiRowFault::kBadLevel;
  return RoiRowFault::kNone;
}

// A kernel's guard: true, with the row's image, when the row may be used.
template <typename scalar_t>
REDET_HOST_DEVICE bool roi_row_image(const scalar_t* row, int ncols, int64_t num_images,
                                     int64_t level, int64_t num_levels, int64_t* image) {
  if (roi_row_fault(row, ncols, num_images, level, num_levels) != RoiRowFault::kNone) return false;
  *image = static_cast<int64_t>(static_cast<double>(row[0]));
  return *image < num_images;
}

}  // namespace redet
