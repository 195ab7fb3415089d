"""mmdet's MaxIoUAssigner without host synchronisations, for fixed-size sets of priors.

mmdet's low-quality matching loops over the gts in Python, and every iteration waits for the
device twice (an `if` on a device scalar, then a boolean-mask write); steps 2, 3 and the label
lookup write through boolean masks (nonzero, so another wait each). Here every step is a
torch.where, an amax or a scatter_reduce over all gts at once, and the result equals mmdet's
(gt_inds, max_overlaps, labels) element for element, ties included.

Fixed-size prior sets (all anchors, padded proposals) mark their members with
`pred_instances.valid`, an (N,) bool mask: a prior outside it is ignored (gt_inds -1) and is
never any gt's best match, so the members get exactly the assignment mmdet gives the members
alone. Fixed-size gt sets (gts padded to a fixed count, structures/gt_padding.py) mark the real
gts with `gt_instances.valid`, a (G,) bool mask: a padding gt is never a prior's best gt and
claims no low-quality match, so the priors get exactly mmdet's assignment to the real gts alone
(gt_inds count padded positions; the padding comes last, so they are the unpadded ones), and
with no real gt every prior is a negative, as in mmdet's no-gt branch. Ignored gts
(ignore_iof_thr) are handled with a mask as well, and may be padded alike
(`gt_instances_ignore.valid`); the IoU calculator defaults to RedetBboxOverlaps2D, mmdet's
without its host copy.
"""
from typing import Optional

import torch
from mmdet.models.task_modules.assigners import AssignResult
from mmdet.models.task_modules.assigners import MaxIoUAssigner as MMDetMaxIoUAssigner
from mmdet.registry import TASK_UTILS
from mmengine.structures import InstanceData
from torch import Tensor

from redet_plugin.utils.registration import register

# a padding gt's overlap with every prior: below any IoU and below an ignored prior's -1, so
# that the best gt of a prior is always a real one when there is one
_PADDING_GT_OVERLAP = -2.0


