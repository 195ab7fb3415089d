"""Registers the depth-aware flow projection module in mmdet's MODELS registry, so that configs can
build it with dict(type='DepthFlowProjection', t=0.5, fill_holes=True)."""
from mmdet.registry import MODELS

from ..ops.depth_flow_projection import DepthFlowProjection

MODELS.register_module(name="DepthFlowProjection", module=DepthFlowProjection)
