"""Shared2FC box head that regresses rotated boxes (le90) and runs rotated NMS at test time.

Training needs nothing new from mmdet's BBoxHead: targets, losses and `regress_by_class` only use
`bbox_coder.encode_size` (5 with our rotated coders). What changes is the test-time output: the
decoded boxes are (N, 5) rotated boxes (decoded with max_shape=img_shape, as mmdet's head does: the
rotated-prior coder then clamps centres into the image, as mmrotate's does), rescaled as such,
and suppressed class by class with `rcnn_test_cfg.nms` (`nms_rotated`) by multiclass_nms_fixed:
mmdet's multiclass_nms in fixed-size tensors, with no host synchronisation.
"""
from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from mmdet.models.roi_heads.bbox_heads import Shared2FCBBoxHead
from mmdet.registry import MODELS
from mmdet.structures.bbox import get_box_tensor
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData
from torch import Tensor

from redet_plugin.structures import rescale_rboxes
from redet_plugin.utils.registration import register

from ...layers import multiclass_nms_fixed
from ...task_modules.samplers import FixedSample


class FixedSizeTargets(NamedTuple):
    """Per row of a batch of FixedSamples: mmdet's get_targets, plus which rows were drawn."""
    labels: Tensor         # (R,) gt label of a positive, num_classes elsewhere
    label_weights: Tensor  # (R,) 1 (or pos_weight) for a positive, 1 for a negative, else 0
    bbox_targets: Tensor   # (R, 5) encoded gt of a positive, 0 elsewhere
    bbox_weights: Tensor   # (R, 5) 1 for a positive, else 0
    drawn: Tensor          # (R,) bool, a positive or a negative (not padding)


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
        # mmdet's default SmoothL1Loss asks the GPU whether any weight is positive first
        kwargs.setdefault('loss_bbox', dict(type='RedetSmoothL1Loss', beta=1.0, loss_weight=1.0))
        super().__init__(*args, **kwargs)
        if self.bbox_coder.encode_size != 5:
            raise ValueError(f'bbox_coder: expected a rotated coder (encode_size 5), got '
                             f'{type(self.bbox_coder).__name__} with {self.bbox_coder.encode_size}')

    def fixed_size_targets(self, samples: List[FixedSample], gt_boxes: List[Tensor],
                           gt_labels: List[Tensor], rcnn_train_cfg) -> FixedSizeTargets:
        """mmdet's get_targets (concatenated over images) for fixed-size samples; positives
        regress towards gt_boxes[i][gt_index] (rotated gts)."""
        if self.reg_decoded_bbox:
            raise ValueError('reg_decoded_bbox: not supported by the fixed-size R-CNN targets')
        pos_weight = rcnn_train_cfg['pos_weight']
        parts = []
        for sample, boxes, labels in zip(samples, gt_boxes, gt_labels):
            pos = sample.pos
            if boxes.shape[0] > 0:
                encoded = self.bbox_coder.encode(sample.priors, boxes[sample.gt_index])
                targets = torch.where(pos[:, None], encoded, 0.0)  # keeps unmatched NaN out
                row_labels = torch.where(pos, labels[sample.gt_index], self.num_classes)
            else:
                targets = sample.priors.new_zeros(pos.shape[0], self.bbox_coder.encode_size)
                row_labels = torch.full_like(sample.gt_index, self.num_classes)
            weights = torch.where(pos, pos_weight if pos_weight > 0 else 1.0, sample.neg.float())
            parts.append((row_labels, weights, targets, pos.float()[:, None].expand_as(targets),
                          pos | sample.neg))
        return FixedSizeTargets(*(torch.cat(part) for part in zip(*parts)))

    def fixed_size_loss(self, cls_score: Tensor, bbox_pred: Tensor,
                        targets: FixedSizeTargets) -> dict:
        """mmdet's BBoxHead.loss on fixed-size targets (padding rows weigh nothing), with its
        averages counted on the GPU: loss_cls over max(#weighted rows, 1), acc over the drawn
        rows, loss_bbox over the drawn rows."""
        labels, label_weights, bbox_targets, bbox_weights, drawn = targets
        losses = {}
        avg_factor = (label_weights > 0).sum().clamp(min=1).float()
        loss_cls = self.loss_cls(cls_score, labels, label_weights, avg_factor=avg_factor)
        if isinstance(loss_cls, dict):
            losses.update(loss_cls)
        else:
            losses['loss_cls'] = loss_cls
        correct = (cls_score.argmax(dim=1) == labels) & drawn
        losses['acc'] = correct.sum(0, keepdim=True) * 100.0 / drawn.sum().clamp(min=1)
        num_rows = bbox_pred.size(0)
        if self.reg_class_agnostic:
            pred = bbox_pred.view(num_rows, -1)
        else:
            index = labels.clamp(max=self.num_classes - 1)[:, None, None].expand(-1, 1, 5)
            pred = bbox_pred.view(num_rows, self.num_classes, -1).gather(1, index)[:, 0]
        losses['loss_bbox'] = self.loss_bbox(pred, bbox_targets, bbox_weights,
                                             avg_factor=drawn.sum())
        return losses

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
        # valid rows first, then padding: RoITransformerRoIHead.predict_bbox cuts the batch
        # with one read-back (structures/padded_results.py)
        results.bboxes, results.scores, results.labels, results.valid = dets
        return results