@register(TASK_UTILS)
class MaxIoUAssigner(MMDetMaxIoUAssigner):
    """Drop-in for mmdet's MaxIoUAssigner (same arguments, same results); registered as
    'RedetMaxIoUAssigner'."""

    def __init__(self, *args, iou_calculator: Optional[dict] = None, **kwargs):
        if iou_calculator is None:
            iou_calculator = dict(type='RedetBboxOverlaps2D')
        super().__init__(*args, iou_calculator=iou_calculator, **kwargs)

    def assign(self, pred_instances: InstanceData, gt_instances: InstanceData,
               gt_instances_ignore: Optional[InstanceData] = None, **kwargs) -> AssignResult:
        valid = pred_instances.get('valid', None)
        gt_valid = gt_instances.get('valid', None)
        if self.gpu_assign_thr > 0 or self.perm_repeat_gt_cfg is not None:
            for name, mask in (('pred_instances', valid), ('gt_instances', gt_valid),
                               ('gt_instances_ignore', _ignore_valid(gt_instances_ignore))):
                if mask is not None:
                    raise ValueError(f'{name}.valid: not supported with gpu_assign_thr or '
                                     'perm_repeat_gt_cfg (those take mmdet\'s code path)')
            return super().assign(pred_instances, gt_instances, gt_instances_ignore, **kwargs)
        priors = pred_instances.priors
        overlaps = self.iou_calculator(gt_instances.bboxes, priors)
        ignored = self._ignored_priors(priors, gt_instances_ignore)
        if ignored is not None:
            overlaps = overlaps.masked_fill(ignored, -1)
        if valid is not None:
            _check_valid(valid, overlaps.size(1), 'pred_instances.valid')
            overlaps = overlaps.masked_fill(~valid, -1)
        result = self.assign_wrt_overlaps(overlaps, gt_instances.labels, gt_valid=gt_valid)
        if valid is not None:  # with no gts every prior is a negative, members or not
            result.gt_inds = torch.where(valid, result.gt_inds, -1)
            if result.labels is not None:
                result.labels = torch.where(valid, result.labels, -1)
        return result

    def _ignored_priors(self, priors: Tensor, gt_instances_ignore: Optional[InstanceData]):
        """mmdet's ignore rule as an (N,) mask: priors whose IoF with an ignored gt is above
        ignore_iof_thr; None when nothing can be ignored."""
        if self.ignore_iof_thr <= 0 or gt_instances_ignore is None or priors.numel() == 0:
            return None
        ignore_boxes = gt_instances_ignore.bboxes
        if ignore_boxes.numel() == 0:
            return None
        iof = self.iou_calculator(ignore_boxes, priors, mode='iof') if not \
            self.ignore_wrt_candidates else self.iou_calculator(priors, ignore_boxes, mode='iof').T
        ignore_valid = _ignore_valid(gt_instances_ignore)
        if ignore_valid is not None:  # padding ignore boxes ignore nothing (thr > 0)
            _check_valid(ignore_valid, iof.size(0), 'gt_instances_ignore.valid')
            iof = iof.masked_fill(~ignore_valid[:, None], -1)
        return iof.max(dim=0)[0] > self.ignore_iof_thr

    def assign_wrt_overlaps(self, overlaps: Tensor, gt_labels: Tensor,
                            gt_valid: Optional[Tensor] = None) -> AssignResult:
        """mmdet's assign_wrt_overlaps; with `gt_valid` ((G,) bool), mmdet's result for the
        real gts alone (num_gts stays G: the real count would be a value read back)."""
        num_gts, num_bboxes = overlaps.size(0), overlaps.size(1)
        if gt_valid is not None:
            _check_valid(gt_valid, num_gts, 'gt_instances.valid')
        if num_gts == 0 or num_bboxes == 0:
            # shape-only branch: mmdet's code waits for nothing there
            return super().assign_wrt_overlaps(overlaps, gt_labels)
        _check_labels(gt_labels, num_gts)
        if gt_valid is not None:
            overlaps = overlaps.masked_fill(~gt_valid[:, None], _PADDING_GT_OVERLAP)

        max_overlaps, argmax_overlaps = overlaps.max(dim=0)
        gt_max_overlaps, gt_argmax_overlaps = overlaps.max(dim=1)

        # 1. and 2.: -1 (ignored) unless the best IoU is in the negative range
        negative = self._negative_mask(max_overlaps)
        assigned_gt_inds = overlaps.new_full((num_bboxes, ), -1, dtype=torch.long)
        if negative is not None:
            assigned_gt_inds = torch.where(negative, 0, assigned_gt_inds)

        # 3. positive: the best gt when its IoU reaches pos_iou_thr
        assigned_gt_inds = torch.where(max_overlaps >= self.pos_iou_thr, argmax_overlaps + 1,
                                       assigned_gt_inds)

        # 4. low-quality matches overwrite step 3; mmdet writes gt by gt in index order, so
        # where several gts claim a box the highest index wins
        if self.match_low_quality:
            low_quality = self._low_quality_gt_inds(overlaps, gt_max_overlaps, gt_argmax_overlaps,
                                                    gt_valid)
            assigned_gt_inds = torch.where(low_quality > 0, low_quality, assigned_gt_inds)

        if gt_valid is not None:  # no real gt: mmdet's no-gt branch, every prior a negative
            any_gt = gt_valid.any()
            assigned_gt_inds = torch.where(any_gt, assigned_gt_inds, 0)
            max_overlaps = torch.where(any_gt, max_overlaps, 0)

        assigned_labels = torch.where(
            assigned_gt_inds > 0, gt_labels.long()[(assigned_gt_inds - 1).clamp(min=0)], -1)
        return AssignResult(num_gts=num_gts, gt_inds=assigned_gt_inds,
                            max_overlaps=max_overlaps, labels=assigned_labels)

    def _negative_mask(self, max_overlaps: Tensor):
        """Step 2's mask, with mmdet's reading of neg_iou_thr (a float: [0, thr); a pair:
        [lo, hi); anything else: no negatives)."""
        if isinstance(self.neg_iou_thr, float):
            return (max_overlaps >= 0) & (max_overlaps < self.neg_iou_thr)
        if isinstance(self.neg_iou_thr, tuple):
            assert len(self.neg_iou_thr) == 2
            return (max_overlaps >= self.neg_iou_thr[0]) & (max_overlaps < self.neg_iou_thr[1])
        return None

    def _low_quality_gt_inds(self, overlaps: Tensor, gt_max_overlaps: Tensor,
                             gt_argmax_overlaps: Tensor,
                             gt_valid: Optional[Tensor] = None) -> Tensor:
        """Per box, 1 + the highest gt index that claims it in step 4, or 0 if none does;
        padding gts (outside gt_valid) claim nothing, whatever min_pos_iou is."""
        num_gts, num_bboxes = overlaps.shape
        gt_numbers = torch.arange(1, num_gts + 1, device=overlaps.device)
        claims = gt_max_overlaps >= self.min_pos_iou
        if gt_valid is not None:
            claims = claims & gt_valid
        if self.gt_max_assign_all:
            # gt i claims every box whose IoU with it equals its maximum
            claimed = (overlaps == gt_max_overlaps[:, None]) & claims[:, None]
            index_dtype = torch.int16 if num_gts < 2**15 else torch.int64
            return torch.where(claimed, gt_numbers.to(index_dtype)[:, None],
                               0).amax(dim=0).long()
        # gt i claims only the box at its argmax
        return overlaps.new_zeros((num_bboxes, ), dtype=torch.long).scatter_reduce_(
            0, gt_argmax_overlaps, torch.where(claims, gt_numbers, 0), reduce='amax')


def _check_labels(gt_labels, num_gts: int) -> None:
    if not isinstance(gt_labels, Tensor) or gt_labels.dtype.is_floating_point \
            or gt_labels.dtype.is_complex or gt_labels.dtype == torch.bool:
        raise TypeError(f'gt_labels: expected an integer tensor of shape ({num_gts},), got '
                        f'{getattr(gt_labels, "dtype", type(gt_labels).__name__)}')
    if gt_labels.shape != (num_gts, ):
        raise ValueError(f'gt_labels: expected shape ({num_gts},) (one label per gt), got '
                         f'{tuple(gt_labels.shape)}')


def _ignore_valid(gt_instances_ignore: Optional[InstanceData]) -> Optional[Tensor]:
    return None if gt_instances_ignore is None else gt_instances_ignore.get('valid', None)


def _check_valid(valid, count: int, name: str) -> None:
    if not isinstance(valid, Tensor) or valid.dtype != torch.bool or valid.shape != (count, ):
        raise TypeError(f'{name}: expected a bool tensor of shape ({count},), '
                        f'got {getattr(valid, "dtype", type(valid).__name__)} of shape '
                        f'{tuple(getattr(valid, "shape", ()))}')
