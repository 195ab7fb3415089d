"""Maps detections on split patches back to their full images and merges them with rotated NMS.

Patch ids are read with datasets.patch_naming.parse_patch_id (ids not in the devkit's form are
full images).
"""
from collections import OrderedDict
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..datasets.patch_naming import parse_patch_id

Detections = Tuple[str, np.ndarray, np.ndarray, np.ndarray]  # id, boxes (N, 5), scores (N,), labels (N,)


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
