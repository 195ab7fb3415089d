// The CUDA backends' check of the rois' values (and of the per-RoI levels of multi-level ops): one
// kernel, launched when the check is constructed, sets a flag if any row is bad; raise_if_bad()
// reads it (and only then finds and names the first bad rows, on the host). An op that calls it
// after enqueueing its own kernels (which must then skip bad rows themselves) keeps the GPU busy
// during its one host synchronisation (common/cuda/host_flag.cuh).
#pragma once
#include <ATen/ATen.h>

#include <optional>

#include "common/checks.h"
#include "common/cuda/host_flag.cuh"

namespace redet {

class DeferredRoiCheck {
 public:
  // levels undefined: a single-level op. rois are (K, ncols), already layout-checked.
  DeferredRoiCheck(const at::Tensor& rois, int64_t num_images,
                   const at::Tensor& levels = at::Tensor(), int64_t num_levels = 0);
  void raise_if_bad(const char* op);

 private:
  at::Tensor rois_, levels_;
  int64_t num_images_, num_levels_;
  std::optional<HostFlag> any_bad_;  // none when there are no rois
};

}  // namespace redet
