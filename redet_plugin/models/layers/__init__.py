"""Building blocks of the heads that are plain functions (nothing registered)."""
from .multiclass_nms import FixedSizeDetections, multiclass_nms_fixed

__all__ = ['FixedSizeDetections', 'multiclass_nms_fixed']
