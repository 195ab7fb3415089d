// RiRoIAlignRotated (single- and multi-level): the schemas of its ops and of their backward ops,
// and the functions that implement them on each dispatch key (declared in riroi_align_rotated.h).
// A backend implements the multi-level forward and backward only; the single-level ops are their
// one-level case (levels undefined), adapted to the schemas below.
#include <torch/library.h>

#include <vector>

#include "riroi_align_rotated/riroi_align_rotated.h"

TORCH_LIBRARY_FRAGMENT(redet, m) {
  // input (N, C*nO, H, W), rois (K, 6) = (batch_index, cx, cy, w, h, theta)
  // -> (K, C*nO, out_h, out_w)
  m.def("riroi_align_rotated(Tensor input, Tensor rois, float spatial_scale, SymInt output_height, "
        "SymInt output_width, int num_samples, int num_orientations, bool clockwise, "
        "bool legacy_orientation) -> Tensor");
  // The backward ops give the input's gradient, channels-last in memory when channels_last (the
  // layout of the forward's input).
  m.def("_riroi_align_rotated_backward(Tensor grad_output, Tensor rois, float spatial_scale, "
        "int num_samples, int num_orientations, bool clockwise, bool legacy_orientation, "
        "SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
        "bool channels_last=False) -> Tensor");
  // The same over several feature levels in one launch: RoI k reads features[levels[k]] with
  // spatial_scales[levels[k]].
  m.def("riroi_align_rotated_multilevel(Tensor[] features, Tensor rois, Tensor levels, "
        "float[] spatial_scales, SymInt output_height, SymInt output_width, int num_samples, "
        "int num_orientations, bool clockwise, bool legacy_orientation) -> Tensor");
  m.def("_riroi_align_rotated_multilevel_backward(Tensor grad_output, Tensor rois, Tensor levels, "
        "float[] spatial_scales, int num_samples, int num_orientations, bool clockwise, "
        "bool legacy_orientation, SymInt batch_size, SymInt channels, SymInt[] heights, "
        "SymInt[] widths, bool channels_last=False) -> Tensor[]");
}

namespace redet {
namespace {

using Forward = at::Tensor (*)(at::TensorList, const at::Tensor&, const at::Tensor&,
                               at::ArrayRef<double>, const RiRoIOptions&, const char*,
                               const char*);
using Backward = std::vector<at::Tensor> (*)(const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, at::ArrayRef<double>,
                                             const RiRoIOptions&, int64_t, int64_t,
                                             at::IntArrayRef, at::IntArrayRef, bool, const char*);

// The backward ops take the output size from grad_output (0 when its rank is wrong, which the
// backend's check then reports).
RiRoIOptions backward_options(const at::Tensor& grad, int64_t num_samples,
                              int64_t num_orientations, bool clockwise, bool legacy) {
  return {grad.dim() == 4 ? grad.size(2) : 0, grad.dim() == 4 ? grad.size(3) : 0,
          num_samples, num_orientations, clockwise, legacy};
}

// The four schemas over one backend's forward and backward.
template <Forward forward, Backward backward>
struct Schemas {
  static at::Tensor align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale,
                          int64_t out_h, int64_t out_w, int64_t num_samples,
                          int64_t num_orientations, bool clockwise, bool legacy) {
    return forward({input}, rois, at::Tensor(), {spatial_scale},
                   {out_h, out_w, num_samples, num_orientations, clockwise, legacy}, "input",
                   "riroi_align_rotated");
  }

  static at::Tensor align_backward(const at::Tensor& grad, const at::Tensor& rois,
                                   double spatial_scale, int64_t num_samples,
                                   int64_t num_orientations, bool clockwise, bool legacy,
                                   int64_t batch_size, int64_t channels, int64_t height,
                                   int64_t width, bool channels_last) {
    return backward(grad, rois, at::Tensor(), {spatial_scale},
                    backward_options(grad, num_samples, num_orientations, clockwise, legacy),
                    batch_size, channels, {height}, {width}, channels_last,
                    "_riroi_align_rotated_backward")[0];
  }

  static at::Tensor align_levels(at::TensorList features, const at::Tensor& rois,
                                 const at::Tensor& levels, at::ArrayRef<double> spatial_scales,
                                 int64_t out_h, int64_t out_w, int64_t num_samples,
                                 int64_t num_orientations, bool clockwise, bool legacy) {
    return forward(features, rois, levels, spatial_scales,
                   {out_h, out_w, num_samples, num_orientations, clockwise, legacy}, "features",
                   "riroi_align_rotated_multilevel");
  }

  static std::vector<at::Tensor> align_levels_backward(
      const at::Tensor& grad, const at::Tensor& rois, const at::Tensor& levels,
      at::ArrayRef<double> spatial_scales, int64_t num_samples, int64_t num_orientations,
      bool clockwise, bool legacy, int64_t batch_size, int64_t channels, at::IntArrayRef heights,
      at::IntArrayRef widths, bool channels_last) {
    return backward(grad, rois, levels, spatial_scales,
                    backward_options(grad, num_samples, num_orientations, clockwise, legacy),
                    batch_size, channels, heights, widths, channels_last,
                    "_riroi_align_rotated_multilevel_backward");
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(redet, CPU, m) {  // cpu/riroi_align_rotated_cpu.cpp
  using Cpu = Schemas<&riroi_align_rotated_forward_cpu, &riroi_align_rotated_backward_cpu>;
  m.impl("riroi_align_rotated", &Cpu::align);
  m.impl("_riroi_align_rotated_backward", &Cpu::align_backward);
  m.impl("riroi_align_rotated_multilevel", &Cpu::align_levels);
  m.impl("_riroi_align_rotated_multilevel_backward", &Cpu::align_levels_backward);
}

#ifdef REDET_WITH_CUDA
TORCH_LIBRARY_IMPL(redet, CUDA, m) {  // cuda/riroi_align_rotated_{forward,backward}.cu
  using Cuda = Schemas<&riroi_align_rotated_forward_cuda, &riroi_align_rotated_backward_cuda>;
  m.impl("riroi_align_rotated", &Cuda::align);
  m.impl("_riroi_align_rotated_backward", &Cuda::align_backward);
  m.impl("riroi_align_rotated_multilevel", &Cuda::align_levels);
  m.impl("_riroi_align_rotated_multilevel_backward", &Cuda::align_levels_backward);
}
#endif

TORCH_LIBRARY_IMPL(redet, Autograd, m) {  // riroi_align_rotated_autograd.cpp
  m.impl("riroi_align_rotated", &riroi_align_rotated_forward_autograd);
  m.impl("_riroi_align_rotated_backward", &riroi_align_rotated_backward_autograd);
  m.impl("riroi_align_rotated_multilevel", &riroi_align_rotated_multilevel_forward_autograd);
  m.impl("_riroi_align_rotated_multilevel_backward",
         &riroi_align_rotated_multilevel_backward_autograd);
}

}  // namespace redet
