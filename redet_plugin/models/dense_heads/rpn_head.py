"""mmdet's RPNHead with fixed-size targets and proposals: no host synchronisation.

mmdet's RPNHead keeps the anchors inside the image by boolean indexing, lists sampled indices,
counts them on the host for the loss's average, builds its coder constants and anchors from host
memory, and cuts its proposals to what NMS keeps: each waits for the GPU. Here
- the anchors, and the flags of those inside the image, are built once per feature-map size
  (and image shape), dtype and device, and kept;
- every anchor is a target row: those outside the image are marked invalid for the assigner
  (RedetMaxIoUAssigner ignores them, so the others get mmdet's assignment), the sampler's draw
  is a pair of masks (fixed_size_sampler), and the loss weights are those masks;
- the loss is one call over all levels and images, averaged by the drawn count kept on the GPU;
- gts padded to a fixed count (`gt_instances.valid`, structures/gt_padding.py) give the targets
  of the real gts alone: the assigner never assigns a padding gt;
- the proposals of all images go through one class-aware NMS (nms_keep_mask; classes are
  image x level, mmdet's per-level NMS) and come out as `max_per_img` rows per image, highest
  score first, with `valid` marking the rows NMS kept; the rest are padding.
The losses equal mmdet's for the same draw, and the valid proposals are mmdet's (up to the
order of equal scores). The weights and layers are mmdet's RPNHead's, so checkpoints load.
The proposals are for RoI heads that read `valid` (RedetRoITransformerRoIHead); an mmdet RoI head
would take the padding rows, which are boxes NMS suppressed, as proposals: give it
`[res[res.valid] for res in proposals]`.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from mmdet.models.dense_heads import RPNHead as MMDetRPNHead
from mmdet.models.task_modules.prior_generators import anchor_inside_flags
from mmdet.registry import MODELS
from mmdet.structures.bbox import get_box_tensor
from mmengine.structures import InstanceData
from torch import Tensor, nn

from redet_plugin.models.utils.device_constants import kept_in
from redet_plugin.ops import nms_keep_mask
from redet_plugin.utils.registration import register

from ..layers.fused_convolution import conv_relu
from ..layers.multiclass_nms import kept_first, nms_arguments
from ..task_modules.samplers import check_random_sampler, sample_masks
from ..task_modules.assigners import MaxIoUAssigner

_ANCHOR_CACHE_SIZE = 8  # feature-map size sets kept (multi-scale training uses a few)
_INSIDE_CACHE_SIZE = 32  # (feature-map sizes, pad shape, image shape) keys kept


@register(MODELS)
class RPNHead(MMDetRPNHead):
    """Drop-in for mmdet's RPNHead (same arguments and weights); registered as
    'RedetRPNHead'. train_cfg needs RedetMaxIoUAssigner and RandomSampler."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.train_cfg:
            if not isinstance(self.assigner, MaxIoUAssigner):
                raise TypeError("train_cfg.rpn.assigner: RedetRPNHead needs type "
                                f"'RedetMaxIoUAssigner', got {type(self.assigner).__name__}")
            check_random_sampler(self.sampler, 'train_cfg.rpn.sampler')
            if self.reg_decoded_bbox:
                raise ValueError('reg_decoded_bbox: not supported by RedetRPNHead')
        self._anchor_cache = {}
        self._inside_cache = {}

    def forward_single(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """mmdet's, with the shared convolution and its ReLU in one call where cuDNN can
        (fused_convolution.py: a GPU at inference)."""
        if type(self.rpn_conv) is not nn.Conv2d:  # (num_convs > 1: ConvModules)
            return super().forward_single(x)
        x = conv_relu(self.rpn_conv, x)
        return self.rpn_cls(x), self.rpn_reg(x)

    def anchors(self, featmap_sizes: Sequence[Tuple[int, int]], dtype: torch.dtype,
                device: torch.device) -> List[Tensor]:
        """The anchors of each level (mmdet's grid_priors), built once per key."""
        key = (_sizes(featmap_sizes), dtype, torch.device(device))
        return kept_in(self._anchor_cache, key, _ANCHOR_CACHE_SIZE, lambda: (
            self.prior_generator.grid_priors(featmap_sizes, dtype=dtype, device=device)), device)

    def _inside_flags(self, anchors: Tensor, featmap_sizes, img_meta: dict) -> Tensor:
        """mmdet's valid flags and anchor_inside_flags of the anchors: kept per feature-map
        size, pad shape and image shape (the same tensor every step of a size), except when
        first made under graph capture (device_constants says why)."""
        key = (_sizes(featmap_sizes), tuple(img_meta['pad_shape'][:2]),
               tuple(img_meta['img_shape'][:2]), anchors.device)

        def make():
            valid_flags = torch.cat(self.prior_generator.valid_flags(
                featmap_sizes, img_meta['pad_shape'], anchors.device))
            # mmdet raises when no anchor is inside the image (a host wait); here such an image
            # draws nothing and adds nothing to the loss
            return anchor_inside_flags(anchors, valid_flags, img_meta['img_shape'][:2],
                                       self.train_cfg['allowed_border'])
        return kept_in(self._inside_cache, key, _INSIDE_CACHE_SIZE, make, anchors.device)

    # ----- training targets and losses -----

    def loss_by_feat(self, cls_scores: List[Tensor], bbox_preds: List[Tensor],
                     batch_gt_instances: List[InstanceData], batch_img_metas: List[dict],
                     batch_gt_instances_ignore=None) -> dict:
        featmap_sizes = [score.shape[-2:] for score in cls_scores]
        level_anchors = self.anchors(featmap_sizes, torch.float32, cls_scores[0].device)
        level_sizes = [level.shape[0] for level in level_anchors]
        anchors = torch.cat(level_anchors)
        if batch_gt_instances_ignore is None:
            batch_gt_instances_ignore = [None] * len(batch_img_metas)
        targets = [self._targets_single(anchors, featmap_sizes, gt, meta, ignore)
                   for gt, meta, ignore in zip(batch_gt_instances, batch_img_metas,
                                               batch_gt_instances_ignore)]
        *per_image_targets, avg_factors = zip(*targets)
        labels, label_weights, bbox_targets, bbox_weights = (
            _level_major_rows(parts, level_sizes) for parts in per_image_targets)
        avg_factor = torch.cat(avg_factors).sum()
        cls_score = _flatten_levels_level_major(cls_scores, self.cls_out_channels)
        if self.use_sigmoid_cls:  # one-hot: mmdet's loss expands (N,) labels with a host wait
            classes = torch.arange(self.cls_out_channels, device=labels.device)
            labels = (labels[:, None] == classes).long()
            label_weights = label_weights[:, None].expand_as(labels)
        loss_cls = self.loss_cls(cls_score, labels, label_weights, avg_factor=avg_factor)
        bbox_pred = _flatten_levels_level_major(bbox_preds, self.bbox_coder.encode_size)
        loss_bbox = self.loss_bbox(bbox_pred, bbox_targets, bbox_weights, avg_factor=avg_factor)
        return dict(loss_rpn_cls=loss_cls, loss_rpn_bbox=loss_bbox)

    def _targets_single(self, anchors: Tensor, featmap_sizes, gt_instances: InstanceData,
                        img_meta: dict, gt_instances_ignore) -> tuple:
        """labels (N,), label_weights (N,), bbox_targets (N, 4), bbox_weights (N, 4) over all N
        anchors, as mmdet's _get_targets_single after unmap, and the image's share of the loss
        average, (1,): mmdet's SamplingResult.avg_factor, max(#pos, 1) + max(#neg, 1)."""
        inside = self._inside_flags(anchors, featmap_sizes, img_meta)
        assign = self.assigner.assign(InstanceData(priors=anchors, valid=inside), gt_instances,
                                      gt_instances_ignore)
        drawn = sample_masks(assign.gt_inds, self.sampler)
        pos = drawn.pos

        gt_boxes = get_box_tensor(gt_instances.bboxes)
        if gt_boxes.shape[0] > 0:
            matched = (assign.gt_inds - 1).clamp(min=0)
            pos_labels = gt_instances.labels[matched]
            encoded = self.bbox_coder.encode(anchors, gt_boxes[matched])
            # only positives are encoded by mmdet; zeros elsewhere keep an unmatched degenerate
            # gt's inf out of the weighted loss
            bbox_targets = torch.where(pos[:, None], encoded, 0.0)
        else:
            pos_labels = torch.zeros_like(assign.gt_inds)
            bbox_targets = anchors.new_zeros(anchors.shape[0], self.bbox_coder.encode_size)
        labels = torch.where(pos, pos_labels, self.num_classes)
        pos_weight = self.train_cfg['pos_weight']
        label_weights = torch.where(pos, pos_weight if pos_weight > 0 else 1.0,
                                    drawn.neg.float())
        bbox_weights = pos.float()[:, None].expand_as(bbox_targets)
        avg_factor = pos.sum().clamp(min=1) + drawn.neg.sum().clamp(min=1)
        return labels, label_weights, bbox_targets, bbox_weights, avg_factor[None]

    # ----- proposals -----

    def predict_by_feat(self, cls_scores: List[Tensor], bbox_preds: List[Tensor],
                        score_factors=None, batch_img_metas: Optional[List[dict]] = None,
                        cfg=None, rescale: bool = False,
                        with_nms: bool = True) -> List[InstanceData]:
        if not with_nms:
            raise ValueError('with_nms: RedetRPNHead always applies NMS (as mmdet RPNHead)')
        cfg = self.test_cfg if cfg is None else cfg
        num_imgs = len(batch_img_metas)
        featmap_sizes = [score.shape[-2:] for score in cls_scores]
        level_anchors = self.anchors(featmap_sizes, cls_scores[0].dtype, cls_scores[0].device)
        nms_pre = cfg.get('nms_pre', -1)
        scores, deltas, priors, levels = [], [], [], []
        for level, (cls_score, bbox_pred, anchors) in enumerate(
                zip(cls_scores, bbox_preds, level_anchors)):
            level_scores = _flatten_levels([cls_score.detach()], self.cls_out_channels, num_imgs)
            if self.use_sigmoid_cls:
                level_scores = level_scores.sigmoid()[..., 0]
            else:  # background is the last column (mmdet >= 2.0)
                level_scores = level_scores.softmax(-1)[..., 0]
            level_deltas = _flatten_levels([bbox_pred.detach()], self.bbox_coder.encode_size,
                                           num_imgs)
            if 0 < nms_pre < level_scores.shape[1]:
                level_scores, top = level_scores.topk(nms_pre, dim=1)
                level_deltas = level_deltas.gather(
                    1, top[..., None].expand(-1, -1, level_deltas.shape[-1]))
                level_priors = anchors[top]
            else:
                level_priors = anchors.expand(num_imgs, -1, -1)
            scores.append(level_scores)
            deltas.append(level_deltas)
            priors.append(level_priors)
            levels.append(torch.full_like(level_scores, level, dtype=torch.long))
        scores, levels = torch.cat(scores, 1), torch.cat(levels, 1)
        per_img = scores.shape[1]
        boxes = get_box_tensor(self.bbox_coder.decode(
            torch.cat(priors, 1).reshape(-1, 4),
            torch.cat(deltas, 1).reshape(-1, self.bbox_coder.encode_size)))
        boxes = boxes.view(num_imgs, per_img, 4)
        clip = getattr(self.bbox_coder, 'clip_border', True)
        boxes = torch.stack([_clip_and_rescale(img_boxes, meta, clip, rescale)
                             for img_boxes, meta in zip(boxes, batch_img_metas)])
        return self._nms_per_image(boxes, scores, levels, len(cls_scores), cfg)

    def _nms_per_image(self, boxes: Tensor, scores: Tensor, levels: Tensor, num_levels: int,
                       cfg) -> List[InstanceData]:
        """One NMS over all images (image x level classes), then max_per_img rows each."""
        num_imgs, per_img = scores.shape
        # under autocast the decoded boxes come in float32 (exp) and the scores in half: the NMS
        # takes one dtype, the wider
        dtype = torch.promote_types(boxes.dtype, scores.dtype)
        boxes, scores = boxes.to(dtype), scores.to(dtype)
        candidate = torch.ones_like(scores, dtype=torch.bool)
        min_size = cfg.get('min_bbox_size', -1)
        if min_size >= 0:
            wh = boxes[..., 2:] - boxes[..., :2]
            candidate = (wh[..., 0] > min_size) & (wh[..., 1] > min_size)
        nms_args = nms_arguments(cfg.get('nms'), 4, 'rpn nms config')
        if nms_args is None:
            raise ValueError('rpn nms config: RedetRPNHead needs nms=dict(type=\'nms\', '
                             'iou_threshold=...) in its test_cfg / rpn_proposal')
        iou_threshold, class_agnostic, _ = nms_args
        image_ids = torch.arange(num_imgs, device=scores.device)[:, None]
        groups = image_ids if class_agnostic else image_ids * num_levels + levels
        keep = nms_keep_mask(boxes.reshape(-1, 4),
                             scores.masked_fill(~candidate, float('-inf')).reshape(-1),
                             iou_threshold, groups.expand(num_imgs, per_img).reshape(-1))
        kept = keep.view(num_imgs, per_img) & candidate
        order, valid = kept_first(scores, kept, cfg.max_per_img)
        results = []
        for img in range(num_imgs):
            rows = order[img]
            results.append(InstanceData(
                bboxes=boxes[img, rows], scores=scores[img, rows],
                labels=rows.new_zeros(rows.shape), valid=valid[img]))
        return results


def _sizes(featmap_sizes) -> tuple:
    return tuple(tuple(int(v) for v in size) for size in featmap_sizes)


def _flatten_levels(maps: List[Tensor], channels: int, num_imgs: int) -> Tensor:
    """(B, A * channels, H, W) maps -> (B, sum A H W, channels): per image, mmdet's
    (level, h, w, anchor) order."""
    return torch.cat([m.permute(0, 2, 3, 1).reshape(num_imgs, -1, channels) for m in maps], 1)


def _flatten_levels_level_major(maps: List[Tensor], channels: int) -> Tensor:
    """(B, A * channels, H, W) maps -> (sum B H W A, channels) in (level, image, h, w, anchor)
    order, for the loss. Level-major because then each map's gradient comes back as one
    contiguous slice: for a channels-last map, a channels-last-contiguous gradient, which the
    convolution's backward takes as it is (an image-major cat would give it a strided slice
    to convert)."""
    return torch.cat([m.permute(0, 2, 3, 1).reshape(-1, channels) for m in maps])


def _level_major_rows(per_image: Sequence[Tensor], level_sizes: Sequence[int]) -> Tensor:
    """Per-image rows over all anchors, each in (level, h, w, anchor) order -> one tensor in
    (level, image, h, w, anchor) order, the rows of _flatten_levels_level_major. One cat of
    views; the level sizes are Python ints, so nothing waits for the GPU."""
    per_image_levels = [rows.split(level_sizes) for rows in per_image]
    return torch.cat([image_levels[level] for level in range(len(level_sizes))
                      for image_levels in per_image_levels])


def _clip_and_rescale(boxes: Tensor, img_meta: dict, clip: bool, rescale: bool) -> Tensor:
    """mmdet's decode(max_shape=img_shape) clip, then its rescale to the original image, with
    Python numbers (mmdet's scale_boxes copies the factors from the host)."""
    x1, y1, x2, y2 = boxes.unbind(-1)
    if clip:
        height, width = img_meta['img_shape'][:2]
        x1, x2 = x1.clamp(0, width), x2.clamp(0, width)
        y1, y2 = y1.clamp(0, height), y2.clamp(0, height)
    if rescale:
        scale_w, scale_h = img_meta['scale_factor'][:2]
        x1, x2 = x1 * (1 / scale_w), x2 * (1 / scale_w)
        y1, y2 = y1 * (1 / scale_h), y2 * (1 / scale_h)
    return torch.stack([x1, y1, x2, y2], dim=-1)
