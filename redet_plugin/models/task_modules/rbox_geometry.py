"""The two rotated-box helpers the coders and heads need beyond redet_plugin.structures.

Rotated boxes are (cx, cy, w, h, theta) tensors, theta in radians (le90: w >= h, theta in
[-pi/2, pi/2); see structures.regularize_rboxes).
"""
import torch
from torch import Tensor


def hbox_as_prior(boxes: Tensor) -> Tensor:
    """(..., 4) (x1, y1, x2, y2) -> (..., 5) (cx, cy, x2 - x1, y2 - y1, 0).

    Unlike structures.hbox2rbox this keeps w and h as they are (no le90 swap for tall boxes):
    stage-1 deltas are measured against the horizontal RoI's own width and height.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, torch.zeros_like(x1)], -1)


def rescale_rboxes(boxes: Tensor, scale_x: float, scale_y: float) -> Tensor:
    """Scales (N, 5) rotated boxes by (scale_x, scale_y) about the origin.

    With unequal scales a rotated rectangle becomes a parallelogram; we keep the images of the
    box's two edge vectors as its new sides (exact when scale_x == scale_y).
    """
    x, y, w, h, t = boxes.unbind(-1)
    cos, sin = torch.cos(t), torch.sin(t)
    new_w = w * torch.hypot(scale_x * cos, scale_y * sin)
    new_h = h * torch.hypot(scale_x * sin, scale_y * cos)
    new_t = torch.atan2(scale_y * sin, scale_x * cos)
    return torch.stack([x * scale_x, y * scale_y, new_w, new_h, new_t], dim=-1)
