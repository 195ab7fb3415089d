"""The RoI Transformer: a two-stage cascade from horizontal proposals to rotated detections.

Stage 0 pools horizontal proposals (RoIPool or RoIAlign) and regresses rotated boxes; stage 1
pools those rotated RoIs (RiRoIAlignRotated) and predicts class + refined rotated box.
mmdet's CascadeRoIHead does the rest; what changes is how ground truth meets the priors:
- stage 0 matches horizontal priors against the enclosing horizontal boxes of the rotated gts
  (and adds those as proposals), but regresses towards the rotated gts themselves;
- later stages match rotated priors against rotated gts (rotated IoU, set in the assigner).
Boxes are plain tensors throughout (rotated: (cx, cy, w, h, theta), le90).

Proposals may come as fixed-size sets (RedetRPNHead) with `valid` marking the real ones: in
training the assigner ignores the others, at test their class scores become background, so they
never reach the detections.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.models.utils import unpack_gt_instances
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox2roi, get_box_tensor
from mmengine.structures import InstanceData
from torch import Tensor

from redet_plugin.structures.padded_results import cut_unless_kept
from redet_plugin.utils.registration import register

from ...structures import rbox2hbox
from ..task_modules.samplers import FixedSample, check_random_sampler, sample_fixed
from .bbox_heads.rotated_bbox_head import empty_rotated_results


def _with_boxes(instances: InstanceData, boxes: Tensor) -> InstanceData:
    view = instances.new()  # a shallow copy: same labels and other fields
    view.bboxes = boxes
    return view


@register(MODELS)
class RoITransformerRoIHead(CascadeRoIHead):
    """CascadeRoIHead whose first stage turns horizontal RoIs into rotated ones."""

    def init_assigner_sampler(self) -> None:
        super().init_assigner_sampler()
        for stage, sampler in enumerate(self.bbox_sampler):
            check_random_sampler(sampler, f'train_cfg.rcnn[{stage}].sampler')

    def _matching_gts(self, priors: Tensor, gt: InstanceData, gt_ignore: Optional[InstanceData]):
        """The gts (and ignored gts) that priors are matched against: horizontal priors meet
        the gts' enclosing horizontal boxes, rotated priors the rotated gts."""
        if priors.size(-1) != 4:
            return gt, gt_ignore
        if gt_ignore is not None and 'bboxes' in gt_ignore:
            ignored = get_box_tensor(gt_ignore.bboxes)
            if ignored.size(-1) == 5:
                gt_ignore = _with_boxes(gt_ignore, rbox2hbox(ignored))
        return _with_boxes(gt, rbox2hbox(gt.bboxes)), gt_ignore

    def loss(self, x: Tuple[Tensor], rpn_results_list: List[InstanceData],
             batch_data_samples: SampleList) -> dict:
        """mmdet's CascadeRoIHead.loss in fixed-size tensors (sample_fixed): each image
        gives each stage min(num, #candidates) rows; the losses are mmdet's for the same draw."""
        if len(rpn_results_list) != len(batch_data_samples):
            raise ValueError(f'rpn_results_list: expected one entry per image '
                             f'({len(batch_data_samples)}), got {len(rpn_results_list)}')
        batch_gt, batch_gt_ignore, batch_img_metas = unpack_gt_instances(batch_data_samples)
        batch_gt = [_with_boxes(gt, _rotated_tensor(gt.bboxes)) for gt in batch_gt]
        priors = [(get_box_tensor(res.bboxes), res.get('valid', None)) for res in rpn_results_list]
        losses = {}
        for stage in range(self.num_stages):
            self.current_stage = stage
            samples = [sample_fixed(self.bbox_assigner[stage], self.bbox_sampler[stage],
                                    boxes, valid, *self._matching_gts(boxes, gt, gt_ignore))
                       for (boxes, valid), gt, gt_ignore in zip(priors, batch_gt,
                                                                batch_gt_ignore)]
            rois = bbox2roi([sample.priors for sample in samples])
            bbox_results = self._bbox_forward(stage, x, rois)
            bbox_head = self.bbox_head[stage]
            targets = bbox_head.fixed_size_targets(
                samples, [gt.bboxes for gt in batch_gt], [gt.labels for gt in batch_gt],
                self.train_cfg[stage])
            stage_losses = bbox_head.fixed_size_loss(bbox_results['cls_score'],
                                                     bbox_results['bbox_pred'], targets)
            for name, value in stage_losses.items():
                weight = self.stage_loss_weights[stage] if 'loss' in name else 1
                losses[f's{stage}.{name}'] = value * weight
            if stage < self.num_stages - 1:
                with torch.no_grad():
                    priors = self._refined_priors(stage, samples, rois, bbox_results,
                                                  targets.labels, batch_img_metas)
        return losses

    def _refined_priors(self, stage: int, samples: List[FixedSample], rois: Tensor,
                        bbox_results: dict, labels: Tensor, batch_img_metas: List[dict]) -> list:
        """mmdet's refine_bboxes for fixed-size samples: every row regressed (by its gt label,
        else by its best class), and the next stage's priors are the drawn rows that are not
        gts (`valid`), as mmdet keeps them."""
        bbox_head = self.bbox_head[stage]
        cls_score = bbox_results['cls_score']
        if bbox_head.custom_activation:
            cls_score = bbox_head.loss_cls.get_activation(cls_score)
        labels = torch.where(labels == bbox_head.num_classes,
                             cls_score[:, :bbox_head.num_classes].argmax(1), labels)
        counts = [sample.priors.shape[0] for sample in samples]
        refined = []
        for sample, img_rois, img_labels, img_pred, meta in zip(
                samples, rois.split(counts), labels.split(counts),
                bbox_results['bbox_pred'].split(counts), batch_img_metas):
            boxes = get_box_tensor(bbox_head.regress_by_class(img_rois[:, 1:], img_labels,
                                                              img_pred, meta))
            refined.append((boxes, (sample.pos | sample.neg) & ~sample.is_gt))
        return refined

    def predict_bbox(self, x: Tuple[Tensor], batch_img_metas: List[dict],
                     rpn_results_list: List[InstanceData], rcnn_test_cfg, rescale: bool = False,
                     **kwargs) -> List[InstanceData]:
        proposals = [get_box_tensor(res.bboxes) for res in rpn_results_list]
        rois = bbox2roi(proposals)
        if rois.shape[0] == 0:
            num_classes = self.bbox_head[-1].num_classes
            return [empty_rotated_results(rois.device, num_classes, rcnn_test_cfg is not None)
                    for _ in batch_img_metas]
        rois, cls_scores, bbox_preds = self._refine_roi(
            x=x, rois=rois, batch_img_metas=batch_img_metas,
            num_proposals_per_img=tuple(len(p) for p in proposals), **kwargs)
        cls_scores = [_background_unless_valid(score, res.get('valid', None))
                      for score, res in zip(cls_scores, rpn_results_list)]
        results = self.bbox_head[-1].predict_by_feat(
            rois=rois, cls_scores=cls_scores, bbox_preds=bbox_preds,
            batch_img_metas=batch_img_metas, rescale=rescale, rcnn_test_cfg=rcnn_test_cfg)
        # the test path's one data-dependent shape (a captured forward ends before it)
        return cut_unless_kept(results)

    def _refine_roi(self, x: Tuple[Tensor], rois: Tensor, batch_img_metas: List[dict],
                    num_proposals_per_img: Sequence[int], **kwargs) -> tuple:
        """mmdet's CascadeRoIHead._refine_roi (same results) without its host waits: mmdet
        takes the image column with a list index, a copy from the host."""
        counts = list(num_proposals_per_img)
        stage_scores = []
        for stage in range(self.num_stages):
            bbox_results = self._bbox_forward(stage=stage, x=x, rois=rois, **kwargs)
            cls_score, bbox_pred = bbox_results['cls_score'], bbox_results['bbox_pred']
            stage_scores.append(cls_score)
            if stage < self.num_stages - 1:
                bbox_head = self.bbox_head[stage]
                if bbox_head.custom_activation:
                    cls_score = bbox_head.loss_cls.get_activation(cls_score)
                labels = cls_score[:, :-1].argmax(dim=1)
                refined = [
                    get_box_tensor(bbox_head.regress_by_class(img_rois[:, 1:], img_labels,
                                                              img_pred, meta))
                    for img_rois, img_labels, img_pred, meta in zip(
                        rois.split(counts), labels.split(counts), bbox_pred.split(counts),
                        batch_img_metas)
                    if img_rois.shape[0] > 0]
                rois = torch.cat([rois[:, :1], torch.cat(refined)], dim=1)
        cls_scores = sum(stage_scores) / float(len(stage_scores))
        return rois.split(counts), cls_scores.split(counts), bbox_pred.split(counts)


def _background_unless_valid(cls_score: Tensor, valid: Optional[Tensor]) -> Tensor:
    """Logits whose softmax puts every padding RoI (valid False) wholly on the background (the
    last class), so that its class scores are 0 and no detection comes from it."""
    if valid is None:
        return cls_score
    foreground = torch.arange(cls_score.shape[1], device=cls_score.device) < cls_score.shape[1] - 1
    return cls_score.masked_fill(~valid[:, None] & foreground, float('-inf'))


def _rotated_tensor(boxes) -> Tensor:
    boxes = get_box_tensor(boxes)
    if boxes.dim() != 2 or boxes.size(-1) != 5:
        raise ValueError(f'gt_instances.bboxes: expected rotated boxes (N, 5) '
                         f'(cx, cy, w, h, theta), got shape {tuple(boxes.shape)}')
    return boxes
