"""Maps detections on split patches back to their full images and merges them with class-wise
rotated NMS: the one merge of tools/test.py's submission (DOTAMetric merge_patches) and
tools/infer.py (redet_plugin.inference).

Patch ids are read, and boxes mapped back, by the patch grid (structures/patch_grid.py:
parse_patch_id reads the devkit's and mmrotate's forms; other ids are full images).
"""
from collections import OrderedDict
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..ops import nms_keep_mask
from ..structures.patch_grid import parse_patch_id, patch_to_image

Detections = Tuple[str, np.ndarray, np.ndarray, np.ndarray]  # id, boxes (N, 5), scores (N,), labels (N,)


def classwise_rotated_nms(boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                          iou_thr: float) -> np.ndarray:
    """Indices of the detections that rotated NMS at `iou_thr` keeps within each class, by
    descending score (ties in input order). The NMS is nms_keep_mask, the detector heads' own:
    its labels keep the classes apart (mmcv's nms_rotated ignores them on CPU and CUDA)."""
    keep = nms_keep_mask(torch.from_numpy(np.ascontiguousarray(boxes, dtype=np.float32)),
                         torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32)),
                         iou_thr, torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64)))
    kept = np.flatnonzero(keep.numpy())
    return kept[np.argsort(-scores[kept], kind='stable')]


def merge_patch_detections(per_patch: Sequence[Detections], iou_thr: float = 0.1) -> List[Detections]:
    """Groups patch detections by full image, shifts them into its coordinates and runs
    class-wise rotated NMS (classwise_rotated_nms) at `iou_thr`. Images keep first-seen order;
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

