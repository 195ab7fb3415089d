"""HorizontalSingleRoIExtractor: mmdet's SingleRoIExtractor without host synchronisations.

`roi_layer.type` is looked up in mmdet's MODELS first (then mmcv.ops), so
dict(type='RedetRoIPool', output_size=7) builds our RoIPool (CPU and CUDA, torchvision
semantics) while dict(type='RoIAlign', ...) still builds mmcv's.

mmdet pools each level's RoIs by listing them (nonzero: a wait for the GPU) and scattering the
results back. Here, on any device:
- our RoIPool pools every RoI from its own level in one launch (ops.roi_pool_multilevel);
- any other layer on CUDA sees all RoIs at every level, with those of other levels parked as an
  empty box far outside the image (no bin of it covers a pixel, so RoIAlign skips it at almost no
  cost), and each RoI takes the result of its own level;
- any other layer on the CPU keeps mmdet's listing (a read-back there costs no idle GPU, and a
  parked RoI would still cost the CPU kernel its bins).
The result is mmdet's, RoI for RoI; with the first two every level is in the graph, so DDP needs
no zero-weighted term for an unused level. Our ops' check of the rois' values, a host wait per
call on CUDA, is skipped (ops.unchecked_rois): rois made by bbox2roi need none.
"""
from typing import List, Optional, Tuple

import torch
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from mmdet.registry import MODELS
from torch import Tensor, nn

from redet_plugin.ops import unchecked_rois
from redet_plugin.utils.registration import register

from .fused_kernels import fused_kernel_for
from .roi_layer_builder import build_roi_layers, readable_by

_PARKED = -1.0e4  # image coordinates of the empty box that stands in for another level's RoI


@register(MODELS)
class HorizontalSingleRoIExtractor(SingleRoIExtractor):
    """Same arguments as mmdet's SingleRoIExtractor; rois (K, 5) = (batch_idx, x1, y1, x2, y2)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fused_kernel = fused_kernel_for(self.roi_layers[0])

    def build_roi_layers(self, layer_cfg: dict, featmap_strides: List[int]) -> nn.ModuleList:
        return build_roi_layers(layer_cfg, featmap_strides)

    def forward(self, feats: Tuple[Tensor], rois: Tensor,
                roi_scale_factor: Optional[float] = None) -> Tensor:
        feats = tuple(readable_by(self.roi_layers[0], feat) for feat in feats)
        # (an exported program takes a fixed-size way on the CPU too: the listing's shapes
        # depend on the data, which torch.export cannot trace)
        if (self.fused_kernel is None and rois.device.type == 'cpu'
                and not torch.compiler.is_exporting()):
            return super().forward(feats, rois, roi_scale_factor)
        with unchecked_rois():
            return self._pool(feats, rois.type_as(feats[0]), roi_scale_factor)

    def _pool(self, feats: Tuple[Tensor], rois: Tensor, roi_scale_factor) -> Tensor:
        num_levels = len(feats)
        if num_levels == 1:
            return self.roi_layers[0](feats[0], rois)
        levels = self.map_roi_levels(rois, num_levels)
        if roi_scale_factor is not None:
            rois = self.roi_rescale(rois, roi_scale_factor)
        if self.fused_kernel is not None:
            return self.fused_kernel(self.roi_layers[:num_levels], list(feats), rois, levels)
        parked = torch.cat([rois[:, :1], torch.full_like(rois[:, 1:], _PARKED)], dim=1)
        pooled = None
        for level in range(num_levels):
            member = levels == level
            level_rois = torch.where(member[:, None], rois, parked)
            level_pooled = self.roi_layers[level](feats[level], level_rois)
            pooled = level_pooled if pooled is None else torch.where(
                member[:, None, None, None], level_pooled, pooled)
        return pooled
