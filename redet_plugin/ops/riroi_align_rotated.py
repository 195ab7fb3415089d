"""RiRoIAlignRotated: rotation-invariant RoI align for rotated RoIs (ReDet).

Schemas, kernels and the geometry both backends share (riroi_align_rotated_math.h) are in
csrc/riroi_align_rotated/.
input (N, C*nO, H, W) holds C orientation fields of nO channels each (channel c*nO + o); rois are
(K, 6) = (batch_index, cx, cy, w, h, theta in radians) in image coordinates, or a list of
per-image (Ki, 5) boxes. Each RoI is sampled on its rotated grid (the peer's spatial rules: w, h
clamped to >= 1 pixel after scaling, num_samples^2 bilinear samples per bin, ceil(bin size) when
0, averaged) and its orientation channels are cyclically shifted by theta * nO / 2pi and linearly
interpolated between the two nearest shifts, so the output is continuous in theta.
`legacy_orientation=True` reproduces mmcv's / ReDet's kernel, which interpolates toward the wrong
neighbour (its output jumps by two channels at every theta = k * 2pi / nO): use it for their
checkpoints. `clockwise` flips the angle of the spatial sampling only, as in the peer.

With features that are exactly equivariant (rotating the image by 2pi/nO rotates them and cycles
each field's channels by one), rotating the image about a RoI's centre leaves the output
unchanged when clockwise=True and the RoI's angle turns by -2pi/nO (tested in
tests/test_ops/test_riroi_align_rotated.py).

The gradient flows to the features only, in their layout (channels-last when every level is, so
the convolutions that made them take it without a conversion); under
torch.use_deterministic_algorithms(True) the CUDA backward is bitwise repeatable (the CPU backward
always is).

Bad input raises a RuntimeError naming the argument. Shapes, dtypes and options are checked before
anything runs. The values of rois (finite, integer batch index in [0, N); multi-level: level in
[0, L)) are checked on the CPU before computing; on CUDA after the kernels are enqueued (the GPU
never waits for the host; the kernels skip bad rows), and not at all while a CUDA graph is
captured, where a bad row pools zeros and passes no gradient (README: "Bad input, host waits and
CUDA graphs").
"""
from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from .. import _ext
from ._common import (as_float, as_int, check_levels_fake, empty_gradient, level_arguments,
                      output_size_pair, require_one_device, require_tensors,
                      rois_with_batch_index)

OP = "riroi_align_rotated"
MULTI_OP = "riroi_align_rotated_multilevel"

if _ext.is_loaded():
    @torch.library.register_fake("redet::riroi_align_rotated")
    def _forward_fake(input, rois, spatial_scale, output_height, output_width, num_samples,
                      num_orientations, clockwise, legacy_orientation):
        require_one_device(OP, input=input, rois=rois)
        torch._check(input.dim() == 4, lambda: f"{OP}: input must be 4-D")
        torch._check(rois.dim() == 2 and rois.shape[1] == 6, lambda: f"{OP}: rois must be (K, 6)")
        return input.new_empty((rois.shape[0], input.shape[1], output_height, output_width))

    @torch.library.register_fake("redet::_riroi_align_rotated_backward")
    def _backward_fake(grad, rois, spatial_scale, num_samples, num_orientations, clockwise,
                       legacy_orientation, batch_size, channels, height, width,
                       channels_last=False):
        require_one_device("_riroi_align_rotated_backward", grad_output=grad, rois=rois)
        return empty_gradient(grad, (batch_size, channels, height, width), channels_last)

    @torch.library.register_fake("redet::riroi_align_rotated_multilevel")
    def _multilevel_fake(features, rois, levels, spatial_scales, output_height, output_width,
                         num_samples, num_orientations, clockwise, legacy_orientation):
        check_levels_fake(MULTI_OP, features, rois, levels, 6)
        first = features[0]
        return first.new_empty((rois.shape[0], first.shape[1], output_height, output_width))

    @torch.library.register_fake("redet::_riroi_align_rotated_multilevel_backward")
    def _multilevel_backward_fake(grad, rois, levels, spatial_scales, num_samples,
                                  num_orientations, clockwise, legacy_orientation, batch_size,
                                  channels, heights, widths, channels_last=False):
        require_one_device("_riroi_align_rotated_multilevel_backward", grad_output=grad,
                           rois=rois, levels=levels)
        return [empty_gradient(grad, (batch_size, channels, h, w), channels_last)
                for h, w in zip(heights, widths)]

    # Autograd (double backward included), in C++ so that a call costs no Python round trip:
    # csrc/riroi_align_rotated/riroi_align_rotated_autograd.cpp.


