"""Rotated box coders and IoU calculators (mmdet TASK_UTILS)."""
from .delta_xywht_hbbox_coder import DeltaXYWHTHBBoxCoder
from .delta_xywht_rbbox_coder import DeltaXYWHTRBBoxCoder
from .rbbox_overlaps import RBboxOverlaps2D

__all__ = ['DeltaXYWHTHBBoxCoder', 'DeltaXYWHTRBBoxCoder', 'RBboxOverlaps2D']
