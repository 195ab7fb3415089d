"""DOTA-format dataset, rotation transforms and the synthetic DOTA-format data set."""
from .dota import (DOTA_V1_CLASSES, DOTAAnnotationError, DOTADataError, DOTAAnnotationWarning, DOTADataset,
                   parse_dota_line)
from .dota_split import cut_objects, pad_patch, patch_origins, patch_windows, split_dota, split_image
from .patch_naming import parse_patch_id, patch_id
from .synthetic import (SYNTHETIC_CLASSES, ensure_synthetic_dota, generate_synthetic_dota)
from .synthetic_dataset import SyntheticDOTADataset
from .transforms import RandomRotate, RandomRotate90

__all__ = ['DOTADataset', 'SyntheticDOTADataset', 'DOTAAnnotationError', 'DOTADataError', 'DOTAAnnotationWarning', 'DOTA_V1_CLASSES', 'parse_dota_line',
           'SYNTHETIC_CLASSES', 'generate_synthetic_dota', 'ensure_synthetic_dota',
           'RandomRotate', 'RandomRotate90', 'split_dota', 'split_image', 'cut_objects',
           'patch_origins', 'patch_windows', 'pad_patch', 'patch_id', 'parse_patch_id']
