"""IoU calculators for the assigners (mmdet TASK_UTILS)."""
from .bbox_overlaps import BboxOverlaps2D
from .rbbox_overlaps import RBboxOverlaps2D

__all__ = ['BboxOverlaps2D', 'RBboxOverlaps2D']
