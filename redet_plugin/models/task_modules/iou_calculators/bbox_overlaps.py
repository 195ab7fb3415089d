"""mmdet's BboxOverlaps2D (horizontal IoU / IoF) without host synchronisations.

mmdet's bbox_overlaps clamps the union with `union.new_tensor([eps])`, a copy from host memory
that waits for the GPU; here the clamp takes eps as a number. Same formula and order, so the
overlaps equal mmdet's bit for bit. GIoU and the fp16 storage option go to mmdet's code.
"""
import torch
from mmdet.models.task_modules.assigners import BboxOverlaps2D as MMDetBboxOverlaps2D
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import get_box_tensor
from torch import Tensor

from redet_plugin.utils.registration import register

_EPS = 1e-6  # mmdet's bbox_overlaps default


@register(TASK_UTILS)
class BboxOverlaps2D(MMDetBboxOverlaps2D):
    """Drop-in for mmdet's BboxOverlaps2D; registered as 'RedetBboxOverlaps2D'."""

    def __call__(self, bboxes1, bboxes2, mode: str = 'iou', is_aligned: bool = False) -> Tensor:
        if mode not in ('iou', 'iof') or self.dtype == 'fp16':
            return super().__call__(bboxes1, bboxes2, mode, is_aligned)
        boxes1, boxes2 = get_box_tensor(bboxes1)[..., :4], get_box_tensor(bboxes2)[..., :4]
        return hbox_overlaps(boxes1, boxes2, mode, is_aligned)


def hbox_overlaps(boxes1: Tensor, boxes2: Tensor, mode: str, is_aligned: bool) -> Tensor:
    """IoU ('iou') or intersection over boxes1's area ('iof') of (..., m, 4) and (..., n, 4)
    (x1, y1, x2, y2) boxes: (..., m, n), or (..., m) when is_aligned."""
    rows, cols = boxes1.size(-2), boxes2.size(-2)
    if is_aligned and rows != cols:
        raise ValueError(f'is_aligned: expected as many boxes in bboxes1 as in bboxes2, '
                         f'got {rows} and {cols}')
    batch_shape = boxes1.shape[:-2]
    if rows * cols == 0:
        return boxes1.new_empty(batch_shape + ((rows, ) if is_aligned else (rows, cols)))
    x1, y1, x2, y2 = boxes1.unbind(-1)
    u1, v1, u2, v2 = boxes2.unbind(-1)
    if not is_aligned:
        x1, y1, x2, y2 = (c[..., :, None] for c in (x1, y1, x2, y2))
        u1, v1, u2, v2 = (c[..., None, :] for c in (u1, v1, u2, v2))
    area1 = (x2 - x1) * (y2 - y1)
    # An assigner's (gts, anchors) matrix is the largest tensor of a training step: at most three
    # of its size are alive at once here (mmdet's formula, element for element, takes ten)
    width = torch.minimum(x2, u2).sub_(torch.maximum(x1, u1)).clamp_(min=0)
    height = torch.minimum(y2, v2).sub_(torch.maximum(y1, v1)).clamp_(min=0)
    overlap = width.mul_(height)
    del height
    if mode == 'iou':
        union = (area1 + (u2 - u1) * (v2 - v1)).sub_(overlap)
    else:
        union = area1
    return overlap.div_(union.clamp(min=_EPS))
