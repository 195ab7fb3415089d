"""Assigners (mmdet TASK_UTILS)."""
from .max_iou_assigner import MaxIoUAssigner

__all__ = ['MaxIoUAssigner']
