"""Rotated IoU for mmdet's assigners (MaxIoUAssigner's iou_calculator), via mmcv box_iou_rotated."""
from mmcv.ops import box_iou_rotated
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import get_box_tensor

from redet_plugin.utils.registration import register


@register(TASK_UTILS)
class RBboxOverlaps2D:
    """IoU (or IoF) between (N, 5) and (M, 5) rotated boxes (cx, cy, w, h, theta); a sixth
    column (a score) is ignored."""

    def __call__(self, bboxes1, bboxes2, mode: str = 'iou', is_aligned: bool = False):
        bboxes1, bboxes2 = get_box_tensor(bboxes1), get_box_tensor(bboxes2)
        for name, boxes in (('bboxes1', bboxes1), ('bboxes2', bboxes2)):
            if boxes.dim() != 2 or boxes.size(-1) not in (5, 6):
                raise ValueError(f'{name}: expected (N, 5) or (N, 6) rotated boxes, '
                                 f'got {tuple(boxes.shape)}')
        if mode not in ('iou', 'iof'):
            raise ValueError(f"mode: expected 'iou' or 'iof', got {mode!r}")
        bboxes1, bboxes2 = bboxes1[:, :5].float().contiguous(), bboxes2[:, :5].float().contiguous()
        if bboxes1.size(0) == 0 or bboxes2.size(0) == 0:
            shape = (bboxes1.size(0),) if is_aligned else (bboxes1.size(0), bboxes2.size(0))
            return bboxes1.new_zeros(shape)
        return box_iou_rotated(bboxes1, bboxes2, mode=mode, aligned=is_aligned)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}()'
