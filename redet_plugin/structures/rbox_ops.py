"""All rotated-box math: angle convention, polygons, enclosing horizontal boxes, rescaling.

Convention (le90, as mmrotate's `le90` and the ReDet configs):
- a rotated box is (cx, cy, w, h, theta), image coordinates (x right, y down), theta in radians;
- theta turns the box's w side from the +x axis towards +y, i.e. clockwise on screen
  (the default `clockwise=True` of mmcv's box_iou_rotated / nms_rotated);
- regularized boxes have w >= h and theta in [-pi/2, pi/2).
Corners (qbox, (..., 8) = x1 y1 ... x4 y4) go clockwise on screen, starting at the corner
(-w/2, -h/2) of the box frame, the order DOTA annotations use.
"""
import math
from typing import Union

import cv2
import numpy as np
import torch
from torch import Tensor

ArrayLike = Union[Tensor, np.ndarray]


def _check_last_dim(boxes: Tensor, size: int, name: str) -> None:
    if boxes.dim() < 1 or boxes.shape[-1] != size:
        raise ValueError(f"{name}: expected a tensor of shape (..., {size}), got {tuple(boxes.shape)}")


def norm_angle(theta: ArrayLike, start: float = -math.pi / 2, period: float = math.pi) -> ArrayLike:
    """Maps angles into [start, start + period); a rectangle repeats every pi radians."""
    return (theta - start) % period + start


def regularize_rboxes(boxes: Tensor, width_longer: bool = True) -> Tensor:
    """Returns le90 boxes: w >= h (when width_longer) and theta in [-pi/2, pi/2). Same rectangles."""
    _check_last_dim(boxes, 5, "regularize_rboxes(boxes)")
    ctr, w, h, theta = boxes[..., :2], boxes[..., 2], boxes[..., 3], boxes[..., 4]
    if width_longer:
        swap = w < h
        w, h = torch.where(swap, h, w), torch.where(swap, w, h)
        theta = torch.where(swap, theta + math.pi / 2, theta)
    theta = norm_angle(theta)
    return torch.cat([ctr, w[..., None], h[..., None], theta[..., None]], dim=-1)


def rbox2qbox(boxes: Tensor) -> Tensor:
    """(..., 5) rotated boxes -> (..., 8) corners x1 y1 x2 y2 x3 y3 x4 y4 (clockwise on screen)."""
    _check_last_dim(boxes, 5, "rbox2qbox(boxes)")
    ctr, w, h, theta = boxes[..., :2], boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos, sin = torch.cos(theta), torch.sin(theta)
    along_w = torch.cat([w / 2 * cos, w / 2 * sin], dim=-1)
    along_h = torch.cat([-h / 2 * sin, h / 2 * cos], dim=-1)
    corners = [ctr - along_w - along_h, ctr + along_w - along_h,
               ctr + along_w + along_h, ctr - along_w + along_h]
    return torch.cat(corners, dim=-1)


def qbox2rbox(qboxes: ArrayLike) -> Tensor:
    """(N, 8) quadrilaterals -> (N, 5) le90 rotated boxes: the minimum-area enclosing rectangle.

    Exact (up to float32 rounding in OpenCV) for quadrilaterals that are rectangles.
    """
    as_tensor = torch.as_tensor(qboxes)
    _check_last_dim(as_tensor, 8, "qbox2rbox(qboxes)")
    lead_shape = as_tensor.shape[:-1]
    points = as_tensor.detach().reshape(-1, 4, 2).cpu().double().numpy()
    out = np.zeros((points.shape[0], 5), dtype=np.float64)
    for i, quad in enumerate(points):
        if not np.isfinite(quad).all():
            raise ValueError(f"qbox2rbox(qboxes): row {i} has non-finite coordinates {quad.ravel().tolist()}")
        # Fit on centred points: float32 inside OpenCV then loses nothing to large offsets.
        mean = quad.mean(axis=0)
        rect = cv2.minAreaRect((quad - mean).astype(np.float32))
        corners = cv2.boxPoints(rect).astype(np.float64)
        # Read w and theta from the corners, independent of OpenCV's angle convention.
        edge_w, edge_h = corners[1] - corners[0], corners[2] - corners[1]
        out[i] = (rect[0][0] + mean[0], rect[0][1] + mean[1], np.hypot(*edge_w), np.hypot(*edge_h),
                  math.atan2(edge_w[1], edge_w[0]))
    result = torch.from_numpy(out).to(dtype=as_tensor.dtype if as_tensor.is_floating_point()
                                      else torch.float32, device=as_tensor.device)
    return regularize_rboxes(result).reshape(*lead_shape, 5)


