// RoIPool: the schemas of the op and of its backward, and the functions that implement them on
// each dispatch key (declared in roi_pool.h).
#include <torch/library.h>

#include "roi_pool/roi_pool.h"

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // output (K, C, pooled_h, pooled_w) and argmax (int32 flat h * W + w of the max, -1 if empty)
  m.def("roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)");
  // RoI k from features[levels[k]] at spatial_scales[levels[k]]; argmax indexes the levels' maps
  // laid end to end (roi_pool.h). Its backward is _roi_pool_backward's (autograd).
  m.def("roi_pool_multilevel(Tensor[] features, Tensor rois, Tensor levels, float[] spatial_scales, "
        "SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)");
  // the input's gradient (batch_size, channels, height, width), channels-last in memory when
  // channels_last (the layout of the forward's input)
  m.def("_roi_pool_backward(Tensor grad_output, Tensor rois, Tensor argmax, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width, bool channels_last=False) -> Tensor");
}

namespace redet {

TORCH_LIBRARY_IMPL(redet, CPU, m) {  // cpu/roi_pool_cpu.cpp
  m.impl("roi_pool", &roi_pool_forward_cpu);
  m.impl("roi_pool_multilevel", &roi_pool_multilevel_forward_cpu);
  m.impl("_roi_pool_backward", &roi_pool_backward_cpu);
}

#ifdef REDET_WITH_CUDA
TORCH_LIBRARY_IMPL(redet, CUDA, m) {  // cuda/roi_pool_forward.cu, cuda/roi_pool_backward.cu
  m.impl("roi_pool", &roi_pool_forward_cuda);
  m.impl("roi_pool_multilevel", &roi_pool_multilevel_forward_cuda);
  m.impl("_roi_pool_backward", &roi_pool_backward_cuda);
}
#endif

TORCH_LIBRARY_IMPL(redet, Autograd, m) {  // roi_pool_autograd.cpp
  m.impl("roi_pool", &roi_pool_forward_autograd);
  m.impl("roi_pool_multilevel", &roi_pool_multilevel_forward_autograd);
  m.impl("_roi_pool_backward", &roi_pool_backward_autograd);
}

}  // namespace redet
