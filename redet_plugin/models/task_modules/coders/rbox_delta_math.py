"""Delta encoding between prior rotated boxes and target rotated boxes, shared by both coders.

deltas = (dx, dy, dw, dh, dtheta):
  dx, dy  centre offset over the prior's w, h, measured along the prior's own axes when
          `proj_xy` (stage 2 of the RoI Transformer), along the image axes otherwise;
  dw, dh  log size ratios;
  dtheta  angle difference (divided by norm_factor * pi when norm_factor is set).
With `edge_swap` the target is written with whichever of its two edge orders needs the smaller
rotation from the prior (a w x h box at theta equals an h x w box at theta + pi/2).
"""
import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from redet_plugin.structures import norm_angle, regularize_rboxes
from .delta_normalization import denormalize_deltas, normalize_deltas


def check_coder_args(angle_version: str, target_means: Sequence[float],
                     target_stds: Sequence[float]) -> None:
    """The argument checks both rotated-box coders share."""
    if angle_version != 'le90':
        raise ValueError(f"angle_version: only 'le90' is supported, got {angle_version!r}")
    if len(target_means) != 5 or len(target_stds) != 5:
        raise ValueError(f'target_means/target_stds: expected 5 values each, got '
                         f'{len(target_means)} and {len(target_stds)}')


def encode_rbox_deltas(priors: Tensor, targets: Tensor, means: Sequence[float],
                       stds: Sequence[float], norm_factor: Optional[float], edge_swap: bool,
                       proj_xy: bool) -> Tensor:
    priors, targets = priors.float(), regularize_rboxes(targets.float())
    px, py, pw, ph, pt = priors.unbind(-1)
    gx, gy, gw, gh, gt = targets.unbind(-1)
    ox, oy = gx - px, gy - py
    if proj_xy:
        cos, sin = torch.cos(pt), torch.sin(pt)
        dx = (cos * ox + sin * oy) / pw
        dy = (-sin * ox + cos * oy) / ph
    else:
        dx, dy = ox / pw, oy / ph
    dt = norm_angle(gt - pt)
    if edge_swap:
        dt_swapped = norm_angle(gt - pt + math.pi / 2)
        use_swapped = dt_swapped.abs() < dt.abs()
        gw, gh = torch.where(use_swapped, gh, gw), torch.where(use_swapped, gw, gh)
        dt = torch.where(use_swapped, dt_swapped, dt)
    if norm_factor:
        dt = dt / (norm_factor * math.pi)
    deltas = torch.stack([dx, dy, torch.log(gw / pw), torch.log(gh / ph), dt], dim=-1)
    return normalize_deltas(deltas, means, stds)


def decode_rbox_deltas(priors: Tensor, deltas: Tensor, means: Sequence[float],
                       stds: Sequence[float], norm_factor: Optional[float], proj_xy: bool,
                       wh_ratio_clip: float, max_shape: Optional[Sequence[int]] = None) -> Tensor:
    """Inverse of encode_rbox_deltas; returns le90 boxes. deltas may hold several boxes per
    prior: (N, 5 * k) with priors (N, 5). Computed in at least float32 (under AMP the deltas
    come in float16, too coarse for image coordinates). With max_shape (H, W, ...) the centres
    are clamped to [0, W - 1] x [0, H - 1], as mmrotate's and ReDet's rotated-prior coder does."""
    num = priors.shape[0]
    dtype = torch.promote_types(deltas.dtype, torch.float32)
    deltas = deltas.to(dtype).reshape(num, -1, 5)
    deltas = denormalize_deltas(deltas, means, stds)
    dx, dy, dw, dh, dt = deltas.unbind(-1)
    px, py, pw, ph, pt = (v[:, None] for v in priors.to(dtype).unbind(-1))
    max_log_ratio = abs(math.log(wh_ratio_clip))
    dw, dh = dw.clamp(-max_log_ratio, max_log_ratio), dh.clamp(-max_log_ratio, max_log_ratio)
    if proj_xy:
        cos, sin = torch.cos(pt), torch.sin(pt)
        gx = px + dx * pw * cos - dy * ph * sin
        gy = py + dx * pw * sin + dy * ph * cos
    else:
        gx, gy = px + dx * pw, py + dy * ph
    if max_shape is not None:
        gx, gy = gx.clamp(0, max_shape[1] - 1), gy.clamp(0, max_shape[0] - 1)
    if norm_factor:
        dt = dt * norm_factor * math.pi
    boxes = torch.stack([gx, gy, pw * dw.exp(), ph * dh.exp(), pt + dt], dim=-1)
    return regularize_rboxes(boxes).reshape(num, -1)