def rbox2hbox(boxes: Tensor) -> Tensor:
    """(..., 5) rotated boxes -> (..., 4) enclosing horizontal boxes x1 y1 x2 y2."""
    _check_last_dim(boxes, 5, "rbox2hbox(boxes)")
    ctr, w, h, theta = boxes[..., :2], boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos, sin = torch.cos(theta).abs(), torch.sin(theta).abs()
    half = torch.cat([w * cos + h * sin, w * sin + h * cos], dim=-1) / 2
    return torch.cat([ctr - half, ctr + half], dim=-1)


def hbox2rbox(hboxes: Tensor) -> Tensor:
    """(..., 4) horizontal boxes x1 y1 x2 y2 -> (..., 5) le90 rotated boxes."""
    _check_last_dim(hboxes, 4, "hbox2rbox(hboxes)")
    ctr = (hboxes[..., :2] + hboxes[..., 2:]) / 2
    wh = hboxes[..., 2:] - hboxes[..., :2]
    theta = wh.new_zeros(wh.shape[:-1] + (1,))
    return regularize_rboxes(torch.cat([ctr, wh, theta], dim=-1))


def hbox_as_prior(hboxes: Tensor) -> Tensor:
    """(..., 4) (x1, y1, x2, y2) -> (..., 5) (cx, cy, x2 - x1, y2 - y1, 0).

    Unlike hbox2rbox this keeps w and h as they are (no le90 swap for tall boxes): stage-1
    deltas are measured against the horizontal RoI's own width and height.
    """
    _check_last_dim(hboxes, 4, "hbox_as_prior(hboxes)")
    x1, y1, x2, y2 = hboxes.unbind(-1)
    return torch.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1, torch.zeros_like(x1)], -1)


def rescale_rboxes(boxes: Tensor, scale_x: float, scale_y: float) -> Tensor:
    """Scales (..., 5) rotated boxes by (scale_x, scale_y) about the origin; le90 result.

    Unequal scales turn a rectangle into a parallelogram. We keep the parallelogram's longer side
    (its direction and length) and its area: the other side is the parallelogram's height over
    the kept one. Exact for equal scales and for axis-aligned boxes. (Keeping both scaled side
    lengths overstates the area; mmrotate's RotatedBoxes.rescale_ always keeps the h side's
    direction, which turns long thin boxes away from their true direction: on random boxes and
    scales in [0.3, 3] its worst IoU with the true parallelogram was near 0, this one's 0.6.)
    """
    _check_last_dim(boxes, 5, "rescale_rboxes(boxes)")
    for name, value in (("scale_x", scale_x), ("scale_y", scale_y)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"rescale_rboxes: {name} must be a positive finite number, got {value}")
    x, y, w, h, theta = boxes.unbind(-1)
    cos, sin = torch.cos(theta), torch.sin(theta)
    # The images of the box's w side (cos, sin) * w and h side (-sin, cos) * h.
    w_len = w * torch.hypot(scale_x * cos, scale_y * sin)
    h_len = h * torch.hypot(scale_x * sin, scale_y * cos)
    area = w * h * (scale_x * scale_y)
    keep_w = w_len >= h_len
    tiny = torch.finfo(boxes.dtype).tiny  # degenerate boxes: 0 area over 0 length stays 0
    new_w = torch.where(keep_w, w_len, area / h_len.clamp_min(tiny))
    new_h = torch.where(keep_w, area / w_len.clamp_min(tiny), h_len)
    # theta of the kept side: the w side's angle, or the angle whose h side is the scaled h side.
    new_theta = torch.where(keep_w, torch.atan2(scale_y * sin, scale_x * cos),
                            torch.atan2(scale_x * sin, scale_y * cos))
    return regularize_rboxes(torch.stack([x * scale_x, y * scale_y, new_w, new_h, new_theta], -1))
