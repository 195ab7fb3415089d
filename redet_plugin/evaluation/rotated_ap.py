"""VOC-style average precision for rotated boxes (the DOTA Task1 protocol).

Matching per image and class, detections in descending score order: a detection whose best
rotated IoU (mmcv box_iou_rotated) with a ground truth is >= iou_thr is a true positive if that
ground truth is not yet matched, a false positive if it is, and neither if the ground truth is
ignored (difficult); below iou_thr it is a false positive. Ignored ground truths do not count
in the recall.
"""
from typing import Dict, List, Sequence

import numpy as np
import torch
from mmdet.evaluation.functional import average_precision as mmdet_average_precision


def rotated_iou(boxes1: np.ndarray, boxes2: np.ndarray) -> np.ndarray:
    """(N, 5) x (M, 5) rotated boxes -> (N, M) IoU, via mmcv.ops.box_iou_rotated (le90, clockwise).

    Two boxes whose circumscribed circles lie apart cannot overlap: their IoU is 0 without
    mmcv's polygon clipping, which costs the same for every pair. Between a model's detections
    and an image's ground truths most pairs are such, so only the others go to mmcv (as aligned
    pairs, through the same per-pair code as its dense matrix)."""
    from mmcv.ops import box_iou_rotated
    b1 = np.asarray(boxes1, dtype=np.float32).reshape(-1, 5)
    b2 = np.asarray(boxes2, dtype=np.float32).reshape(-1, 5)
    ious = np.zeros((len(b1), len(b2)), dtype=np.float32)
    if len(b1) == 0 or len(b2) == 0:
        return ious
    radius1 = np.hypot(b1[:, 2], b1[:, 3], dtype=np.float64) / 2
    radius2 = np.hypot(b2[:, 2], b2[:, 3], dtype=np.float64) / 2
    distance = np.hypot(b1[:, None, 0].astype(np.float64) - b2[None, :, 0],
                        b1[:, None, 1].astype(np.float64) - b2[None, :, 1])
    reach = radius1[:, None] + radius2[None, :]
    # A margin for float32 rounding in mmcv; NaN or infinite boxes are left to mmcv.
    rows, cols = np.nonzero(~(distance > reach * (1 + 1e-3) + 1e-3))
    if rows.size:
        ious[rows, cols] = box_iou_rotated(torch.from_numpy(b1[rows]), torch.from_numpy(b2[cols]),
                                           aligned=True).numpy()
    return ious


def match_detections(det_boxes: np.ndarray, det_scores: np.ndarray, gt_boxes: np.ndarray,
                     gt_ignore: np.ndarray, iou_thr: float):
    """One image, one class. Returns (tp, fp) float arrays in the order of `det_scores` (descending
    order is applied inside and undone on return)."""
    num_dets = len(det_boxes)
    tp, fp = np.zeros(num_dets, np.float32), np.zeros(num_dets, np.float32)
    if num_dets == 0:
        return tp, fp
    if len(gt_boxes) == 0:
        fp[:] = 1
        return tp, fp
    ious = rotated_iou(det_boxes, gt_boxes)
    matched = np.zeros(len(gt_boxes), dtype=bool)
    for i in np.argsort(-det_scores, kind='stable'):
        best = int(np.argmax(ious[i]))
        if ious[i, best] >= iou_thr:
            if gt_ignore[best]:
                continue
            if not matched[best]:
                matched[best] = True
                tp[i] = 1
            else:
                fp[i] = 1
        else:
            fp[i] = 1
    return tp, fp


def average_precision(recalls: np.ndarray, precisions: np.ndarray, mode: str = '11points') -> float:
    """mmdet's average_precision: VOC07 11-point interpolated AP ('11points', at the devkits'
    thresholds) or the area under the envelope of the PR curve ('area').

    Kept beside it for what it lacks: DOTA's '11points' as the default, a Python float and an
    error that names the bad mode. (mmdet's value is a float32 scalar, which json cannot write:
    the AP rounded to float32, as mmdet's and mmrotate's metrics report it.)"""
    if mode not in ('11points', 'area'):
        raise ValueError(f"average_precision: mode must be '11points' or 'area', got {mode!r}")
    return float(mmdet_average_precision(recalls, precisions, mode))


def eval_rotated_map(detections: Sequence[List[np.ndarray]], annotations: Sequence[Dict],
                     num_classes: int, iou_thr: float = 0.5, mode: str = '11points') -> List[Dict]:
    """Per-class AP over a data set.

    detections[img][cls]: (K, 6) array (cx, cy, w, h, theta, score).
    annotations[img]: dict(bboxes=(N, 5), labels=(N,), bboxes_ignore=(M, 5), labels_ignore=(M,)).
    Returns one dict per class: num_gts, num_dets, recall (final), ap.
    """
    if len(detections) != len(annotations):
        raise ValueError(f'eval_rotated_map: {len(detections)} detection lists for '
                         f'{len(annotations)} annotated images')
    results = []
    for cls in range(num_classes):
        scores, tps, fps, num_gts = [], [], [], 0
        for dets_per_class, ann in zip(detections, annotations):
            dets = np.asarray(dets_per_class[cls], dtype=np.float32).reshape(-1, 6)
            keep = ann['labels'] == cls
            keep_ignore = ann['labels_ignore'] == cls
            gt_boxes = np.concatenate([ann['bboxes'][keep].reshape(-1, 5),
                                       ann['bboxes_ignore'][keep_ignore].reshape(-1, 5)])
            gt_ignore = np.concatenate([np.zeros(keep.sum(), bool), np.ones(keep_ignore.sum(), bool)])
            num_gts += int(keep.sum())
            tp, fp = match_detections(dets[:, :5], dets[:, 5], gt_boxes, gt_ignore, iou_thr)
            scores.append(dets[:, 5])
            tps.append(tp)
            fps.append(fp)
        scores, tp, fp = np.concatenate(scores), np.concatenate(tps), np.concatenate(fps)
        order = np.argsort(-scores, kind='stable')
        tp, fp = np.cumsum(tp[order], dtype=np.float64), np.cumsum(fp[order], dtype=np.float64)
        recalls = tp / max(num_gts, 1)
        precisions = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
        ap = average_precision(recalls, precisions, mode) if num_gts > 0 else 0.0
        results.append(dict(num_gts=num_gts, num_dets=len(scores),
                            recall=float(recalls[-1]) if recalls.size else 0.0, ap=ap))
    return results
