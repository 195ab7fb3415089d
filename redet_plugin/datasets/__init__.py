"""DOTA-format dataset, rotation transforms and the synthetic DOTA-format data set."""
from .dota import DOTA_V1_CLASSES, DOTAAnnotationError, DOTADataset, parse_dota_line
from .synthetic import (SYNTHETIC_CLASSES, ensure_synthetic_dota, generate_synthetic_dota)
from .transforms import RandomRotate, RandomRotate90

__all__ = ['DOTADataset', 'DOTAAnnotationError', 'DOTA_V1_CLASSES', 'parse_dota_line',
           'SYNTHETIC_CLASSES', 'generate_synthetic_dota', 'ensure_synthetic_dota',
           'RandomRotate', 'RandomRotate90']
