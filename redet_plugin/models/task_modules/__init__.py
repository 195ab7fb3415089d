"""Rotated box coders, IoU calculators and assigners (mmdet TASK_UTILS)."""
from .delta_xywht_hbbox_coder import DeltaXYWHTHBBoxCoder
from .delta_xywht_rbbox_coder import DeltaXYWHTRBBoxCoder
from .max_iou_assigner import MaxIoUAssigner
from .rbbox_overlaps import RBboxOverlaps2D

__all__ = ['DeltaXYWHTHBBoxCoder', 'DeltaXYWHTRBBoxCoder', 'MaxIoUAssigner', 'RBboxOverlaps2D']
