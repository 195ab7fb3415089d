"""Maps detections on split patches back to their full images and merges them with rotated NMS.

Patch ids follow DOTA's devkit: `<image>__<rate>__<left>___<top>`, where (left, top) is the
patch's corner in the image scaled by `rate`. Ids not in this form are full images.
"""
import re
from collections import OrderedDict
from typing import List, Sequence, Tuple

import numpy as np
import torch

PATCH_ID = re.compile(r'^(?P<name>.+)__(?P<rate>[0-9.]+)__(?P<left>-?\d+)___(?P<top>-?\d+)$')

Detections = Tuple[str, np.ndarray, np.ndarray, np.ndarray]  # id, boxes (N, 5), scores (N,), labels (N,)


def patch_id(name: str, rate: float, left: int, top: int) -> str:
    """The devkit's patch id (rate written as the devkit does: `1` for 1.0, `0.5` for 0.5)."""
    return f'{name}__{rate:g}__{left}___{top}'


def parse_patch_id(img_id: str) -> Tuple[str, float, int, int]:
    """`P0001__1__824___0` -> ('P0001', 1.0, 824, 0); a plain id -> (id, 1.0, 0, 0)."""
    match = PATCH_ID.match(img_id)
    if match is None:
        return img_id, 1.0, 0, 0
    return match['name'], float(match['rate']), int(match['left']), int(match['top'])


def merge_patch_detections(per_patch: Sequence[Detections], iou_thr: float = 0.1) -> List[Detections]:
    """Groups patch detections by full image, shifts them into its coordinates and runs
    class-wise rotated NMS (mmcv.ops.nms_rotated) at `iou_thr`. Images keep first-seen order."""
    from mmcv.ops import nms_rotated
    grouped = OrderedDict()
    for img_id, boxes, scores, labels in per_patch:
        name, rate, left, top = parse_patch_id(img_id)
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 5).copy()
        boxes[:, 0] += left
        boxes[:, 1] += top
        boxes[:, :4] /= rate
        entry = grouped.setdefault(name, ([], [], []))
        entry[0].append(boxes)
        entry[1].append(np.asarray(scores, dtype=np.float32).reshape(-1))
        entry[2].append(np.asarray(labels, dtype=np.int64).reshape(-1))
    merged = []
    for name, (boxes, scores, labels) in grouped.items():
        boxes, scores, labels = np.concatenate(boxes), np.concatenate(scores), np.concatenate(labels)
        if len(boxes):
            _, keep = nms_rotated(torch.from_numpy(boxes), torch.from_numpy(scores), iou_thr,
                                  labels=torch.from_numpy(labels))
            keep = keep.numpy()
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        merged.append((name, boxes, scores, labels))
    return merged
