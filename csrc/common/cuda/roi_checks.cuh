// The CUDA backends' check of the rois' values (and of the per-RoI levels of multi-level ops), by
// the rules of common/roi_rows.h: one kernel, launched when the check is constructed, sets a flag
// if any row is bad; raise_if_bad() reads it (and only then finds and names the first bad rows,
// on the host). An op constructs the check before its own kernels and calls raise_if_bad() after
// enqueueing them, so the GPU keeps working during its one host synchronisation
// (common/cuda/host_flag.cuh); its kernels must therefore skip bad rows themselves. While a CUDA
// graph is captured, or while the calling thread has switched the checks off
// (common/roi_value_checks.h), the check does nothing (no kernel, no wait, no error): the guards
// remain.
#pragma once
#include <ATen/ATen.h>

#include <optional>

#include "common/checks.h"
#include "common/cuda/host_flag.cuh"
#include "common/roi_value_checks.h"

namespace redet {

class DeferredRoiCheck {
 public:
  // levels undefined: a single-level op. rois are (K, ncols), already layout-checked. The caller
  // holds the device guard and enqueues its kernels on the current stream after this.
  DeferredRoiCheck(const at::Tensor& rois, int64_t num_images,
                   const at::Tensor& levels = at::Tensor(), int64_t num_levels = 0);
  void raise_if_bad(const char* op);

 private:
  at::Tensor rois_, levels_;
  int64_t num_images_, num_levels_;
  std::optional<HostFlag> any_bad_;  // none when there are no rois, or while capturing
};

}  // namespace redet
