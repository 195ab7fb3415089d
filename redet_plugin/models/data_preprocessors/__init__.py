"""Data preprocessors (mmdet MODELS)."""
from .det_data_preprocessor import DetDataPreprocessor

__all__ = ['DetDataPreprocessor']
