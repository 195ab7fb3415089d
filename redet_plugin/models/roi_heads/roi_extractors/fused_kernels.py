"""Multi-level kernels: pool every RoI from its own FPN level in one launch.

`fused_kernel_for(layer)` returns a function (layers, feats, rois, levels) -> pooled features
when the layer's class has one, else None. The per-level layers only contribute their settings
(spatial_scale of each level, output size, sampling options); the kernel takes all levels at once.
"""
from typing import Callable, List, Optional

from torch import Tensor, nn

from redet_plugin.ops import (RiRoIAlignRotated, RoIPool, riroi_align_rotated_multilevel,
                              roi_pool_multilevel)

FusedKernel = Callable[[nn.ModuleList, List[Tensor], Tensor, Tensor], Tensor]


def _riroi_align_rotated_all_levels(layers: nn.ModuleList, feats: List[Tensor], rois: Tensor,
                                    levels: Tensor) -> Tensor:
    first = layers[0]
    return riroi_align_rotated_multilevel(
        feats, rois, levels, [layer.spatial_scale for layer in layers],
        output_size=first.output_size, num_samples=first.num_samples,
        num_orientations=first.num_orientations, clockwise=first.clockwise,
        legacy_orientation=first.legacy_orientation)


def _roi_pool_all_levels(layers: nn.ModuleList, feats: List[Tensor], rois: Tensor,
                         levels: Tensor) -> Tensor:
    return roi_pool_multilevel(feats, rois, levels, [layer.spatial_scale for layer in layers],
                               layers[0].output_size)


# Exact classes: a subclass may change the pooling, so it gets the per-level loop.
_KERNELS = {RiRoIAlignRotated: _riroi_align_rotated_all_levels, RoIPool: _roi_pool_all_levels}


def fused_kernel_for(layer: nn.Module) -> Optional[FusedKernel]:
    return _KERNELS.get(type(layer))
