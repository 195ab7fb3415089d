"""OptimWrapper (registered as 'RedetOptimWrapper'): mmengine's OptimWrapper whose gradient
clipping logs the norm with defer_scalar instead of `float(norm)`, which makes the host wait for
the GPU every step. With RedetRuntimeInfoHook the norm is read back once per log interval;
without it, at once (mmengine's behaviour). In a config:
optim_wrapper = dict(type='RedetOptimWrapper', optimizer=..., clip_grad=dict(max_norm=35))
(from another project's scope, e.g. mmrotate's: type='mmdet.RedetOptimWrapper').
"""
from typing import List

import torch
from mmdet.registry import OPTIM_WRAPPERS
from mmengine.optim import OptimWrapper as MMEngineOptimWrapper

from ..utils.registration import register
from .deferred_scalars import defer_scalar


@register(OPTIM_WRAPPERS)
class OptimWrapper(MMEngineOptimWrapper):

    def _clip_grad(self) -> None:
        # mmengine's _clip_grad, with the norm deferred (clip_grad_norm_ itself reads nothing
        # back unless error_if_nonfinite=True)
        params: List[torch.Tensor] = [
            p for group in self.optimizer.param_groups for p in group['params']
            if p.requires_grad and p.grad is not None]
        if params:
            grad = self.clip_func(params, **self.clip_grad_kwargs)
            if grad is not None:  # (clip_grad_value_ returns None)
                defer_scalar(f'train/{self.grad_name}', grad, message_hub=self.message_hub)
