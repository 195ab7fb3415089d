"""Stage-1 coder of the RoI Transformer: horizontal priors -> rotated (le90) boxes."""
from typing import Optional, Sequence

from mmdet.registry import TASK_UTILS
from mmdet.models.task_modules.coders.base_bbox_coder import BaseBBoxCoder
from mmdet.structures.bbox import get_box_tensor
from torch import Tensor

from redet_plugin.structures import hbox_as_prior
from redet_plugin.utils.registration import register

from .rbox_delta_math import check_coder_args, decode_rbox_deltas, encode_rbox_deltas


@register(TASK_UTILS)
class DeltaXYWHTHBBoxCoder(BaseBBoxCoder):
    """Encodes rotated targets as deltas from horizontal (x1, y1, x2, y2) priors.

    The prior is read as a rotated box at angle 0; see rbox_delta_math for the deltas.
    """
    encode_size = 5

    def __init__(self, target_means: Sequence[float] = (0., 0., 0., 0., 0.),
                 target_stds: Sequence[float] = (0.1, 0.1, 0.2, 0.2, 0.1),
                 angle_version: str = 'le90', norm_factor: Optional[float] = 2.0,
                 edge_swap: bool = True, wh_ratio_clip: float = 16 / 1000, **kwargs):
        super().__init__(**kwargs)
        check_coder_args(angle_version, target_means, target_stds)
        self.means, self.stds = tuple(target_means), tuple(target_stds)
        self.norm_factor, self.edge_swap, self.wh_ratio_clip = norm_factor, edge_swap, wh_ratio_clip

    def encode(self, bboxes, gt_bboxes) -> Tensor:
        bboxes, gt_bboxes = get_box_tensor(bboxes), get_box_tensor(gt_bboxes)
        _check_shapes(bboxes, 4, gt_bboxes, 5)
        return encode_rbox_deltas(hbox_as_prior(bboxes), gt_bboxes, self.means, self.stds,
                                  self.norm_factor, self.edge_swap, proj_xy=False)

    def decode(self, bboxes, pred_bboxes: Tensor, max_shape=None, wh_ratio_clip=None) -> Tensor:
        """max_shape is ignored: mmrotate's (and ReDet's) horizontal-prior coder clamps nothing."""
        bboxes = get_box_tensor(bboxes)
        return decode_rbox_deltas(hbox_as_prior(bboxes), pred_bboxes, self.means, self.stds,
                                  self.norm_factor, proj_xy=False,
                                  wh_ratio_clip=wh_ratio_clip or self.wh_ratio_clip)


def _check_shapes(priors: Tensor, prior_dim: int, targets: Tensor, target_dim: int) -> None:
    if priors.size(-1) != prior_dim or targets.size(-1) != target_dim \
            or priors.shape[:-1] != targets.shape[:-1]:
        raise ValueError(f'encode: expected priors (N, {prior_dim}) and targets (N, {target_dim}), '
                         f'got {tuple(priors.shape)} and {tuple(targets.shape)}')
