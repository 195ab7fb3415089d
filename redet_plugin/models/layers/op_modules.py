"""The ops' modules as registry entries, e.g. dict(type='RedetRoIPool', output_size=7) or
dict(type='RedetRiRoIAlignRotated', output_size=7, num_samples=2, num_orientations=8,
clockwise=True), and dict(type='RedetDepthFlowProjection', t=0.5, fill_holes=True).

The ops package stays free of mm* imports; this module is the bridge. mmdet's own extractors
resolve a string roi_layer type in mmcv.ops only: pass them the class
(`roi_layer=dict(type=RoIPool, ...)` in a Python config) or use our extractors, which look the
name up in mmdet's MODELS first (models/roi_heads/roi_extractors/roi_layer_builder.py).
"""
from mmdet.registry import MODELS

from redet_plugin.ops import DepthFlowProjection, RiRoIAlignRotated, RoIPool
from redet_plugin.utils.registration import register

for _module in (RoIPool, RiRoIAlignRotated, DepthFlowProjection):
    register(MODELS)(_module)
