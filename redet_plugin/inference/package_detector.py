"""PackageDetector: RotatedDetector's patching and merging around an exported package
(tools/export.py, redet_plugin.deploy) instead of a config and checkpoint."""
from typing import List, Optional, Sequence

import numpy as np

from ..deploy import load
from .detector import RotatedDetector
from .patch_inference import Detections


class PackageDetector(RotatedDetector):
    """Detection on images of any size with an exported package: the same patches, batches,
    score threshold and merge as RotatedDetector (its arguments but config, checkpoint,
    cfg_options and plain, which the export fixed). Each patch is run as the package runs an
    image; patches must fit its input size (smaller ones are padded at the bottom and right)."""

    def __init__(self, package: str, device: Optional[str] = None, patch_size: int = 1024,
                 patch_overlap: int = 200, scales: Sequence[float] = (1.0,), batch_size: int = 1,
                 score_thr: float = 0.05, merge_iou_thr: float = 0.1) -> None:
        self._set_patching(patch_size, patch_overlap, scales, batch_size, score_thr, merge_iou_thr)
        self.deployed = load(package, device)
        height, width = self.deployed.input_size
        if self.patch_size > min(height, width):
            raise ValueError(f'patch_size: {self.patch_size} does not fit the package\'s input '
                             f'size {height}x{width}; use --patch-size {min(height, width)} or '
                             f'export with --image-size {self.patch_size} {self.patch_size}')
        self.device = self.deployed.device
        self.classes, self.palette = self.deployed.classes, None

    def predict_patches(self, patches: List[np.ndarray]) -> Sequence[Detections]:
        found = [self.deployed(pixels) for pixels in patches]
        return [Detections(f.boxes.numpy(), f.scores.numpy(), f.labels.numpy()) for f in found]
