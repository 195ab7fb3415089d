"""Stage-2 coder of the RoI Transformer: rotated priors -> rotated (le90) boxes."""
from typing import Optional, Sequence

from mmdet.registry import TASK_UTILS
from mmdet.models.task_modules.coders.base_bbox_coder import BaseBBoxCoder
from mmdet.structures.bbox import get_box_tensor
from torch import Tensor

from redet_plugin.utils.registration import register

from .delta_xywht_hbbox_coder import _check_shapes
from .rbox_delta_math import check_coder_args, decode_rbox_deltas, encode_rbox_deltas


@register(TASK_UTILS)
class DeltaXYWHTRBBoxCoder(BaseBBoxCoder):
    """Encodes rotated targets as deltas from rotated priors; with `proj_xy` the centre offset
    is measured in the prior's own frame (as the RoI Transformer does)."""
    encode_size = 5

    def __init__(self, target_means: Sequence[float] = (0., 0., 0., 0., 0.),
                 target_stds: Sequence[float] = (0.05, 0.05, 0.1, 0.1, 0.05),
                 angle_version: str = 'le90', norm_factor: Optional[float] = None,
                 edge_swap: bool = True, proj_xy: bool = True,
                 wh_ratio_clip: float = 16 / 1000, **kwargs):
        super().__init__(**kwargs)
        check_coder_args(angle_version, target_means, target_stds)
        self.means, self.stds = tuple(target_means), tuple(target_stds)
        self.norm_factor, self.edge_swap, self.proj_xy = norm_factor, edge_swap, proj_xy
        self.wh_ratio_clip = wh_ratio_clip

    def encode(self, bboxes, gt_bboxes) -> Tensor:
        bboxes, gt_bboxes = get_box_tensor(bboxes), get_box_tensor(gt_bboxes)
        _check_shapes(bboxes, 5, gt_bboxes, 5)
        return encode_rbox_deltas(bboxes, gt_bboxes, self.means, self.stds, self.norm_factor,
                                  self.edge_swap, self.proj_xy)

    def decode(self, bboxes, pred_bboxes: Tensor, max_shape=None, wh_ratio_clip=None) -> Tensor:
        """max_shape (H, W): centres clamped into the image (mmrotate's coder does the same)."""
        return decode_rbox_deltas(get_box_tensor(bboxes), pred_bboxes, self.means, self.stds,
                                  self.norm_factor, self.proj_xy,
                                  wh_ratio_clip=wh_ratio_clip or self.wh_ratio_clip,
                                  max_shape=max_shape)
