"""Maps detections on split patches back to their full images and merges them with class-wise
rotated NMS: the one merge of tools/test.py's submission (DOTAMetric merge_patches) and
tools/infer.py (redet_plugin.inference).

Patch ids are read with datasets.patch_naming.parse_patch_id (ids not in the devkit's form are
full images).
"""
from collections import OrderedDict
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..datasets.patch_naming import parse_patch_id

Detections = Tuple[str, np.ndarray, np.ndarray, np.ndarray]  # id, boxes (N, 5), scores (N,), labels (N,)


def patch_to_image(boxes, rate: float, left: float, top: float) -> np.ndarray:
    """Rotated boxes (N, 5) found on the patch at (left, top) of the image scaled by `rate`, in
    the full image's pixels (float32)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 5).copy()
    boxes[:, 0] += left
    boxes[:, 1] += top
    boxes[:, :4] /= rate
    return boxes


def classwise_rotated_nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                          iou_thr: float) -> np.ndarray:
    """Indices of the detections that rotated NMS at `iou_thr` keeps within each class, by
    descending score (ties in input order)."""
    keep = np.concatenate([np.zeros(0, dtype=np.int64)] + [
        _rotated_nms_keep(boxes, scores, np.flatnonzero(labels == label), iou_thr)
        for label in np.unique(labels)])
    return keep[np.argsort(-scores[keep], kind='stable')]


def merge_patch_detections(per_patch: Sequence[Detections], iou_thr: float = 0.1) -> List[Detections]:
    """Groups patch detections by full image, shifts them into its coordinates and runs
    class-wise rotated NMS (mmcv.ops.nms_rotated) at `iou_thr`. Images keep first-seen order;
    each image's detections come out by descending score."""
    grouped = OrderedDict()
    for img_id, boxes, scores, labels in per_patch:
        name, rate, left, top = parse_patch_id(img_id)
        entry = grouped.setdefault(name, ([], [], []))
        entry[0].append(patch_to_image(boxes, rate, left, top))
        entry[1].append(np.asarray(scores, dtype=np.float32).reshape(-1))
        entry[2].append(np.asarray(labels, dtype=np.int64).reshape(-1))
    merged = []
    for name, (boxes, scores, labels) in grouped.items():
        boxes, scores, labels = np.concatenate(boxes), np.concatenate(scores), np.concatenate(labels)
        keep = classwise_rotated_nms(boxes, scores, labels, iou_thr)
        merged.append((name, boxes[keep], scores[keep], labels[keep]))
    return merged


def _rotated_nms_keep(boxes: np.ndarray, scores: np.ndarray, members: np.ndarray,
                      iou_thr: float) -> np.ndarray:
    """Indices (into boxes) that rotated NMS keeps among `members`: one class at a time, since
    mmcv 2.1's CPU nms_rotated ignores its `labels` argument (it would suppress across classes)."""
    from mmcv.ops import nms_rotated
    _, keep = nms_rotated(torch.from_numpy(boxes[members]), torch.from_numpy(scores[members]),
                          iou_thr)
    return members[keep.numpy()]
