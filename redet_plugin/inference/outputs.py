"""What tools/infer.py writes per image: DOTA-format predictions and a picture of them."""
from typing import Optional, Sequence

import cv2
import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from ..visualization import RotatedDetLocalVisualizer
from .detector import DetectionResult
from .image_source import ImageSource

_BAND_ROWS = 256  # picture rows made from one source read


def write_dota_predictions(path: str, result: DetectionResult) -> None:
    """One line `x1 y1 x2 y2 x3 y3 x4 y4 <class> <score>` per detection (DOTA's annotation
    format with the score in place of the difficulty), in the image's pixels."""
    with open(path, 'w') as f:
        for polygon, name, score in zip(result.polygons(), result.class_names(), result.scores):
            f.write(' '.join(f'{v:.2f}' for v in polygon) + f' {name} {float(score):.4f}\n')


def downscaled(source: ImageSource, max_side: int) -> np.ndarray:
    """The image as uint8 BGR, resized (area interpolation) so its longer side is at most
    `max_side`; made a band of rows at a time, so a memory-mapped image is never read whole."""
    factor = min(1.0, max_side / max(source.height, source.width))
    if factor == 1.0:
        return source.read(0, 0, source.height, source.width)
    out_w, out_h = max(int(round(source.width * factor)), 1), max(int(round(source.height * factor)), 1)
    bands = []
    for y in range(0, out_h, _BAND_ROWS):
        rows = min(_BAND_ROWS, out_h - y)
        top, bottom = int(round(y / factor)), min(int(round((y + rows) / factor)), source.height)
        region = source.read(top, 0, max(bottom - top, 1), source.width)
        bands.append(cv2.resize(region, (out_w, rows), interpolation=cv2.INTER_AREA))
    return np.concatenate(bands)


def render_detections(source: ImageSource, result: DetectionResult, max_side: int = 2048,
                      score_thr: float = 0.3, palette: Optional[Sequence] = None) -> np.ndarray:
    """The (downscaled) image, BGR, with the detections scoring at least `score_thr` drawn by
    the visualizer of tools/test.py --show-dir (RotatedDetLocalVisualizer; `palette` in RGB, as
    data sets give it)."""
    picture = downscaled(source, max_side)
    factor = picture.shape[1] / source.width
    keep = result.scores >= score_thr
    boxes = result.boxes[keep].copy()
    boxes[:, :4] *= factor
    sample = DetDataSample()
    sample.pred_instances = InstanceData(bboxes=torch.from_numpy(boxes),
                                         scores=torch.from_numpy(result.scores[keep]),
                                         labels=torch.from_numpy(result.labels[keep]))
    visualizer = RotatedDetLocalVisualizer(name='render_detections')
    visualizer.dataset_meta = dict(classes=result.classes, palette=palette)
    # the visualizer draws the scores above its threshold; those at score_thr are kept above
    visualizer.add_datasample(result.name, np.ascontiguousarray(picture[..., ::-1]), sample,
                              draw_gt=False, pred_score_thr=float('-inf'))
    return np.ascontiguousarray(visualizer.get_image()[..., ::-1])
