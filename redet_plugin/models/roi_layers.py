"""The RoI ops as registry entries: `dict(type='RoIPool', output_size=7)` or
`dict(type='RiRoIAlignRotated', output_size=7, num_samples=2, num_orientations=8, clockwise=True)`
build ours through mmdet's MODELS.

The ops package stays free of mm* imports; this module is the bridge. Our extractors look a
roi_layer type up here first, then in mmcv.ops (see roi_extractors/roi_layer_builder.py).
"""
from ..ops import RiRoIAlignRotated, RoIPool
from ._registry import register_once

register_once()(RoIPool)
register_once()(RiRoIAlignRotated)
