"""mmdet's RandomSampler as masks over a fixed-size set of priors: no host synchronisation.

mmdet's RandomSampler lists the positive and negative indices (nonzero), draws from them with
randperm, and sizes the negative draw from the positive count: every step reads a size back
from the GPU. Here each prior gets one uniform random key and a draw is "the k members of a set
with the smallest keys", found by topk over all priors; the sizes stay on the device. The
distribution is mmdet's: min(#positives, num * pos_fraction) positives drawn uniformly without
replacement, then min(#negatives, num - drawn positives) negatives (capped by neg_pos_ub times
the drawn positives, at least one, when neg_pos_ub >= 0). The two sets are disjoint, so one key
per prior serves both draws.

A subclass of RandomSampler may supply the keys: a method `draw_keys(gt_inds)` returning (N,)
uniform numbers in [0, 1) (e.g. seeded per image, for runs that must draw alike on any number
of processes). Other subclasses change mmdet's rule in ways masks do not follow, and are refused.
"""
from typing import NamedTuple, Optional

import torch
from mmdet.models.task_modules.samplers import RandomSampler
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
