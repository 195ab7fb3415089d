"""Box coders (mmdet TASK_UTILS) and the delta math they share."""
from .delta_xywh_bbox_coder import DeltaXYWHBBoxCoder
from .delta_xywht_hbbox_coder import DeltaXYWHTHBBoxCoder
from .delta_xywht_rbbox_coder import DeltaXYWHTRBBoxCoder

__all__ = ['DeltaXYWHBBoxCoder', 'DeltaXYWHTHBBoxCoder', 'DeltaXYWHTRBBoxCoder']
