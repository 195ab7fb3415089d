// Greedy NMS with a fixed-size output: the schema of the op and the functions that implement it
// on each dispatch key (declared in nms_keep_mask.h). No autograd: a keep mask has no gradient.
#include <torch/library.h>

#include "nms_keep_mask/nms_keep_mask.h"

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // keep (N,) bool in input order; boxes (N, 5) rotated or (N, 4) horizontal; labels (N,) int64
  m.def("nms_keep_mask(Tensor boxes, Tensor scores, float iou_threshold, Tensor? labels=None) "
        "-> Tensor");
}

namespace redet {

TORCH_LIBRARY_IMPL(redet, CPU, m) {  // cpu/nms_keep_mask_cpu.cpp
  m.impl("nms_keep_mask", &nms_keep_mask_cpu);
}

#ifdef REDET_WITH_CUDA
TORCH_LIBRARY_IMPL(redet, CUDA, m) {  // cuda/nms_keep_mask_forward.cu
  m.impl("nms_keep_mask", &nms_keep_mask_cuda);
}
#endif

}  // namespace redet
