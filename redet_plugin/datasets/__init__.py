"""Rotated-box data sets (DOTA v1.0/v1.5/v2.0, HRSC2016, DIOR-R), rotation transforms and the
synthetic data sets."""
from .bad_images import BadImagesMixin, image_file_problem
from .dior import DIOR_CLASSES, DIORAnnotationError, DIORDataset
from .errors import BadImageError
from .dota import (DOTA_V1_CLASSES, DOTA_V15_CLASSES, DOTA_V2_CLASSES, DOTAAnnotationError, DOTADataError,
                   DOTAAnnotationWarning, DOTADataset, DOTAv15Dataset, DOTAv2Dataset, parse_dota_line)
from .draws import DrawIndex, seeded_draws
from .dota_split import cut_objects, split_dota, split_image
from .hrsc import HRSC_CLASS_IDS, HRSC_CLASSES, HRSCAnnotationError, HRSCDataset
from .synthetic import (SYNTHETIC_CLASSES, ensure_synthetic_dota, generate_synthetic_dota)
from .synthetic_dataset import SyntheticDOTADataset
from .synthetic_layouts import SYNTHETIC_DIOR_CLASSES, generate_synthetic_dior, generate_synthetic_hrsc
from .transforms import RandomRotate, RandomRotate90
from ..structures.patch_grid import pad_patch, parse_patch_id, patch_id, patch_origins, patch_windows

__all__ = ['BadImageError', 'BadImagesMixin', 'image_file_problem', 'DrawIndex', 'seeded_draws',
           'DOTADataset', 'SyntheticDOTADataset', 'DOTAAnnotationError', 'DOTADataError', 'DOTAAnnotationWarning',
           'DOTA_V1_CLASSES', 'parse_dota_line',
           'DOTAv15Dataset', 'DOTAv2Dataset', 'DOTA_V15_CLASSES', 'DOTA_V2_CLASSES',
           'HRSCDataset', 'HRSCAnnotationError', 'HRSC_CLASSES', 'HRSC_CLASS_IDS',
           'DIORDataset', 'DIORAnnotationError', 'DIOR_CLASSES',
           'SYNTHETIC_CLASSES', 'generate_synthetic_dota', 'ensure_synthetic_dota',
           'SYNTHETIC_DIOR_CLASSES', 'generate_synthetic_hrsc', 'generate_synthetic_dior',
           'RandomRotate', 'RandomRotate90', 'split_dota', 'split_image', 'cut_objects',
           'patch_origins', 'patch_windows', 'pad_patch', 'patch_id', 'parse_patch_id']
