"""Assignment and sampling in fixed-size tensors: mmdet's RandomSampler as masks over a
fixed-size set of priors, and one R-CNN stage's rows drawn with them. No host synchronisation.

The draw. mmdet's RandomSampler lists the positive and negative indices (nonzero), draws from
them with randperm, and sizes the negative draw from the positive count: every step reads a size
back from the GPU. Here each prior gets one uniform random key and a draw is "the k members of a
set with the smallest keys", found by topk over all priors; the sizes stay on the device. The
distribution is mmdet's: min(#positives, num * pos_fraction) positives drawn uniformly without
replacement, then min(#negatives, num - drawn positives) negatives (capped by neg_pos_ub times
the drawn positives, at least one, when neg_pos_ub >= 0). The two sets are disjoint, so one key
per prior serves both draws.

A subclass of RandomSampler may supply the keys: a method `draw_keys(gt_inds)` returning (N,)
uniform numbers in [0, 1) (e.g. seeded per image, for runs that must draw alike on any number
of processes). Other subclasses change mmdet's rule in ways masks do not follow, and are refused.

The rows of an R-CNN stage (sample_fixed). mmdet's path (MaxIoUAssigner, RandomSampler with
add_gt_as_proposals, SamplingResult) lists the drawn RoIs by index and so has a data-dependent
size at every step. Here an image's candidates are its gts (when the sampler adds them) followed
by its priors; the draw is a pair of masks (sample_masks), and the image contributes exactly
`min(num, #candidates)` rows: the drawn positives, then the drawn negatives (each in candidate
order, as mmdet lists them), then padding rows that weigh nothing. Priors outside `valid`
(padding proposals) are ignored by the assigner and never drawn; so are padding gts (outside
`match_gt.valid`, the padding of pad_gt_instances): as candidates they are ignored (gt_inds -1),
so neither the draw nor the drawn counts see them.
"""
from typing import NamedTuple, Optional

import torch
from mmdet.models.task_modules.samplers import RandomSampler
from mmengine.structures import InstanceData
from torch import Tensor


class SampledMasks(NamedTuple):
    pos: Tensor  # (N,) bool: the drawn positives
    neg: Tensor  # (N,) bool: the drawn negatives


def check_random_sampler(sampler, where: str) -> None:
    """The samplers whose rule sample_masks implements: mmdet's RandomSampler itself, or a
    subclass that supplies its keys (draw_keys)."""
    if type(sampler) is not RandomSampler and not (
            isinstance(sampler, RandomSampler) and hasattr(sampler, 'draw_keys')):
        raise TypeError(f"{where}: expected a sampler of type 'RandomSampler' (drawn with "
                        f'fixed-size masks), got {type(sampler).__name__}')


def sample_masks(gt_inds: Tensor, sampler: RandomSampler,
                 generator: Optional[torch.Generator] = None) -> SampledMasks:
    """Draw as `sampler` (an mmdet RandomSampler) from an AssignResult's gt_inds (N,):
    positives are > 0, negatives 0, ignored -1. add_gt_as_proposals is the caller's (the gts
    are priors like any other here)."""
    if hasattr(sampler, 'draw_keys'):
        keys = sampler.draw_keys(gt_inds)
    else:
        keys = torch.rand(gt_inds.shape, device=gt_inds.device, generator=generator)
    num_expected_pos = int(sampler.num * sampler.pos_fraction)
    pos = _smallest_keys(gt_inds > 0, keys, num_expected_pos)
    num_expected_neg = sampler.num - pos.sum()
    if sampler.neg_pos_ub >= 0:
        bound = (pos.sum().clamp(min=1) * float(sampler.neg_pos_ub)).floor().long()
        num_expected_neg = torch.minimum(num_expected_neg, bound)
    neg = _smallest_keys(gt_inds == 0, keys, sampler.num, num_expected_neg)
    return SampledMasks(pos, neg)


def _smallest_keys(members: Tensor, keys: Tensor, max_count: int,
                   count: Optional[Tensor] = None) -> Tensor:
    """(N,) mask of the min(count, #members) members with the smallest keys; count <= max_count
    (a device scalar) or max_count when None."""
    k = min(max_count, members.numel())
    if k <= 0:
        return torch.zeros_like(members)
    # keys are in [0, 1): 2 puts every non-member after every member
    ranked = torch.where(members, keys, 2.0)
    picked = ranked.topk(k, largest=False, sorted=count is not None).indices
    take = members[picked]
    if count is not None:
        take = take & (torch.arange(k, device=members.device) < count)
    return torch.zeros_like(members).index_put_((picked, ), take)


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
