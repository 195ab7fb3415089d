"""RoIPoolRoIHead: a Fast R-CNN-style RoI head for mmdet two-stage detectors.

mmdet's StandardRoIHead preset with our RoIPool (max pooling, torchvision semantics, CPU + CUDA)
on the FPN levels, pooled by HorizontalSingleRoIExtractor, and mmdet's Shared2FCBBoxHead (two
shared fc layers, then class scores and class-specific box deltas). In a config:

    roi_head=dict(type='RedetRoIPoolRoIHead', num_classes=3)

and over a `_base_` config that has a roi_head already (mmdet's Faster R-CNN, for instance):

    roi_head=dict(_delete_=True, type='RedetRoIPoolRoIHead', num_classes=3)

(mmengine merges a child's roi_head dict into the base's: without `_delete_` the base's
bbox_head, num_classes=80, and bbox_roi_extractor, RoIAlign, would come along.)

`bbox_roi_extractor` / `bbox_head` dicts, when given, are merged over the preset (a nested dict
with another `type` replaces the preset's instead); other arguments go to StandardRoIHead. An
argument given explicitly (num_classes, in_channels, ...) that those dicts set to another value
is an error: which of the two was meant cannot be told.
"""
import copy
import warnings
from typing import List, Optional, Sequence

from mmdet.registry import MODELS
from mmdet.models.roi_heads import StandardRoIHead

from redet_plugin.utils.registration import register

from ...ops import RoIPool
from .roi_extractors.roi_layer_builder import pooled_size

DEFAULTS = dict(num_classes=80, in_channels=256, featmap_strides=(4, 8, 16, 32), roi_size=7,
                fc_out_channels=1024)
DELETE_HINT = ("If these dicts come from a _base_ config (mmengine merges your roi_head into the "
               "base's, e.g. mmdet's Faster R-CNN with num_classes=80 and RoIAlign), write "
               "roi_head=dict(_delete_=True, type='RedetRoIPoolRoIHead', ...) to drop the base's heads")


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


def _normalised(arg: str, value):
    """Compares sizes written as 7 or (7, 7), and strides as lists or tuples."""
    if arg == "roi_size":
        return tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if arg == "featmap_strides":
        return tuple(value)
    return value


def _conflicts(explicit: dict, extractor: dict, head: dict) -> List[str]:
    """'arg=value but dict.key=other' for every explicit argument the final dicts contradict."""
    where = [("num_classes", "bbox_head", head, "num_classes"),
             ("in_channels", "bbox_head", head, "in_channels"),
             ("in_channels", "bbox_roi_extractor", extractor, "out_channels"),
             ("fc_out_channels", "bbox_head", head, "fc_out_channels"),
             ("roi_size", "bbox_head", head, "roi_feat_size"),
             ("roi_size", "bbox_roi_extractor.roi_layer", extractor.get("roi_layer") or {},
              "output_size"),
             ("featmap_strides", "bbox_roi_extractor", extractor, "featmap_strides")]
    found = []
    for arg, name, cfg, key in where:
        if arg in explicit and cfg.get(key) is not None and \
                _normalised(arg, cfg[key]) != _normalised(arg, explicit[arg]):
            found.append(f"{arg}={explicit[arg]!r} but {name}.{key}={cfg[key]!r}")
    return found


@register(MODELS)
class RoIPoolRoIHead(StandardRoIHead):
    """Args:
        num_classes (int): object classes (without background). Default 80.
        in_channels (int): channels of the FPN levels. Default 256.
        featmap_strides (list[int]): strides of the levels RoIs are pooled from. Default 4-32.
        roi_size (int): pooled size, RoIPool output and bbox head input. Default 7.
        fc_out_channels (int): width of the two shared fc layers. Default 1024.
        bbox_roi_extractor, bbox_head (dict, optional): merged over the preset; they must not
            contradict the arguments above that are given explicitly.
        **kwargs: StandardRoIHead's (train_cfg, test_cfg, mask_head, ...).
    """

    def __init__(self, num_classes: Optional[int] = None, in_channels: Optional[int] = None,
                 featmap_strides: Optional[Sequence[int]] = None, roi_size: Optional[int] = None,
                 fc_out_channels: Optional[int] = None, bbox_roi_extractor: Optional[dict] = None,
                 bbox_head: Optional[dict] = None, **kwargs) -> None:
        given = dict(num_classes=num_classes, in_channels=in_channels,
                     featmap_strides=featmap_strides, roi_size=roi_size,
                     fc_out_channels=fc_out_channels)
        explicit = {k: v for k, v in given.items() if v is not None}
        args = dict(DEFAULTS, **explicit)
        preset_extractor = dict(
            type="RedetHorizontalSingleRoIExtractor",
            roi_layer=dict(type="RedetRoIPool", output_size=args["roi_size"]),
            out_channels=args["in_channels"], featmap_strides=list(args["featmap_strides"]))
        preset_head = dict(
            type="Shared2FCBBoxHead", in_channels=args["in_channels"],
            fc_out_channels=args["fc_out_channels"], roi_feat_size=args["roi_size"],
            num_classes=args["num_classes"],
            bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0, 0.0, 0.0, 0.0],
                            target_stds=[0.1, 0.1, 0.2, 0.2]),
            reg_class_agnostic=False,
            loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False, loss_weight=1.0),
            loss_bbox=dict(type="L1Loss", loss_weight=1.0))
        extractor_cfg = _merged(preset_extractor, bbox_roi_extractor)
        head_cfg = _merged(preset_head, bbox_head)
        conflicts = _conflicts(explicit, extractor_cfg, head_cfg)
        if conflicts:
            raise ValueError(f"RoIPoolRoIHead: {'; '.join(conflicts)}. {DELETE_HINT}, or set each "
                             "value in one place only.")
        super().__init__(bbox_roi_extractor=extractor_cfg, bbox_head=head_cfg, **kwargs)
        pooled = pooled_size(self.bbox_roi_extractor.roi_layers[0])
        expected = tuple(self.bbox_head.roi_feat_size)
        if pooled != expected:
            raise ValueError(f"RoIPoolRoIHead: the RoI layer pools to {pooled} but bbox_head "
                             f"expects roi_feat_size {expected}; set both through roi_size")
        layer = self.bbox_roi_extractor.roi_layers[0]
        if not isinstance(layer, RoIPool):
            warnings.warn(f"RoIPoolRoIHead: bbox_roi_extractor ({extractor_cfg.get('type')}) pools "
                          f"with {type(layer).__module__}.{type(layer).__name__}, not "
                          f"redet_plugin's RoIPool. {DELETE_HINT}.")
