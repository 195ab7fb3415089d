"""RoI feature extractors whose roi_layer may be any of our ops (registry first, then mmcv.ops)."""
from .horizontal_single_level_roi_extractor import HorizontalSingleRoIExtractor
from .rotated_single_level_roi_extractor import RotatedSingleRoIExtractor

__all__ = ["HorizontalSingleRoIExtractor", "RotatedSingleRoIExtractor"]
