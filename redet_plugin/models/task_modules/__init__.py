"""Box coders, IoU calculators, assigners and samplers (mmdet TASK_UTILS); mmdet's own where
they wait on the host, rewritten so that they do not."""
from .bbox_overlaps import BboxOverlaps2D
from .delta_xywh_bbox_coder import DeltaXYWHBBoxCoder
from .delta_xywht_hbbox_coder import DeltaXYWHTHBBoxCoder
from .delta_xywht_rbbox_coder import DeltaXYWHTRBBoxCoder
from .max_iou_assigner import MaxIoUAssigner
from .rbbox_overlaps import RBboxOverlaps2D

__all__ = ['BboxOverlaps2D', 'DeltaXYWHBBoxCoder', 'DeltaXYWHTHBBoxCoder', 'DeltaXYWHTRBBoxCoder',
           'MaxIoUAssigner', 'RBboxOverlaps2D']
