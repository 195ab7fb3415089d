"""The compiled ops: functional forms and nn.Modules."""
from .depth_flow_projection import DepthFlowProjection, depth_flow_projection
from .nms import nms_keep_mask
from .riroi_align_rotated import (RiRoIAlignRotated, riroi_align_rotated,
                                  riroi_align_rotated_multilevel)
from .roi_pool import RoIPool, roi_pool, roi_pool_multilevel
from .roi_value_checks import unchecked_rois

__all__ = ["DepthFlowProjection", "RiRoIAlignRotated", "RoIPool", "depth_flow_projection",
           "nms_keep_mask", "riroi_align_rotated", "riroi_align_rotated_multilevel", "roi_pool",
           "roi_pool_multilevel", "unchecked_rois"]
