"""DOTA Task1 submission files: one `Task1_<class>.txt` per class, lines
`image_id score x1 y1 x2 y2 x3 y3 x4 y4` (the box's corners in the full image's pixels).
Written by DOTAMetric (outfile_prefix) and by tools/infer.py --dota-submission."""
import os
import os.path as osp
from typing import Sequence

import numpy as np
import torch

from ..structures import rbox2qbox


class Task1Writer:
    """Appends each image's detections to the class files as it comes (nothing is held);
    every class gets its file, empty when nothing of it was found. Use as a context manager."""

    def __init__(self, folder: str, classes: Sequence[str]) -> None:
        os.makedirs(folder, exist_ok=True)
        self.classes = list(classes)
        self.files = [open(osp.join(folder, f'Task1_{name}.txt'), 'w') for name in self.classes]

    def add(self, img_id: str, boxes, scores, labels) -> None:
        """boxes: (N, 5) rotated boxes (cx, cy, w, h, theta); scores (N,); labels (N,) class indices."""
        polygons = rbox2qbox(torch.as_tensor(np.asarray(boxes), dtype=torch.float32).reshape(-1, 5)).numpy()
        for polygon, score, label in zip(polygons, np.asarray(scores).reshape(-1), np.asarray(labels).reshape(-1)):
            coords = ' '.join(f'{v:.1f}' for v in polygon)
            self.files[int(label)].write(f'{img_id} {float(score):.4f} {coords}\n')

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self) -> 'Task1Writer':
        return self

    def __exit__(self, *exc) -> None:
        self.close()
