"""Shared2FC box head that regresses rotated boxes (le90) and runs rotated NMS at test time.

Training needs nothing new from mmdet's BBoxHead: targets, losses and `regress_by_class` only use
`bbox_coder.encode_size` (5 with our rotated coders). What changes is the test-time output: the
decoded boxes are (N, 5) rotated boxes (decoded with max_shape=img_shape, as mmdet's head does: the
rotated-prior coder then clamps centres into the image, as mmrotate's does), rescaled as such,
and suppressed class by class with `rcnn_test_cfg.nms` (`nms_rotated`) by multiclass_nms_fixed:
mmdet's multiclass_nms in fixed-size tensors, with no host synchronisation.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from mmdet.models.roi_heads.bbox_heads import Shared2FCBBoxHead
from mmdet.registry import MODELS
from mmdet.structures.bbox import get_box_tensor
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData
from torch import Tensor

from redet_plugin.utils.registration import register

from ...structures import rescale_rboxes
from ..layers import multiclass_nms_fixed


def empty_rotated_results(device, num_classes: int, with_nms: bool = True) -> InstanceData:
    results = InstanceData()
    results.bboxes = torch.zeros(0, 5, device=device)
    results.scores = torch.zeros((0,) if with_nms else (0, num_classes + 1), device=device)
    results.labels = torch.zeros(0, dtype=torch.long, device=device)
    return results


@register(MODELS)
class RotatedShared2FCBBoxHead(Shared2FCBBoxHead):
    """mmdet's Shared2FCBBoxHead with a rotated box coder and rotated test-time output."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault('predict_box_type', 'redet_rbox')
        super().__init__(*args, **kwargs)
        if self.bbox_coder.encode_size != 5:
            raise ValueError(f'bbox_coder: expected a rotated coder (encode_size 5), got '
                             f'{type(self.bbox_coder).__name__} with {self.bbox_coder.encode_size}')

    def _predict_by_feat_single(self, roi: Tensor, cls_score: Tensor, bbox_pred: Optional[Tensor],
                                img_meta: dict, rescale: bool = False,
                                rcnn_test_cfg: Optional[ConfigDict] = None) -> InstanceData:
        if roi.shape[0] == 0:
            return empty_rotated_results(roi.device, self.num_classes, rcnn_test_cfg is not None)
        scores = F.softmax(cls_score, dim=-1) if cls_score is not None else None
        num_rois = roi.size(0)
        num_boxes_per_roi = 1 if self.reg_class_agnostic else self.num_classes
        boxes = self.bbox_coder.decode(roi[:, 1:], bbox_pred.view(num_rois, -1),
                                       max_shape=img_meta['img_shape'])
        boxes = get_box_tensor(boxes).reshape(num_rois * num_boxes_per_roi, 5)
        if rescale and boxes.size(0) > 0:
            scale_x, scale_y = img_meta['scale_factor'][:2]
            boxes = rescale_rboxes(boxes, 1 / scale_x, 1 / scale_y)
        boxes = boxes.view(num_rois, -1)
        results = InstanceData()
        if rcnn_test_cfg is None:  # raw per-class output, e.g. for test-time augmentation
            results.bboxes, results.scores = boxes, scores
            return results
        dets = multiclass_nms_fixed(boxes, scores, rcnn_test_cfg.score_thr, rcnn_test_cfg.nms,
                                    rcnn_test_cfg.max_per_img, box_dim=5)
        # The one data-dependent shape of the test path, and so where a captured test step ends:
        # the valid rows (all before the padding, highest score first) become the results.
        # The valid rows come first, so their count alone (one read-back) cuts all three.
        count = int(dets.valid.sum())
        results.bboxes, results.scores, results.labels = (
            dets.bboxes[:count], dets.scores[:count], dets.labels[:count])
        return results
