"""Detection on new images of any size (tools/infer.py; docs/inference.md): patches cut lazily on
the splitter's grid (structures/patch_grid.py), run in batches, merged with
evaluation.patch_merge's class-wise rotated NMS.

    from redet_plugin.inference import RotatedDetector
    result = RotatedDetector(config, checkpoint, device='cuda').predict('image.png')
"""
from .detector import DetectionResult, RotatedDetector, default_device
from .image_source import ImageReadError, ImageSource
from .patch_inference import Detections, detect_by_patches
from .patches import read_patch
from ..structures.patch_grid import Patch, plan_patches
from ..utils.checkpoint_check import CheckpointMismatchError

__all__ = ['RotatedDetector', 'DetectionResult', 'default_device', 'ImageSource', 'ImageReadError', 'CheckpointMismatchError',
           'Detections', 'detect_by_patches', 'Patch', 'plan_patches', 'read_patch']
