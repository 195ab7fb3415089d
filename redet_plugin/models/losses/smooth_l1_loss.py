"""mmdet's SmoothL1Loss without its early return, which reads the weights back from the GPU.

mmdet's forward first asks `torch.any(weight > 0)` on the host and returns `(pred *
weight).sum()` when no weight is positive. With fixed-size targets (every prior present, most
with weight 0) that question costs a wait on every call and decides nothing: the weighted mean
of the same zeros is 0 too, with the same zero gradient. Everything else is mmdet's
smooth_l1_loss.
"""
from mmdet.models.losses import SmoothL1Loss as MMDetSmoothL1Loss
from mmdet.models.losses.smooth_l1_loss import smooth_l1_loss
from mmdet.registry import MODELS

from redet_plugin.utils.registration import register


@register(MODELS)
class SmoothL1Loss(MMDetSmoothL1Loss):
    """Drop-in for mmdet's SmoothL1Loss (same arguments); registered as 'RedetSmoothL1Loss'."""

    def forward(self, pred, target, weight=None, avg_factor=None, reduction_override=None,
                **kwargs):
        if reduction_override not in (None, 'none', 'mean', 'sum'):
            raise ValueError(f"reduction_override: expected None, 'none', 'mean' or 'sum', "
                             f'got {reduction_override!r}')
        reduction = reduction_override if reduction_override else self.reduction
        return self.loss_weight * smooth_l1_loss(pred, target, weight, beta=self.beta,
                                                 reduction=reduction, avg_factor=avg_factor,
                                                 **kwargs)
