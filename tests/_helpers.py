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


def pairwise_iou(boxes):
    """(N, N) IoU of (N, 5) rotated boxes (mmcv's box_iou_rotated) or (N, 4) horizontal ones."""
    if boxes.shape[1] == 5:
        from mmcv.ops import box_iou_rotated
        return box_iou_rotated(boxes, boxes)
    lt = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = (boxes[:, 2:] - boxes[:, :2]).prod(-1)
    return inter / (area[:, None] + area[None, :] - inter)


def safe_iou_threshold(boxes, labels, near, margin=1e-5):
    """An IoU threshold within 0.05 of `near` that no pair of boxes of one label has an IoU
    within `margin` of. Two correct kernels round differently (a GPU fuses multiply-adds and has
    its own sin and cos), which flips the decision for an IoU a few ulp from the threshold; at
    this threshold none can flip, so their keep masks must be equal."""
    groups = [torch.arange(boxes.shape[0])] if labels is None else [
        (labels == c).nonzero().flatten() for c in labels.unique()]
    values = [torch.tensor([near - 0.05, near + 0.05])]
    for index in groups:
        group = boxes[index].float()
        iou = pairwise_iou(group).triu(1).flatten().cpu()
        values.append(iou[(iou > near - 0.05) & (iou < near + 0.05)])
    values = torch.cat(values).double().sort().values
    gaps = values[1:] - values[:-1]
    widest = int(gaps.argmax())
    assert gaps[widest] > 2 * margin, 'no IoU threshold far enough from every pair'
    return float(values[widest] + values[widest + 1]) / 2
