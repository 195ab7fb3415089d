"""One R-CNN stage's assignment and sampling in fixed-size tensors: no host synchronisation.

mmdet's path (MaxIoUAssigner, RandomSampler with add_gt_as_proposals, SamplingResult) lists
the drawn RoIs by index and so has a data-dependent size at every step. Here an image's
candidates are its gts (when the sampler adds them) followed by its priors; the draw is a pair
of masks (fixed_size_sampler), and the image contributes exactly `min(num, #candidates)` rows:
the drawn positives, then the drawn negatives (each in candidate order, as mmdet lists them),
then padding rows that weigh nothing. Priors outside `valid` (padding proposals) are ignored
by the assigner and never drawn; so are padding gts (outside `match_gt.valid`, see
models/gt_padding.py): as candidates they are ignored (gt_inds -1), so neither the draw nor the
drawn counts see them.
"""
from typing import NamedTuple, Optional

import torch
from mmengine.structures import InstanceData
from torch import Tensor

from ..task_modules.fixed_size_sampler import sample_masks


class FixedSample(NamedTuple):
    """`num` rows of one image (see the module docstring)."""
    priors: Tensor    # (num, box_dim) the rows' boxes
    pos: Tensor       # (num,) bool, a drawn positive
    neg: Tensor       # (num,) bool, a drawn negative
    is_gt: Tensor     # (num,) bool, the row is a gt added as a candidate (padding gts too)
    gt_index: Tensor  # (num,) int64, the assigned gt of a positive (0 elsewhere)


def sample_fixed(assigner, sampler, priors: Tensor, valid: Optional[Tensor],
                 match_gt: InstanceData, gt_ignore: Optional[InstanceData]) -> FixedSample:
    """Assign `priors` to `match_gt` and draw as mmdet's RandomSampler `sampler` does."""
    pred = InstanceData(priors=priors)
    if valid is not None:
        pred.valid = valid
    assign = assigner.assign(pred, match_gt, gt_ignore)
    gt_inds, candidates = assign.gt_inds, priors
    num_gts = match_gt.bboxes.shape[0]
    is_gt = torch.zeros_like(gt_inds, dtype=torch.bool)
    if sampler.add_gt_as_proposals and num_gts > 0:
        gt_numbers = torch.arange(1, num_gts + 1, device=gt_inds.device)
        gt_valid = match_gt.get('valid', None)  # checked by the assigner
        if gt_valid is not None:
            gt_numbers = torch.where(gt_valid, gt_numbers, -1)
        gt_inds = torch.cat([gt_numbers, gt_inds])
        candidates = torch.cat([match_gt.bboxes, priors])  # promotes, as mmdet's cat_boxes
        is_gt = torch.cat([torch.ones_like(gt_numbers, dtype=torch.bool), is_gt])
    drawn = sample_masks(gt_inds, sampler)
    # rows: positives, negatives, then the rest; a stable sort keeps candidate order in each
    category = torch.where(drawn.pos, 0, torch.where(drawn.neg, 1, 2)).to(torch.uint8)
    rows = category.sort(stable=True).indices[:sampler.num]
    return FixedSample(priors=candidates[rows], pos=drawn.pos[rows], neg=drawn.neg[rows],
                       is_gt=is_gt[rows], gt_index=(gt_inds[rows] - 1).clamp(min=0))
