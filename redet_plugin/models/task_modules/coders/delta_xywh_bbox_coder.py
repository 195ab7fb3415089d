"""mmdet's DeltaXYWHBBoxCoder (horizontal boxes) without host synchronisations.

mmdet's bbox2delta and delta2bbox copy target_means/target_stds from the host on every call,
which waits for the GPU; here they are applied as Python numbers (delta_normalization). The
arithmetic is mmdet's, in the same order, so the results are equal bit for bit.
"""
import math
from typing import Optional, Sequence, Union

import torch
from mmdet.models.task_modules.coders import DeltaXYWHBBoxCoder as MMDetDeltaXYWHBBoxCoder
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import HorizontalBoxes, get_box_tensor
from torch import Tensor

from redet_plugin.utils.registration import register

from .delta_normalization import denormalize_deltas, normalize_deltas


@register(TASK_UTILS)
class DeltaXYWHBBoxCoder(MMDetDeltaXYWHBBoxCoder):
    """Drop-in for mmdet's DeltaXYWHBBoxCoder (same arguments and results); registered as
    'RedetDeltaXYWHBBoxCoder'. Decodes (N, 4 * k) deltas for (N, 4) boxes; batched (B, N, ...)
    inputs, max_shape per image and YOLOF's add_ctr_clamp go to mmdet's code."""

    def encode(self, bboxes, gt_bboxes) -> Tensor:
        bboxes, gt_bboxes = get_box_tensor(bboxes), get_box_tensor(gt_bboxes)
        if bboxes.shape != gt_bboxes.shape or bboxes.size(-1) != 4:
            raise ValueError(f'encode: expected bboxes and gt_bboxes of one shape (N, 4), got '
                             f'{tuple(bboxes.shape)} and {tuple(gt_bboxes.shape)}')
        proposals, gt = bboxes.float(), gt_bboxes.float()
        px = (proposals[..., 0] + proposals[..., 2]) * 0.5
        py = (proposals[..., 1] + proposals[..., 3]) * 0.5
        pw = proposals[..., 2] - proposals[..., 0]
        ph = proposals[..., 3] - proposals[..., 1]
        gx = (gt[..., 0] + gt[..., 2]) * 0.5
        gy = (gt[..., 1] + gt[..., 3]) * 0.5
        gw = gt[..., 2] - gt[..., 0]
        gh = gt[..., 3] - gt[..., 1]
        deltas = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw),
                              torch.log(gh / ph)], dim=-1)
        return normalize_deltas(deltas, self.means, self.stds)

    def decode(self, bboxes, pred_bboxes: Tensor,
               max_shape: Optional[Union[Sequence[int], Tensor]] = None,
               wh_ratio_clip: Optional[float] = 16 / 1000) -> Tensor:
        bboxes = get_box_tensor(bboxes)
        if pred_bboxes.dim() != 2 or self.add_ctr_clamp or isinstance(max_shape, Tensor) \
                or (max_shape is not None and isinstance(max_shape[0], (list, tuple))):
            return super().decode(bboxes, pred_bboxes, max_shape, wh_ratio_clip)
        if pred_bboxes.size(0) != bboxes.size(0):
            raise ValueError(f'decode: expected one row of deltas per box ({bboxes.size(0)}), '
                             f'got {pred_bboxes.size(0)}')
        num_bboxes, num_classes = pred_bboxes.size(0), pred_bboxes.size(1) // 4
        if num_bboxes == 0:
            return pred_bboxes
        deltas = denormalize_deltas(pred_bboxes.reshape(-1, 4), self.means, self.stds)
        dxy, dwh = deltas[:, :2], deltas[:, 2:]
        rois = bboxes.repeat(1, num_classes).reshape(-1, 4)
        pxy = (rois[:, :2] + rois[:, 2:]) * 0.5
        pwh = rois[:, 2:] - rois[:, :2]
        max_ratio = abs(math.log(wh_ratio_clip))
        gxy = pxy + pwh * dxy
        gwh = pwh * dwh.clamp(min=-max_ratio, max=max_ratio).exp()
        boxes = torch.cat([gxy - gwh * 0.5, gxy + gwh * 0.5], dim=-1)
        if self.clip_border and max_shape is not None:
            boxes[..., 0::2].clamp_(min=0, max=max_shape[1])
            boxes[..., 1::2].clamp_(min=0, max=max_shape[0])
        boxes = boxes.reshape(num_bboxes, -1)
        return HorizontalBoxes(boxes) if self.use_box_type else boxes
