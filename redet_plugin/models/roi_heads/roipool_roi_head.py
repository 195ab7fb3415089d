"""RoIPoolRoIHead: a Fast R-CNN-style RoI head for mmdet two-stage detectors.

mmdet's StandardRoIHead preset with our RoIPool (max pooling, torchvision semantics, CPU + CUDA)
on the FPN levels, pooled by HorizontalSingleRoIExtractor, and mmdet's Shared2FCBBoxHead (two
shared fc layers, then class scores and class-specific box deltas). In a config:

    roi_head=dict(type='RedetRoIPoolRoIHead', num_classes=3)

`bbox_roi_extractor` / `bbox_head` dicts, when given, are merged over the preset (a nested dict
with another `type` replaces the preset's instead); other arguments go to StandardRoIHead.
"""
import copy
from typing import Optional, Sequence

from mmdet.registry import MODELS
from mmdet.models.roi_heads import StandardRoIHead

from redet_plugin.utils.registration import register

from ..roi_extractors.roi_layer_builder import pooled_size


def _merged(preset: dict, override: Optional[dict]) -> dict:
    """`override` over `preset`, recursively; a different `type` discards the preset below it."""
    if override is None:
        return preset
    if "type" in override and override["type"] != preset.get("type"):
        return copy.deepcopy(dict(override))
    merged = dict(preset)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@register(MODELS)
class RoIPoolRoIHead(StandardRoIHead):
    """Args:
        num_classes (int): object classes (without background). Default 80.
        in_channels (int): channels of the FPN levels. Default 256.
        featmap_strides (list[int]): strides of the levels RoIs are pooled from. Default 4-32.
        roi_size (int): pooled size, RoIPool output and bbox head input. Default 7.
        fc_out_channels (int): width of the two shared fc layers. Default 1024.
        bbox_roi_extractor, bbox_head (dict, optional): merged over the preset.
        **kwargs: StandardRoIHead's (train_cfg, test_cfg, mask_head, ...).
    """

    def __init__(self, num_classes: int = 80, in_channels: int = 256,
                 featmap_strides: Sequence[int] = (4, 8, 16, 32), roi_size: int = 7,
                 fc_out_channels: int = 1024, bbox_roi_extractor: Optional[dict] = None,
                 bbox_head: Optional[dict] = None, **kwargs) -> None:
        preset_extractor = dict(
            type="RedetHorizontalSingleRoIExtractor",
            roi_layer=dict(type="RedetRoIPool", output_size=roi_size),
            out_channels=in_channels, featmap_strides=list(featmap_strides))
        preset_head = dict(
            type="Shared2FCBBoxHead", in_channels=in_channels, fc_out_channels=fc_out_channels,
            roi_feat_size=roi_size, num_classes=num_classes,
            bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0, 0.0, 0.0, 0.0],
                            target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type="L1Loss", loss_weight=1.0))
        super().__init__(bbox_roi_extractor=_merged(preset_extractor, bbox_roi_extractor),
                         bbox_head=_merged(preset_head, bbox_head), **kwargs)
        pooled = pooled_size(self.bbox_roi_extractor.roi_layers[0])
        expected = tuple(self.bbox_head.roi_feat_size)
        if pooled != expected:
            raise ValueError(f"RoIPoolRoIHead: the RoI layer pools to {pooled} but bbox_head "
                             f"expects roi_feat_size {expected}; set both through roi_size")
