"""RoI heads for mmdet two-stage detectors (mmdet MODELS)."""
from .roi_transformer_head import RoITransformerRoIHead
from .roipool_roi_head import RoIPoolRoIHead
from .rotated_bbox_head import RotatedShared2FCBBoxHead

__all__ = ['RoIPoolRoIHead', 'RoITransformerRoIHead', 'RotatedShared2FCBBoxHead']
