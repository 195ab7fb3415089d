"""Dense heads (mmdet MODELS)."""
from .rpn_head import RPNHead

__all__ = ['RPNHead']