def _options(num_samples, num_orientations, clockwise, legacy_orientation, op: str):
    """The options as the op's argument types (their values are the op's to check)."""
    return (as_int(num_samples, "num_samples", op),
            as_int(num_orientations, "num_orientations", op), bool(clockwise),
            bool(legacy_orientation))


def riroi_align_rotated(input: torch.Tensor, rois: Union[torch.Tensor, List[torch.Tensor]],
                        output_size: Union[int, Sequence[int]], spatial_scale: float = 1.0,
                        num_samples: int = 0, num_orientations: int = 8, clockwise: bool = False,
                        legacy_orientation: bool = False) -> torch.Tensor:
    """Pools each rotated RoI of `input` (N, C*nO, H, W) into (K, C*nO, *output_size).

    rois: (K, 6) = (batch_index, cx, cy, w, h, theta), or a list of per-image (Ki, 5) boxes. Bad
    input raises (see the module docstring for when on CUDA).
    """
    require_tensors(OP, input=input)
    rois = rois_with_batch_index(rois, 5, OP)
    out_h, out_w = output_size_pair(output_size, OP)
    scale = as_float(spatial_scale, "spatial_scale", OP)
    options = _options(num_samples, num_orientations, clockwise, legacy_orientation, OP)
    _ext.require(OP, input, rois)
    return torch.ops.redet.riroi_align_rotated(input, rois, scale, out_h, out_w, *options)


def riroi_align_rotated_multilevel(features: Sequence[torch.Tensor], rois: torch.Tensor,
                                   levels: torch.Tensor, spatial_scales: Sequence[float],
                                   output_size: Union[int, Sequence[int]], num_samples: int = 0,
                                   num_orientations: int = 8, clockwise: bool = False,
                                   legacy_orientation: bool = False) -> torch.Tensor:
    """RiRoIAlignRotated over feature levels in one kernel launch.

    features: list of (N, C*nO, H_l, W_l) maps; RoI k is pooled from features[levels[k]] (levels:
    (K,) int64) with spatial_scales[levels[k]]. Equal to calling :func:`riroi_align_rotated` per
    level and scattering the results; every level gets a gradient (zeros where it has no RoI).
    """
    scales = level_arguments(MULTI_OP, features, rois, levels, spatial_scales)
    out_h, out_w = output_size_pair(output_size, MULTI_OP)
    options = _options(num_samples, num_orientations, clockwise, legacy_orientation, MULTI_OP)
    _ext.require(MULTI_OP, *features, rois)
    return torch.ops.redet.riroi_align_rotated_multilevel(list(features), rois, levels, scales,
                                                          out_h, out_w, *options)


class RiRoIAlignRotated(nn.Module):
    """nn.Module form of :func:`riroi_align_rotated`; `.output_size` is the (h, w) pair mmdet
    reads. `out_size` is accepted as an alias so mmcv / mmrotate configs load unchanged."""

    def __init__(self, output_size: Optional[Union[int, Sequence[int]]] = None,
                 spatial_scale: float = 1.0, num_samples: int = 0, num_orientations: int = 8,
                 clockwise: bool = False, legacy_orientation: bool = False,
                 out_size: Optional[Union[int, Sequence[int]]] = None):
        super().__init__()
        if output_size is None and out_size is None:
            raise TypeError(f"{OP}: pass output_size (or its alias out_size)")
        if output_size is not None and out_size is not None and (
                output_size_pair(output_size, OP) != output_size_pair(out_size, OP)):
            raise ValueError(f"{OP}: output_size={output_size!r} and its alias "
                             f"out_size={out_size!r} disagree")
        self.output_size = output_size_pair(output_size if output_size is not None else out_size, OP)
        self.spatial_scale = as_float(spatial_scale, "spatial_scale", OP)
        (self.num_samples, self.num_orientations, self.clockwise,
         self.legacy_orientation) = _options(num_samples, num_orientations, clockwise,
                                             legacy_orientation, OP)

    def forward(self, input: torch.Tensor, rois) -> torch.Tensor:
        return riroi_align_rotated(input, rois, self.output_size, self.spatial_scale,
                                   self.num_samples, self.num_orientations, self.clockwise,
                                   self.legacy_orientation)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"num_samples={self.num_samples}, num_orientations={self.num_orientations}, "
                f"clockwise={self.clockwise}, legacy_orientation={self.legacy_orientation}")
