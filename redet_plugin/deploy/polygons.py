"""Rotated boxes (cx, cy, w, h, theta radians; le90) as their four corners, in torch alone (the
deploy layer's copy of structures.rbox_ops.rbox2qbox, whose package loads mmdet)."""
import torch
from torch import Tensor


def rbox_corners(boxes: Tensor) -> Tensor:
    """(..., 5) rotated boxes -> (..., 8) corners x1 y1 x2 y2 x3 y3 x4 y4 (clockwise on screen,
    DOTA's order)."""
    if boxes.shape[-1] != 5:
        raise ValueError(f'boxes: expected (..., 5) rotated boxes, got shape {tuple(boxes.shape)}')
    centre, w, h, theta = boxes[..., :2], boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos, sin = torch.cos(theta), torch.sin(theta)
    along_w = torch.cat([w / 2 * cos, w / 2 * sin], dim=-1)
    along_h = torch.cat([-h / 2 * sin, h / 2 * cos], dim=-1)
    return torch.cat([centre - along_w - along_h, centre + along_w - along_h,
                      centre + along_w + along_h, centre - along_w + along_h], dim=-1)
