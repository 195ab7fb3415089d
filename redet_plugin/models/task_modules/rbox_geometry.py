"""Small rotated-box helpers the coders and heads need: le90 form, enclosing hbox, rescale.

Rotated boxes are (cx, cy, w, h, theta) tensors, theta in radians. le90 means w >= h and
theta in [-pi/2, pi/2).
"""
import math

import torch
from torch import Tensor


def wrap_angle(theta: Tensor) -> Tensor:
    """Wraps angles into [-pi/2, pi/2) (a rotated box is symmetric under a half turn)."""
    return torch.remainder(theta + math.pi / 2, math.pi) - math.pi / 2


def to_le90(boxes: Tensor) -> Tensor:
    """Rewrites (..., 5) rotated boxes so that w >= h and theta lies in [-pi/2, pi/2)."""
    x, y, w, h, t = boxes.unbind(-1)
    swap = w < h
    w, h = torch.where(swap, h, w), torch.where(swap, w, h)
    t = wrap_angle(torch.where(swap, t + math.pi / 2, t))
    return torch.stack([x, y, w, h, t], dim=-1)


def rbox_to_enclosing_hbox(boxes: Tensor) -> Tensor:
    """(..., 5) rotated boxes -> (..., 4) smallest axis-aligned (x1, y1, x2, y2) boxes around them."""
    x, y, w, h, t = boxes.unbind(-1)
    cos, sin = torch.cos(t).abs(), torch.sin(t).abs()
    half_w = (w * cos + h * sin) / 2
    half_h = (w * sin + h * cos) / 2
    return torch.stack([x - half_w, y - half_h, x + half_w, y + half_h], dim=-1)


def hbox_to_rbox(boxes: Tensor) -> Tensor:
    """(..., 4) (x1, y1, x2, y2) -> (..., 5) (cx, cy, w, h, 0), keeping w and h as they are."""
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
