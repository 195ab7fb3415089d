"""Box heads of the RoI heads (mmdet MODELS)."""
from .rotated_bbox_head import RotatedShared2FCBBoxHead

__all__ = ['RotatedShared2FCBBoxHead']
