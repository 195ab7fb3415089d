"""Rotation augmentations for rotated boxes (mmdet's Resize/RandomFlip/Pad already handle RotatedBoxes).

Coordinates are continuous, mmdet's convention: pixel (i, j) covers [j, j+1) x [i, i+1), so an
image of width W spans x in [0, W] and its centre is (W/2, H/2). The boxes of the results
dict ('gt_bboxes', a RotatedBoxes) are rotated with the image; objects whose centre leaves the
image are dropped together with their labels and ignore flags.
"""
import math
import random
from typing import Optional, Sequence

import cv2
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmdet.structures.bbox import BaseBoxes

from redet_plugin.utils.registration import register

from ..structures import regularize_rboxes

INSTANCE_KEYS = ('gt_bboxes', 'gt_bboxes_labels', 'gt_ignore_flags')


def _check_prob(prob: float, name: str) -> None:
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f'{name}: prob must be in [0, 1], got {prob}')


def _keep_instances(results: dict, keep: torch.Tensor) -> None:
    """Keeps the instances where `keep` (bool, one per box) is True, in every instance field."""
    keep_np = keep.cpu().numpy()
    for key in INSTANCE_KEYS:
        if key in results:
            value = results[key]
            results[key] = value[keep] if isinstance(value, BaseBoxes) else value[keep_np]


def _rotated_boxes(results: dict, name: str):
    unsupported = [key for key in ('gt_masks', 'gt_seg_map') if key in results]
    if unsupported:  # they would silently stop matching the image
        raise ValueError(f'{name}: rotates the image and gt_bboxes only, but the results also hold {unsupported}')
    boxes = results.get('gt_bboxes')
    # ours ('redet_rbox') or mmrotate's ('rbox'): both (cx, cy, w, h, theta), theta in radians
    if boxes is not None and not (isinstance(boxes, BaseBoxes) and boxes.box_dim == 5):
        raise TypeError(f"{name}: results['gt_bboxes'] must be rotated boxes (load annotations with "
                        f"box_type='redet_rbox'), got {type(boxes).__name__}")
    return boxes


@register(TRANSFORMS)
class RandomRotate90(BaseTransform):
    """With probability `prob`, turns the image by k quarter turns clockwise, k drawn from `turns`.

    Non-square images swap height and width. Boxes turn exactly (no object leaves the image).
    """

    def __init__(self, prob: float = 0.5, turns: Sequence[int] = (1, 2, 3)) -> None:
        _check_prob(prob, 'RandomRotate90')
        if not turns or any(int(k) % 4 == 0 for k in turns):
            raise ValueError(f'RandomRotate90: turns must be non-empty quarter-turn counts not '
                             f'divisible by 4, got {turns}')
        self.prob, self.turns = prob, tuple(int(k) % 4 for k in turns)

    def transform(self, results: dict) -> dict:
        if random.random() >= self.prob:
            return results
        boxes = _rotated_boxes(results, 'RandomRotate90')
        k = random.choice(self.turns)
        for _ in range(k):
            height = results['img'].shape[0]
            results['img'] = np.ascontiguousarray(np.rot90(results['img'], k=-1))
            if boxes is not None:  # one clockwise quarter turn: (x, y) -> (H - y, x)
                t = boxes.tensor.clone()
                t[..., 0], t[..., 1] = height - boxes.tensor[..., 1], boxes.tensor[..., 0]
                t[..., 4] += math.pi / 2
                boxes = type(boxes)(regularize_rboxes(t), clone=False)
        if boxes is not None:
            results['gt_bboxes'] = boxes
        results['img_shape'] = results['img'].shape[:2]
        results['rotate90_turns'] = k
        return results

    def __repr__(self) -> str:
        return f'{type(self).__name__}(prob={self.prob}, turns={self.turns})'


@register(TRANSFORMS)
class RandomRotate(BaseTransform):
    """With probability `prob`, rotates the image about its centre by an angle drawn uniformly
    from [-max_angle, max_angle] degrees (positive = clockwise), keeping its size.

    Uncovered corners get `pad_val`. Objects whose centre leaves the image are dropped.
    `rect_obj_labels`: labels of objects annotated as upright rectangles whatever they look like
    (DOTA's storage-tank 9 and roundabout 11); an image holding any of them is turned by a
    multiple of 90 degrees only (drawn from 90, 180, -90, -180), as mmrotate's RandomRotate
    does, so that their boxes stay upright.
    """

    RECT_ANGLES = (90.0, 180.0, -90.0, -180.0)

    def __init__(self, prob: float = 0.5, max_angle: float = 180.0, pad_val: float = 0,
                 interpolation: str = 'bilinear',
                 rect_obj_labels: Optional[Sequence[int]] = None) -> None:
        _check_prob(prob, 'RandomRotate')
        if not 0 < max_angle <= 180:
            raise ValueError(f'RandomRotate: max_angle must be in (0, 180] degrees, got {max_angle}')
        self.rect_obj_labels = None if rect_obj_labels is None else [int(k) for k in rect_obj_labels]
        flags = dict(nearest=cv2.INTER_NEAREST, bilinear=cv2.INTER_LINEAR, bicubic=cv2.INTER_CUBIC)
        if interpolation not in flags:
            raise ValueError(f'RandomRotate: interpolation must be one of {list(flags)}, got {interpolation!r}')
        self.prob, self.max_angle, self.pad_val = prob, max_angle, pad_val
        self.interpolation, self._flag = interpolation, flags[interpolation]

    def transform(self, results: dict) -> dict:
        if random.random() >= self.prob:
            return results
        boxes = _rotated_boxes(results, 'RandomRotate')
        angle = random.uniform(-self.max_angle, self.max_angle)
        labels = results.get('gt_bboxes_labels')
        if self.rect_obj_labels and labels is not None and np.isin(np.asarray(labels), self.rect_obj_labels).any():
            angle = random.choice(self.RECT_ANGLES)
        img = results['img']
        height, width = img.shape[:2]
        # OpenCV: positive angle = counter-clockwise on screen, rotation about pixel-index centre.
        matrix = cv2.getRotationMatrix2D(((width - 1) / 2, (height - 1) / 2), -angle, 1.0)
        results['img'] = cv2.warpAffine(img, matrix, (width, height), flags=self._flag,
                                        borderMode=cv2.BORDER_CONSTANT, borderValue=self.pad_val)
        if boxes is not None:
            boxes.rotate_((width / 2, height / 2), angle)
            results['gt_bboxes'] = boxes
            _keep_instances(results, boxes.is_inside((height, width)))
        results['rotate_angle'] = angle
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(prob={self.prob}, max_angle={self.max_angle}, '
                f'pad_val={self.pad_val}, interpolation={self.interpolation!r}, '
                f'rect_obj_labels={self.rect_obj_labels})')
