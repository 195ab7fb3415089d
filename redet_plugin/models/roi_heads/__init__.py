"""RoI heads for mmdet two-stage detectors, their box heads and RoI extractors (mmdet MODELS)."""
from .bbox_heads import RotatedShared2FCBBoxHead
from .roi_extractors import HorizontalSingleRoIExtractor, RotatedSingleRoIExtractor
from .roi_transformer_head import RoITransformerRoIHead
from .roipool_roi_head import RoIPoolRoIHead

__all__ = ['HorizontalSingleRoIExtractor', 'RoIPoolRoIHead', 'RoITransformerRoIHead',
           'RotatedShared2FCBBoxHead', 'RotatedSingleRoIExtractor']
