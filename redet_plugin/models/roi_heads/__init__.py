"""RoI heads for mmdet two-stage detectors."""
from .roipool_roi_head import RoIPoolRoIHead

__all__ = ["RoIPoolRoIHead"]
