"""Rotated box coders (hbox->rbox, rbox->rbox) and the rotated IoU calculator."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from mmdet.registry import TASK_UTILS
from shapely.geometry import Polygon

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures import rbox2hbox, regularize_rboxes


def random_rboxes(n, seed, le90=True):
    g = torch.Generator().manual_seed(seed)
    boxes = torch.cat([torch.rand(n, 2, generator=g) * 200, 5 + torch.rand(n, 2, generator=g) * 60,
                       (torch.rand(n, 1, generator=g) - 0.5) * 2 * math.pi], 1).double()
    return regularize_rboxes(boxes) if le90 else boxes


def same_rectangles(a, b, atol=1e-6):
    """Equal as rectangles: le90 forms agree (theta compared modulo pi)."""
    a, b = regularize_rboxes(a), regularize_rboxes(b)
    dt = torch.remainder(a[:, 4] - b[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    square = (a[:, 2] - a[:, 3]).abs() < 1e-4  # squares: angle only defined modulo pi/2
    dt = torch.where(square, torch.remainder(dt + math.pi / 4, math.pi / 2) - math.pi / 4, dt)
    return torch.allclose(a[:, :4], b[:, :4], atol=atol) and dt.abs().max() < atol


def polygon(box):
    x, y, w, h, t = box.tolist()
    c, s = math.cos(t), math.sin(t)
    return Polygon([(x + c * dx - s * dy, y + s * dx + c * dy)
                    for dx, dy in ((-w / 2, -h / 2), (w / 2, -h / 2), (w / 2, h / 2), (-w / 2, h / 2))])


@pytest.mark.parametrize('proj_xy', [True, False])
@pytest.mark.parametrize('norm_factor', [None, 2])
def test_rbox_coder_round_trip(proj_xy, norm_factor):
    coder = TASK_UTILS.build(dict(type='RedetDeltaXYWHTRBBoxCoder', proj_xy=proj_xy,
                                  norm_factor=norm_factor))
    priors, targets = random_rboxes(64, 0, le90=False), random_rboxes(64, 1, le90=False)
    deltas = coder.encode(priors, targets)
    assert deltas.shape == (64, 5)
    assert same_rectangles(coder.decode(priors.double(), deltas.double()), targets, atol=1e-4)


def test_hbox_coder_round_trip_and_edge_swap():
    coder = TASK_UTILS.build(dict(type='RedetDeltaXYWHTHBBoxCoder'))
    targets = random_rboxes(64, 2)
    priors = rbox2hbox(targets) + torch.randn(64, 4, dtype=torch.double)
    deltas = coder.encode(priors, targets)
    assert same_rectangles(coder.decode(priors, deltas.double()), targets, atol=1e-4)
    # edge swap: the angle delta is the smallest turn, at most pi/4 (= 0.25 after norm_factor 2
    # and std 0.1 -> 2.5)
    assert deltas[:, 4].abs().max() <= 0.25 / 0.1 + 1e-5


def test_decode_returns_le90_and_one_box_per_class():
    coder = TASK_UTILS.build(dict(type='RedetDeltaXYWHTRBBoxCoder'))
    priors = random_rboxes(10, 3)
    boxes = coder.decode(priors, torch.randn(10, 5 * 4, dtype=torch.double)).view(10, 4, 5)
    assert (boxes[..., 2] >= boxes[..., 3]).all()
    assert ((boxes[..., 4] >= -math.pi / 2) & (boxes[..., 4] < math.pi / 2)).all()


def test_coder_bad_inputs():
    coder = TASK_UTILS.build(dict(type='RedetDeltaXYWHTHBBoxCoder'))
    with pytest.raises(ValueError, match=r'expected priors \(N, 4\) and targets \(N, 5\)'):
        coder.encode(torch.rand(3, 5), torch.rand(3, 5))
    with pytest.raises(ValueError, match="angle_version: only 'le90'"):
        TASK_UTILS.build(dict(type='RedetDeltaXYWHTRBBoxCoder', angle_version='oc'))
    with pytest.raises(ValueError, match='target_means/target_stds: expected 5 values'):
        TASK_UTILS.build(dict(type='RedetDeltaXYWHTRBBoxCoder', target_stds=(1, 1, 1, 1)))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_rotated_iou_matches_shapely(seed):
    iou = TASK_UTILS.build(dict(type='RedetRBboxOverlaps2D'))
    a, b = random_rboxes(4, seed).float(), random_rboxes(5, seed + 1).float()
    b[0] = a[0]  # one exact match
    got = iou(a, b)
    want = torch.tensor([[polygon(p).intersection(polygon(q)).area / polygon(p).union(polygon(q)).area
                          for q in b] for p in a])
    assert torch.allclose(got, want, atol=1e-3)
    assert torch.allclose(iou(a, b[:4], is_aligned=True), torch.diagonal(want[:, :4]), atol=1e-3)


def test_rotated_iou_empty_and_bad_inputs():
    iou = TASK_UTILS.build(dict(type='RedetRBboxOverlaps2D'))
    assert iou(torch.zeros(0, 5), torch.rand(3, 5)).shape == (0, 3)
    assert iou(torch.rand(2, 6), torch.zeros(0, 5)).shape == (2, 0)
    with pytest.raises(ValueError, match=r'bboxes2: expected \(N, 5\) or \(N, 6\)'):
        iou(torch.rand(2, 5), torch.rand(2, 4))
