"""The plugin's optim wrappers, registered as 'RedetOptimWrapper' (mmengine's OptimWrapper) and
'RedetAmpOptimWrapper' (mmengine's AmpOptimWrapper). Their steps make the host wait for nothing:
- a step whose loss or gradients are not finite is skipped on the device: the parameters, the
  optimizer state and the BN statistics stay as they were (redet_plugin/utils/nonfinite_guard.py).
  RedetNonFiniteStepsHook logs each such step and stops a run where too many come in a row;
- clipping logs the gradient norm with defer_scalar instead of `float(norm)`: with
  RedetRuntimeInfoHook it is read back once per log interval, without it at once;
- AMP: the loss scaler's inf check stays on the device (mmengine's AmpOptimWrapper reads it on
  the host every step, in GradScaler.step).
In a config:
optim_wrapper = dict(type='RedetOptimWrapper', optimizer=..., clip_grad=dict(max_norm=35))
(tools/train.py --amp makes it RedetAmpOptimWrapper; from another project's scope, e.g.
mmrotate's: type='mmdet.RedetOptimWrapper'). Their steps may be captured by cuda_graph_step,
which runs the same guard inside the graph and defers the norm the same way.
"""
from contextlib import contextmanager
from typing import Optional

import torch
from mmdet.registry import OPTIM_WRAPPERS
from mmengine.optim import AmpOptimWrapper as MMEngineAmpOptimWrapper
from mmengine.optim import OptimWrapper as MMEngineOptimWrapper

from ..cuda_graphs import capturable_optim_wrapper
from ..cuda_graphs.optim_internals import accumulative_counts, scale_update_param
from ..utils.deferred_scalars import defer_scalar
from ..utils.nonfinite_guard import NonFiniteGuard
from ..utils.registration import register


class _GuardedSteps:
    """What both wrappers change in mmengine's (mixed in before it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.nonfinite_guard = NonFiniteGuard()

    @contextmanager
    def optim_context(self, model):
        # a training step's forward runs in this context: before the first forward of a step
        # (of its accumulated ones), the BN statistics it will update are copied
        if self.inner_count % accumulative_counts(self) == 0:
            self.nonfinite_guard.begin_step(model)
        with super().optim_context(model):
            yield

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        self.nonfinite_guard.check_loss(loss)
        super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        scaler = getattr(self, 'loss_scaler', None)
        norm, flag = self.nonfinite_guard.step(
            self.optimizer, self._clipped_norm if self.clip_grad_kwargs else None, scaler,
            scale_update_param(self) if scaler is not None else None, **kwargs)
        if norm is not None:
            defer_scalar(f'train/{self.grad_name}', norm, message_hub=self.message_hub)
        self.nonfinite_guard.record(flag)

    def _clipped_norm(self) -> Optional[torch.Tensor]:
        """mmengine's _clip_grad, giving the norm back unread (clip_grad_norm_ itself reads
        nothing unless error_if_nonfinite=True; clip_grad_value_ gives None)."""
        params = [p for group in self.optimizer.param_groups for p in group['params']
                  if p.requires_grad and p.grad is not None]
        return self.clip_func(params, **self.clip_grad_kwargs) if params else None


@capturable_optim_wrapper
@register(OPTIM_WRAPPERS)
class OptimWrapper(_GuardedSteps, MMEngineOptimWrapper):
    """mmengine's OptimWrapper with non-finite steps skipped and the norm deferred."""


@capturable_optim_wrapper
@register(OPTIM_WRAPPERS)
class AmpOptimWrapper(_GuardedSteps, MMEngineAmpOptimWrapper):
    """mmengine's AmpOptimWrapper (same arguments) with non-finite steps skipped, the norm
    deferred and the loss scaler's inf check kept on the device."""
