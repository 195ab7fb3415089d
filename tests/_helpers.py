"""Small helpers shared by the tests."""
import contextlib
import math

import torch


@contextlib.contextmanager
def deterministic_mode():
    """torch.use_deterministic_algorithms(True) for the block, restoring the previous setting."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


@contextlib.contextmanager
def full_fp32():
    """No TF32 in cuDNN convolutions or CUDA matmuls for the block (torch lets cuDNN use it by
    default): two fp32 models compared on a GPU then differ by float rounding, not by TF32's 10-bit
    mantissa amplified through a deep network."""
    previous = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = previous


def random_rotated_boxes(n, generator=None, dtype=torch.float32, spread=200.0, clusters=None):
    """(n, 5) le90 boxes, clustered so that many pairs overlap; scores without ties."""
    g = generator
    clusters = clusters or max(1, n // 6)
    centres = torch.rand(clusters, 2, generator=g) * spread
    pick = torch.randint(0, clusters, (n,), generator=g)
    ctr = centres[pick] + torch.randn(n, 2, generator=g) * 4
    wh = torch.rand(n, 2, generator=g) * 30 + 2
    theta = (torch.rand(n, 1, generator=g) - 0.5) * math.pi
    theta = torch.where(torch.rand(n, 1, generator=g) < 0.2, torch.zeros_like(theta), theta)
    boxes = torch.cat([ctr, wh, theta], dim=1).to(dtype)
    scores = torch.randperm(n, generator=g).to(dtype) / max(n, 1) + 0.001
    return boxes, scores


def random_horizontal_boxes(n, generator=None, dtype=torch.float32):
    rboxes, scores = random_rotated_boxes(n, generator, torch.float32)
    x1y1 = rboxes[:, :2] - rboxes[:, 2:4] / 2
    return torch.cat([x1y1, x1y1 + rboxes[:, 2:4]], dim=1).to(dtype), scores.to(dtype)
