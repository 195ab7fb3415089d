"""RoIPool (Fast R-CNN max pooling) with torchvision's semantics.

Schema and kernels: csrc/roi_pool/. rois are (K, 5) = (batch_index, x1, y1, x2, y2) in image
coordinates, or a list of per-image (Ki, 4) boxes. Corners are rounded after scaling by
spatial_scale, malformed RoIs become 1x1, empty bins give 0 and pass no gradient.

Bad input raises a RuntimeError naming the argument. Shapes, dtypes and options are checked before
anything runs. The values of rois (finite, integer batch index in [0, N)) are checked on the CPU
before computing; on CUDA after the kernel is enqueued (the GPU never waits for the host; the
kernel skips bad rows), and not at all while a CUDA graph is captured, where a bad row pools zeros
(argmax -1) and passes no gradient (README: "Bad input, host waits and CUDA graphs").

`roi_pool_multilevel` pools every RoI from its own feature level (an FPN's) in one launch: equal
to `roi_pool` per level with the results put together, without pooling any RoI at a level not
its own.

The input's gradient has the input's layout: channels-last for a channels-last map, so the
convolution that made the map takes it without a conversion.
The CUDA backward sums float16/bfloat16 gradients in 16 bits with atomics (as torchvision does);
under torch.use_deterministic_algorithms(True) it sums exactly (64-bit fixed point), like the CPU.
"""
from typing import List, Sequence, Union

import torch
from torch import nn

from .. import _ext
from ._common import (as_float, check_levels_fake, empty_gradient, level_arguments,
                      output_size_pair, require_one_device, require_tensors,
                      rois_with_batch_index)

OP = "roi_pool"
MULTI_OP = "roi_pool_multilevel"

if _ext.is_loaded():
    @torch.library.register_fake("redet::roi_pool")
    def _roi_pool_fake(input, rois, spatial_scale, pooled_height, pooled_width):
        require_one_device(OP, input=input, rois=rois)
        torch._check(input.dim() == 4, lambda: "roi_pool: input must be 4-D")
        shape = (rois.shape[0], input.shape[1], pooled_height, pooled_width)
        return input.new_empty(shape), input.new_empty(shape, dtype=torch.int32)

    @torch.library.register_fake("redet::roi_pool_multilevel")
    def _roi_pool_multilevel_fake(features, rois, levels, spatial_scales, pooled_height,
                                  pooled_width):
        check_levels_fake(MULTI_OP, features, rois, levels, 5)
        first = features[0]
        shape = (rois.shape[0], first.shape[1], pooled_height, pooled_width)
        return first.new_empty(shape), first.new_empty(shape, dtype=torch.int32)

    @torch.library.register_fake("redet::_roi_pool_backward")
    def _roi_pool_backward_fake(grad, rois, argmax, batch_size, channels, height, width,
                                channels_last=False):
        require_one_device("_roi_pool_backward", grad_output=grad, rois=rois, argmax=argmax)
        return empty_gradient(grad, (batch_size, channels, height, width), channels_last)

    # Autograd (double backward included): csrc/roi_pool/roi_pool_autograd.cpp (in C++, so a call
    # costs no Python round trip).


def roi_pool(input: torch.Tensor, rois: Union[torch.Tensor, List[torch.Tensor]],
             output_size: Union[int, Sequence[int]], spatial_scale: float = 1.0) -> torch.Tensor:
    """Max-pools each RoI of `input` (N, C, H, W) into (K, C, *output_size).

    rois: (K, 5) = (batch_index, x1, y1, x2, y2), or a list of per-image (Ki, 4) boxes. Bad input
    raises (see the module docstring for when on CUDA).
    """
    require_tensors(OP, input=input)
    rois = rois_with_batch_index(rois, 4, OP)
    pooled_h, pooled_w = output_size_pair(output_size, OP)
    scale = as_float(spatial_scale, "spatial_scale", OP)
    _ext.require(OP, input, rois)
    output, _ = torch.ops.redet.roi_pool(input, rois, scale, pooled_h, pooled_w)
    return output


def roi_pool_multilevel(features: Sequence[torch.Tensor], rois: torch.Tensor,
                        levels: torch.Tensor, spatial_scales: Sequence[float],
                        output_size: Union[int, Sequence[int]]) -> torch.Tensor:
    """RoIPool over feature levels in one kernel launch.

    features: list of (N, C, H_l, W_l) maps; RoI k of rois (K, 5) is pooled from
    features[levels[k]] (levels: (K,) int64) with spatial_scales[levels[k]]. Equal to calling
    :func:`roi_pool` per level and putting the results together; every level gets a gradient
    (zeros where it has no RoI).
    """
    scales = level_arguments(MULTI_OP, features, rois, levels, spatial_scales)
    pooled_h, pooled_w = output_size_pair(output_size, MULTI_OP)
    _ext.require(MULTI_OP, *features, rois)
    output, _ = torch.ops.redet.roi_pool_multilevel(list(features), rois, levels, scales,
                                                    pooled_h, pooled_w)
    return output


class RoIPool(nn.Module):
    """nn.Module form of :func:`roi_pool`; `.output_size` is the (h, w) pair mmdet reads."""

    def __init__(self, output_size: Union[int, Sequence[int]], spatial_scale: float = 1.0):
        super().__init__()
        self.output_size = output_size_pair(output_size, OP)
        self.spatial_scale = as_float(spatial_scale, "spatial_scale", OP)

    def forward(self, input: torch.Tensor, rois) -> torch.Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}"
