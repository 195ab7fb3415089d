"""Flows whose depth-aware projection leaves large holes (plain torch: the tests and
benchmarks/sanitize_depth_flow_projection.py use them)."""
import torch

KINDS = ["half", "single", "none", "borders", "bands"]


def hole_case(kind, batch, height, width, seed=0, dtype=torch.float32):
    """flow (t = 1) and depth whose projection leaves large holes of the given kind."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(height, dtype=torch.float32),
                            torch.arange(width, dtype=torch.float32), indexing="ij")
    noise = 0.3 * torch.randn(batch, 2, height, width, generator=g)
    off = 10.0 * max(height, width) + 10  # lands outside the image
    flow = torch.zeros(batch, 2, height, width)
    if kind == "half":  # everything moves right by half the width: the left half is empty
        flow[:, 0] = width / 2
        flow = flow + noise
    elif kind == "single":  # one source pixel stays (reaching up to four targets), the rest leave
        flow[:, 0] = off
        flow[:, :, height // 3, width // 2] = 0.25
    elif kind == "none":  # every pixel leaves: all holes, nothing to fill from
        flow[:, 0] = off
    elif kind == "borders":  # contraction to the centre: holes along all four borders
        flow[:, 0] = 0.6 * ((width - 1) / 2 - xs)
        flow[:, 1] = 0.6 * ((height - 1) / 2 - ys)
        flow = flow + noise
    elif kind == "bands":  # bands of 37 columns and 23 rows leave: long runs in both directions
        leave = ((xs // 37) % 2 == 1) | ((ys // 23) % 2 == 1)
        flow[:, 0] = torch.where(leave, torch.full_like(xs, off), torch.zeros_like(xs))
        flow = flow + noise
    else:
        raise ValueError(kind)
    depth = 0.5 + 4 * torch.rand(batch, 1, height, width, generator=g)
    return flow.to(dtype), depth.to(dtype)
