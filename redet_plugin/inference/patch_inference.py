"""Detection on an image of any size: patches (the patch grid, structures/patch_grid.py) in
batches through a detector, the detections mapped back to the image and merged
(evaluation.patch_merge, the merge of DOTA's split patches)."""
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..evaluation.patch_merge import classwise_rotated_nms
from ..structures.patch_grid import patch_to_image, plan_patches
from .image_source import ImageSource
from .patches import iter_patch_batches

# patches (uint8 (P, P, 3) BGR) -> per patch (boxes (N, 5) in patch pixels, scores (N,), labels (N,));
# a batch's results are used only after the next batch has been asked for, so a predictor may
# return a sequence that reads them from its device when first used
PredictBatch = Callable[[List[np.ndarray]], Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]]]


class Detections(NamedTuple):
    """Rotated boxes (N, 5) (cx, cy, w, h, theta radians, le90) in the image's pixels, by
    descending score; scores (N,); labels (N,) class indices."""
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


def check_patch_args(patch_size: int, overlap: int, scales: Sequence[float], batch_size: int,
                     score_thr: float, merge_iou_thr: float) -> None:
    """One-line errors naming the argument."""
    if int(patch_size) != patch_size or patch_size < 1:
        raise ValueError(f'patch_size must be a positive integer, got {patch_size}')
    if int(overlap) != overlap or not 0 <= overlap < patch_size:
        raise ValueError(f'patch_overlap must be an integer in [0, patch_size={patch_size}), got {overlap}')
    if not len(scales) or any(not (s > 0 and np.isfinite(s)) for s in scales):
        raise ValueError(f'scales must be positive numbers, got {list(scales)}')
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f'batch_size must be a positive integer, got {batch_size}')
    if not 0 <= score_thr <= 1:
        raise ValueError(f'score_thr must be in [0, 1], got {score_thr}')
    if not 0 < merge_iou_thr <= 1:
        raise ValueError(f'merge_iou_thr must be in (0, 1], got {merge_iou_thr}')


def detect_by_patches(source: ImageSource, predict_batch: PredictBatch, patch_size: int = 1024,
                      overlap: int = 200, scales: Sequence[float] = (1.0,), batch_size: int = 1,
                      score_thr: float = 0.05, merge_iou_thr: float = 0.1,
                      progress: Optional[Callable[[int, int], None]] = None) -> Detections:
    """Cuts `source` at each scale into patch_size patches overlapping by `overlap`
    (plan_patches: the splitter's grid), runs them through `predict_batch` `batch_size` at
    a time (each batch's results used after the next batch is asked for), keeps detections
    scoring at least `score_thr`, maps them to the image and, when there was more than one
    patch, merges them by class-wise rotated NMS at `merge_iou_thr` (a single patch, an image
    no larger than one patch at one scale, keeps the detector's output as it is).
    `progress(done, total)` is called after each batch."""
    check_patch_args(patch_size, overlap, scales, batch_size, score_thr, merge_iou_thr)
    patches = plan_patches(source.height, source.width, patch_size, overlap, scales)
    boxes, scores, labels, done = [], [], [], 0

    def keep_batch(chunk, results):
        nonlocal done
        for patch, (b, s, lab) in zip(chunk, results):
            s = np.asarray(s, dtype=np.float32).reshape(-1)
            keep = s >= score_thr
            boxes.append(patch_to_image(np.asarray(b, dtype=np.float32).reshape(-1, 5)[keep],
                                        patch.scale, patch.left, patch.top))
            scores.append(s[keep])
            labels.append(np.asarray(lab, dtype=np.int64).reshape(-1)[keep])
        done += len(chunk)
        if progress is not None:
            progress(done, len(patches))

    # one batch behind: the device runs a batch while the host reads and maps the one before
    pending = None
    for chunk, pixels in iter_patch_batches(source, patches, patch_size, batch_size):
        launched = (chunk, predict_batch(pixels))
        if pending is not None:
            keep_batch(*pending)
        pending = launched
    if pending is not None:
        keep_batch(*pending)
    boxes, scores, labels = (np.concatenate(boxes).reshape(-1, 5), np.concatenate(scores),
                             np.concatenate(labels))
    if len(patches) > 1:
        keep = classwise_rotated_nms(boxes, scores, labels, merge_iou_thr)
    else:
        keep = np.argsort(-scores, kind='stable')
    return Detections(boxes[keep], scores[keep], labels[keep])
