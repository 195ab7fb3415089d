"""HorizontalSingleRoIExtractor: mmdet's SingleRoIExtractor, but `roi_layer.type` is looked up
in mmdet's MODELS first (then mmcv.ops), so dict(type='RedetRoIPool', output_size=7) builds our
RoIPool (CPU and CUDA, torchvision semantics) while dict(type='RoIAlign', ...) still builds mmcv's.
Everything else (level mapping, roi_scale_factor, the per-level loop) is mmdet's.
"""
from typing import List

from mmdet.registry import MODELS
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from torch import nn

from redet_plugin.utils.registration import register

from .roi_layer_builder import build_roi_layers


@register(MODELS)
class HorizontalSingleRoIExtractor(SingleRoIExtractor):
    """Same arguments as mmdet's SingleRoIExtractor; rois (K, 5) = (batch_idx, x1, y1, x2, y2)."""

    def build_roi_layers(self, layer_cfg: dict, featmap_strides: List[int]) -> nn.ModuleList:
        return build_roi_layers(layer_cfg, featmap_strides)
