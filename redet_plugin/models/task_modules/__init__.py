"""Box coders, IoU calculators, assigners and samplers (mmdet TASK_UTILS), laid out as mmdet's
task_modules; mmdet's own where they wait on the host, rewritten so that they do not."""
from .assigners import MaxIoUAssigner
from .coders import DeltaXYWHBBoxCoder, DeltaXYWHTHBBoxCoder, DeltaXYWHTRBBoxCoder
from .iou_calculators import BboxOverlaps2D, RBboxOverlaps2D

__all__ = ['BboxOverlaps2D', 'DeltaXYWHBBoxCoder', 'DeltaXYWHTHBBoxCoder', 'DeltaXYWHTRBBoxCoder',
           'MaxIoUAssigner', 'RBboxOverlaps2D']
