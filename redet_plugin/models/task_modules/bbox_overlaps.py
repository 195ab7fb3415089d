"""mmdet's BboxOverlaps2D (horizontal IoU / IoF) without host synchronisations.

mmdet's bbox_overlaps clamps the union with `union.new_tensor([eps])`, a copy from host memory
that waits for the GPU; here the clamp takes eps as a number. Same formula and order, so the
overlaps equal mmdet's bit for bit. GIoU and the fp16 storage option go to mmdet's code.
"""
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
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    if not is_aligned:
        boxes1, boxes2 = boxes1[..., :, None, :], boxes2[..., None, :, :]
        area1, area2 = area1[..., None], area2[..., None, :]
    lt = boxes1[..., :2].maximum(boxes2[..., :2])
    rb = boxes1[..., 2:].minimum(boxes2[..., 2:])
    wh = (rb - lt).clamp(min=0)
    overlap = wh[..., 0] * wh[..., 1]
    union = area1 + area2 - overlap if mode == 'iou' else area1
    return overlap / union.clamp(min=_EPS)
