"""RoI heads of the RoI Transformer (mmdet MODELS)."""
from .roi_transformer_head import RoITransformerRoIHead
from .rotated_bbox_head import RotatedShared2FCBBoxHead

__all__ = ['RoITransformerRoIHead', 'RotatedShared2FCBBoxHead']
