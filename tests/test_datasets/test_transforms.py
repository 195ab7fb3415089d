"""Rotated boxes follow the image through RandomRotate90, RandomRotate and mmdet's RandomFlip/Resize."""
import math
import random

import cv2
import numpy as np
import pytest
import torch
from mmdet.datasets.transforms import RandomFlip, Resize

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import RandomRotate, RandomRotate90
from redet_plugin.structures import RotatedBoxes, qbox2rbox, rbox2qbox


def paint(shape, rboxes):
    """Image with box i filled in channel i (mmdet coordinates: pixel centres at +0.5)."""
    img = np.zeros(shape + (3,), np.uint8)
    for i, box in enumerate(rboxes):
        quad = rbox2qbox(torch.tensor([box], dtype=torch.float64)).reshape(4, 2).numpy() - 0.5
        channel = np.zeros(shape, np.uint8)
        cv2.fillPoly(channel, [np.round(quad * 16).astype(np.int32)], 255, cv2.LINE_AA, 4)
        img[..., i] = channel
    return img


def boxes_seen(img, count):
    """The rotated box around the pixels of each channel, in mmdet coordinates."""
    out = []
    for i in range(count):
        ys, xs = np.nonzero(img[..., i] > 127)
        quad = cv2.boxPoints(cv2.minAreaRect(np.stack([xs, ys], 1).astype(np.float32))) + 0.5
        out.append(qbox2rbox(quad.reshape(1, 8))[0])
    return torch.stack(out)


def make_results(shape, rboxes):
    return dict(img=paint(shape, rboxes), img_shape=shape, ori_shape=shape,
                gt_bboxes=RotatedBoxes(torch.tensor(rboxes, dtype=torch.float32)),
                gt_bboxes_labels=np.arange(len(rboxes)), gt_ignore_flags=np.array([False, True][:len(rboxes)]))


def assert_boxes_follow_image(results, count, side_atol=2.5):
    """Centres within 0.8 px, sides within side_atol px (pixel staircase), angles within 0.05 rad
    (the boxes are elongated, so their angles are unique)."""
    seen = boxes_seen(results['img'], count).float()
    boxes = results['gt_bboxes'].tensor
    assert torch.allclose(boxes[:, :2], seen[:, :2], atol=0.8), (boxes, seen)
    assert torch.allclose(boxes[:, 2:4], seen[:, 2:4], atol=side_atol), (boxes, seen)
    turn = torch.remainder(boxes[:, 4] - seen[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    assert turn.abs().max() < 0.05, (boxes, seen)


BOXES = [[40.0, 30.0, 36.0, 12.0, 0.5], [80.0, 60.0, 20.0, 10.0, -1.0]]


@pytest.mark.parametrize('turns', [1, 2, 3])
def test_random_rotate90_non_square(turns):
    results = make_results((90, 120), BOXES)
    out = RandomRotate90(prob=1.0, turns=(turns,)).transform(results)
    assert out['img_shape'] == ((120, 90) if turns % 2 else (90, 120)) and out['rotate90_turns'] == turns
    assert_boxes_follow_image(out, 2)
    assert out['gt_bboxes_labels'].tolist() == [0, 1]


@pytest.mark.parametrize('seed', range(3))
def test_random_rotate_arbitrary_angle(seed):
    random.seed(seed)
    results = make_results((100, 120), [[60.0, 50.0, 36.0, 12.0, 0.3], [50.0, 45.0, 14.0, 8.0, 1.2]])
    out = RandomRotate(prob=1.0, max_angle=180).transform(results)
    assert out['img_shape'] == (100, 120) and out['img'].shape == (100, 120, 3)
    assert abs(out['rotate_angle']) <= 180
    assert_boxes_follow_image(out, 2)


def test_random_rotate_drops_objects_that_leave(monkeypatch):
    monkeypatch.setattr(random, 'uniform', lambda low, high: 45.0)  # (95, 95) -> (50, 113.6): outside
    results = make_results((100, 100), [[50.0, 50.0, 20.0, 10.0, 0.0], [95.0, 95.0, 6.0, 4.0, 0.0]])
    out = RandomRotate(prob=1.0, max_angle=180).transform(results)
    assert out['rotate_angle'] == 45.0
    assert len(out['gt_bboxes']) == 1
    assert out['gt_bboxes_labels'].tolist() == [0] and out['gt_ignore_flags'].tolist() == [False]
    assert out['gt_bboxes'].tensor[0].tolist() == pytest.approx([50, 50, 20, 10, math.pi / 4], abs=1e-4)


@pytest.mark.parametrize('direction', ['horizontal', 'vertical', 'diagonal'])
def test_mmdet_random_flip(direction):
    out = RandomFlip(prob=1.0, direction=direction).transform(make_results((90, 120), BOXES))
    assert_boxes_follow_image(out, 2)


def test_mmdet_resize_keep_ratio():
    results = make_results((90, 120), BOXES)
    out = Resize(scale=(240, 180), keep_ratio=True, clip_object_border=False).transform(results)
    assert out['img_shape'] == (180, 240)
    assert_boxes_follow_image(out, 2, side_atol=5.0)  # the staircase doubles too


def test_probability_zero_does_nothing_and_bad_arguments():
    results = make_results((90, 120), BOXES)
    before = results['gt_bboxes'].tensor.clone()
    assert torch.equal(RandomRotate90(prob=0.0).transform(results)['gt_bboxes'].tensor, before)
    assert torch.equal(RandomRotate(prob=0.0).transform(results)['gt_bboxes'].tensor, before)
    with pytest.raises(ValueError, match=r'prob must be in \[0, 1\], got 2'):
        RandomRotate90(prob=2)
    with pytest.raises(ValueError, match='turns'):
        RandomRotate90(turns=(4,))
    with pytest.raises(ValueError, match='max_angle'):
        RandomRotate(max_angle=0)
    with pytest.raises(ValueError, match='interpolation'):
        RandomRotate(interpolation='lanczos9')
    hboxes = dict(img=np.zeros((8, 8, 3), np.uint8), gt_bboxes=torch.zeros(1, 4))
    with pytest.raises(TypeError, match="box_type='redet_rbox'"):
        RandomRotate90(prob=1.0).transform(hboxes)


def test_masks_are_refused_rather_than_left_behind():
    results = dict(make_results((90, 120), BOXES), gt_seg_map=np.zeros((90, 120), np.uint8))
    with pytest.raises(ValueError, match=r"also hold \['gt_seg_map'\]"):
        RandomRotate(prob=1.0).transform(results)
