"""The compiled ops: functional forms and nn.Modules."""
from .roi_pool import RoIPool, roi_pool
from .depth_flow_projection import DepthFlowProjection, depth_flow_projection

__all__ = ["RoIPool", "roi_pool", "DepthFlowProjection", "depth_flow_projection"]
