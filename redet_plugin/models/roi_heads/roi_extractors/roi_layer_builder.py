"""Builds the per-level RoI layers of an extractor: registry first, then mmcv.ops.

mmdet's BaseRoIExtractor resolves a string `roi_layer.type` only in mmcv.ops, where our layers
('RedetRoIPool', 'RedetRiRoIAlignRotated') are not. Our extractors resolve the name in mmdet's
MODELS first (ours are registered there by redet_plugin.models.layers.op_modules;
`mmdet.X`-style scoped names work too) and fall back to mmcv.ops for everything else
('RoIAlign', ...).
"""
from typing import Sequence, Tuple

import torch.nn as nn
from mmcv import ops as mmcv_ops
from mmdet.registry import MODELS
from torch import Tensor

from redet_plugin.ops import RiRoIAlignRotated, RoIPool

# RoI layers whose kernels read NCHW and channels-last feature maps alike
_READ_ANY_LAYOUT = (RoIPool, RiRoIAlignRotated)


def resolve_roi_layer_class(layer_type) -> type:
    """A class is returned as is; a name is looked up in mmdet's MODELS, then in mmcv.ops."""
    if isinstance(layer_type, type):
        return layer_type
    if not isinstance(layer_type, str):
        raise TypeError(f"roi_layer: type must be a class or a name, got {layer_type!r}")
    layer_cls = MODELS.get(layer_type)
    if layer_cls is None:
        layer_cls = getattr(mmcv_ops, layer_type, None)
    if not isinstance(layer_cls, type) or not issubclass(layer_cls, nn.Module):
        raise KeyError(f"roi_layer: type {layer_type!r} is neither a module registered in mmdet's "
                       "MODELS (did custom_imports=['redet_plugin.mm'] run?) nor an mmcv.ops "
                       "class")
    return layer_cls


def build_roi_layers(layer_cfg, featmap_strides: Sequence[float]) -> nn.ModuleList:
    """One layer per feature level, each with spatial_scale = 1 / stride."""
    if not isinstance(layer_cfg, dict) or "type" not in layer_cfg:
        raise TypeError(f"roi_layer: expected a dict with a 'type' key, got {layer_cfg!r}")
    if not featmap_strides or any(not float(s) > 0 for s in featmap_strides):
        raise ValueError(f"featmap_strides: expected a non-empty list of positive strides, got "
                         f"{featmap_strides!r}")
    cfg = dict(layer_cfg)
    layer_cls = resolve_roi_layer_class(cfg.pop("type"))
    return nn.ModuleList([layer_cls(spatial_scale=1.0 / s, **cfg) for s in featmap_strides])


def pooled_size(layer: nn.Module) -> Tuple[int, int]:
    """The (h, w) a RoI layer outputs; mmcv's layers name it output_size or out_size."""
    size = getattr(layer, "output_size", None)
    if size is None:
        size = getattr(layer, "out_size", None)
    if size is None:
        raise AttributeError(f"{type(layer).__name__} has neither output_size nor out_size; cannot "
                             "tell the pooled size of its RoI features")
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


def readable_by(layer: nn.Module, feat: Tensor) -> Tensor:
    """`feat` in a layout `layer` reads: as it is for our layers, NCHW-contiguous for any other.
    mmcv 2.1's RoI kernels index every map as NCHW-contiguous whatever its strides: its
    roi_align_rotated pools wrong values from a channels-last map, with no error."""
    return feat if isinstance(layer, _READ_ANY_LAYOUT) else feat.contiguous()
