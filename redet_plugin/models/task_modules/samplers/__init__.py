"""mmdet's RandomSampler drawn as fixed-size masks (nothing registered: the configs name mmdet's
RandomSampler, and the heads draw with it here)."""
from .fixed_size_sampler import FixedSample, SampledMasks, check_random_sampler, sample_fixed, sample_masks

__all__ = ['FixedSample', 'SampledMasks', 'check_random_sampler', 'sample_fixed', 'sample_masks']
