// The CUDA backends' check of the rois' values (and of the per-RoI levels of multi-level ops): one
// kernel finds the first bad rows, launched when the check is constructed; raise_if_bad() reads
// them back. An op that calls it after enqueueing its own kernels (which must then skip bad rows
// themselves) keeps the GPU busy during its one host synchronisation (common/cuda/async_readback.cuh).
#pragma once
#include <ATen/ATen.h>

#include "common/checks.h"
#include "common/cuda/async_readback.cuh"

namespace redet {

class DeferredRoiCheck {
 public:
  // levels undefined: a single-level op. rois are (K, ncols), already layout-checked.
  DeferredRoiCheck(const at::Tensor& rois, int64_t num_images,
                   const at::Tensor& levels = at::Tensor(), int64_t num_levels = 0);
  void raise_if_bad(const char* op);

 private:
  at::Tensor rois_, levels_, first_bad_;
  int64_t num_images_, num_levels_;
  AsyncReadback readback_;
};

}  // namespace redet
