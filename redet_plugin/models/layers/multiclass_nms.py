"""mmdet's multiclass_nms with fixed-size tensors: no host synchronisation, no data-dependent
shape.

mmdet's version boolean-indexes the (RoI, class) pairs above score_thr and calls mmcv's NMS,
which returns a data-dependent number of indices: each step reads a size back from the GPU.
Here every tensor has a size known from the input shapes alone:
1. all (RoI, class) pairs are candidates, in mmdet's order (RoI-major); those at or below
   score_thr get a label of their own for the NMS, so they suppress nothing and the NMS
   computes no IoU with them (with trained weights most pairs are below score_thr: the IoUs
   of a class are then those of its few candidates, not of all RoIs);
2. nms_keep_mask suppresses class by class (the labels; mmdet offsets each class's boxes apart
   instead, which is the same up to float rounding of the shifted coordinates);
3. the kept candidates above score_thr, highest score first (a stable sort: equal scores keep
   the candidates' order), fill the max_num output rows; the rest are padding, marked by
   `valid` = False and placed after every valid row.
The detections are mmdet's: the same boxes, scores and labels in the same order, except among
equal scores. Greedy NMS decides a box from the boxes above it only, so taking all pairs as
candidates is exact; the rcnn test_cfg's `nms_pre`, which mmdet's multiclass_nms ignores, is
ignored here too (applying it would drop detections mmdet keeps).
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from redet_plugin.ops import nms_keep_mask

# the NMS types mmdet's batched_nms resolves by name, by box size
_NMS_TYPES = {5: 'nms_rotated', 4: 'nms'}
_NMS_KEYS = {'type', 'iou_threshold', 'class_agnostic', 'split_thr', 'clockwise', 'offset'}


class FixedSizeDetections(NamedTuple):
    """max_num rows (all candidates when max_num <= 0), highest score first; rows where valid is
    False are padding, after every valid row, and hold no detection."""
    bboxes: Tensor  # (M, box_dim)
    scores: Tensor  # (M,)
    labels: Tensor  # (M,) int64
    valid: Tensor   # (M,) bool


def nms_arguments(nms_cfg: Optional[dict], box_dim: int, where: str = 'nms_cfg'):
    """(iou_threshold, class_agnostic, clockwise) from mmdet's nms config; None: no NMS."""
    if nms_cfg is None:
        return None
    unknown = set(nms_cfg) - _NMS_KEYS
    if unknown:
        raise ValueError(f'{where}: keys {sorted(unknown)} are not supported '
                         f'(known: {sorted(_NMS_KEYS)})')
    nms_type = nms_cfg.get('type', 'nms')
    if nms_type != _NMS_TYPES[box_dim]:
        raise ValueError(f"{where}: type must be '{_NMS_TYPES[box_dim]}' for boxes of "
                         f'{box_dim} values, got {nms_type!r}')
    if nms_cfg.get('offset', 0) != 0:
        raise ValueError(f'{where}: only offset 0 (box width x2 - x1) is supported, '
                         f"got offset={nms_cfg['offset']}")
    if 'iou_threshold' not in nms_cfg:
        raise ValueError(f'{where}: needs iou_threshold')
    return (float(nms_cfg['iou_threshold']), bool(nms_cfg.get('class_agnostic', False)),
            bool(nms_cfg.get('clockwise', True)))


def kept_first(scores: Tensor, kept: Tensor, max_num: int):
    """(order, valid) along the last dimension: the indices of the kept entries, highest score
    first (stable: equal scores keep their order), then the others; at most max_num of them
    (all when max_num <= 0). valid = kept[order]."""
    ranked = scores.masked_fill(~kept, float('-inf'))
    order = ranked.sort(dim=-1, descending=True, stable=True).indices
    if max_num > 0:
        order = order[..., :max_num]
    return order, kept.gather(-1, order)


def multiclass_nms_fixed(multi_bboxes: Tensor, multi_scores: Tensor, score_thr: float,
                         nms_cfg: Optional[dict], max_num: int = -1,
                         box_dim: int = 4) -> FixedSizeDetections:
    """mmdet.models.layers.multiclass_nms (without score_factors and return_inds) in fixed-size
    tensors; see the module docstring.

    multi_bboxes: (n, num_classes * box_dim) per-class boxes or (n, box_dim) shared by all
    classes; multi_scores: (n, num_classes + 1), the last column the background (ignored).
    """
    if box_dim not in _NMS_TYPES:
        raise ValueError(f'multiclass_nms_fixed: box_dim must be 5 or 4, got {box_dim}')
    nms_args = nms_arguments(nms_cfg, box_dim, 'multiclass_nms_fixed: nms_cfg')
    num_rois, num_classes = multi_scores.size(0), multi_scores.size(1) - 1
    if multi_bboxes.shape[1] > box_dim:
        bboxes = multi_bboxes.view(num_rois, num_classes, box_dim)  # -1 fails for 0 RoIs
    else:
        bboxes = multi_bboxes[:, None].expand(num_rois, num_classes, box_dim)
    bboxes = bboxes.reshape(-1, box_dim)
    scores = multi_scores[:, :-1].reshape(-1)
    # the NMS takes one dtype (under autocast boxes and scores may differ): the wider
    dtype = torch.promote_types(bboxes.dtype, scores.dtype)
    bboxes, scores = bboxes.to(dtype), scores.to(dtype)
    labels = torch.arange(num_classes, device=scores.device).repeat(num_rois)

    candidate = scores > score_thr
    if nms_args is None:  # mmdet's batched_nms with nms_cfg None: sort only
        kept = candidate
    else:
        iou_threshold, class_agnostic, clockwise = nms_args
        boxes_for_nms = bboxes
        if not clockwise:  # mmcv's nms_rotated flips the angle for counter-clockwise boxes
            boxes_for_nms = torch.cat([bboxes[:, :4], -bboxes[:, 4:]], dim=1)
        # the pairs that are not candidates: one label each, past the classes' labels
        alone = torch.arange(num_classes, num_classes + labels.numel(), device=labels.device)
        nms_labels = torch.where(candidate, labels.new_zeros(()) if class_agnostic else labels,
                                 alone)
        keep = nms_keep_mask(boxes_for_nms, scores, iou_threshold, nms_labels)
        kept = keep & candidate

    order, valid = kept_first(scores, kept, max_num)
    num_out = max_num if max_num > 0 else order.numel()
    pad = num_out - order.numel()  # fewer candidates than max_num: padding rows
    if pad > 0:
        order = torch.cat([order, order.new_zeros(pad)])
        valid = torch.cat([valid, valid.new_zeros(pad)])
    if bboxes.shape[0] == 0:  # no candidates at all: the padding rows have nothing to gather
        return FixedSizeDetections(bboxes.new_zeros(num_out, box_dim), scores.new_zeros(num_out),
                                   labels.new_zeros(num_out), valid)
    return FixedSizeDetections(bboxes[order], scores[order], labels[order], valid)
