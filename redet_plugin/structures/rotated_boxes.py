"""RotatedBoxes: mmdet's BaseBoxes for (cx, cy, w, h, theta) boxes, registered as box type 'redet_rbox'.

Registering the type lets mmdet's own transforms (Resize, RandomFlip, Pad, ...), InstanceData and
`get_box_type('redet_rbox')` (e.g. `LoadAnnotations(box_type='redet_rbox')`) work on rotated boxes.
The angle convention (le90, clockwise on screen) is documented in rbox_ops.py.
"""
import math
import warnings
from typing import Tuple, Union

import cv2
import numpy as np
import torch
from mmdet.structures.bbox import (BaseBoxes, register_box,
                                   register_box_converter)
from mmdet.structures.mask import BitmapMasks, PolygonMasks
from torch import BoolTensor, Tensor

from .rbox_ops import (hbox2rbox, qbox2rbox, rbox2hbox, rbox2qbox, regularize_rboxes,
                       rescale_rboxes)


@register_box(name='redet_rbox')
class RotatedBoxes(BaseBoxes):
    """Rotated boxes of shape (..., 5): (cx, cy, w, h, theta in radians), le90 convention.

    Transforms keep the convention: after flips and rotations boxes are regularized
    (w >= h, theta in [-pi/2, pi/2)).
    """

    box_dim: int = 5

    def regularize_boxes(self, width_longer: bool = True) -> Tensor:
        """Returns the le90-regularized tensor (does not modify the boxes)."""
        return regularize_rboxes(self.tensor, width_longer=width_longer)

    def regularize_(self, width_longer: bool = True) -> None:
        self.tensor = regularize_rboxes(self.tensor, width_longer=width_longer)

    # ---- geometry properties -------------------------------------------------------------
    @property
    def centers(self) -> Tensor:
        return self.tensor[..., :2]

    @property
    def areas(self) -> Tensor:
        return self.tensor[..., 2] * self.tensor[..., 3]

    @property
    def widths(self) -> Tensor:
        return self.tensor[..., 2]

    @property
    def heights(self) -> Tensor:
        return self.tensor[..., 3]

    @property
    def corners(self) -> Tensor:
        """(..., 4, 2) corner points, clockwise on screen."""
        qboxes = rbox2qbox(self.tensor)
        return qboxes.reshape(*qboxes.shape[:-1], 4, 2)

    # ---- in-place transforms used by mmdet's data transforms -----------------------------
    def flip_(self, img_shape: Tuple[int, int], direction: str = 'horizontal') -> None:
        if direction not in ('horizontal', 'vertical', 'diagonal'):
            raise ValueError(f"RotatedBoxes.flip_: direction must be 'horizontal', 'vertical' or "
                             f"'diagonal', got {direction!r}")
        boxes = self.tensor.clone()
        if direction in ('horizontal', 'diagonal'):
            boxes[..., 0] = img_shape[1] - boxes[..., 0]
        if direction in ('vertical', 'diagonal'):
            boxes[..., 1] = img_shape[0] - boxes[..., 1]
        if direction != 'diagonal':  # one mirror reverses the angle; two cancel out
            boxes[..., 4] = -boxes[..., 4]
        self.tensor = regularize_rboxes(boxes)

    def translate_(self, distances: Tuple[float, float]) -> None:
        if len(distances) != 2:
            raise ValueError(f"RotatedBoxes.translate_: distances must have 2 values, got {distances}")
        boxes = self.tensor.clone()
        boxes[..., :2] += boxes.new_tensor(distances)
        self.tensor = boxes

    def clip_(self, img_shape: Tuple[int, int]) -> None:
        """Does nothing: cutting a rotated box at the border does not give a rotated box.

        Set `clip_object_border=False` in Resize to avoid the warning.
        """
        warnings.warn('RotatedBoxes.clip_ does nothing: rotated boxes cannot be clipped to '
                      'the image; use clip_object_border=False')

    def rotate_(self, center: Tuple[float, float], angle: float) -> None:
        """Rotates about `center` by `angle` degrees, positive = clockwise on screen (mmdet's rule)."""
        boxes = self.tensor.clone()
        rad = math.radians(angle)
        cos, sin = math.cos(rad), math.sin(rad)
        dx, dy = boxes[..., 0] - center[0], boxes[..., 1] - center[1]
        boxes[..., 0] = center[0] + cos * dx - sin * dy
        boxes[..., 1] = center[1] + sin * dx + cos * dy
        boxes[..., 4] = boxes[..., 4] + rad
        self.tensor = regularize_rboxes(boxes)

    def project_(self, homography_matrix: Union[Tensor, np.ndarray]) -> None:
        """Maps the corners through the homography and fits the minimum-area rectangle."""
        boxes = self.tensor
        matrix = torch.as_tensor(homography_matrix, dtype=boxes.dtype, device=boxes.device)
        corners = self.corners
        ones = corners.new_ones(*corners.shape[:-1], 1)
        mapped = torch.cat([corners, ones], dim=-1) @ matrix.T
        mapped = mapped[..., :2] / mapped[..., 2:3]
        self.tensor = qbox2rbox(mapped.reshape(-1, 8)).reshape(boxes.shape).to(boxes)

    def rescale_(self, scale_factor: Tuple[float, float]) -> None:
        """Scales x by sx and y by sy (centres and sizes); see rbox_ops.rescale_rboxes for what
        a non-uniform scale does to a rotated rectangle."""
        if len(scale_factor) != 2:
            raise ValueError(f"RotatedBoxes.rescale_: scale_factor must have 2 values, got {scale_factor}")
        self.tensor = rescale_rboxes(self.tensor, float(scale_factor[0]), float(scale_factor[1]))

    def resize_(self, scale_factor: Tuple[float, float]) -> None:
        """Scales w and h about the box centres (the centres stay)."""
        if len(scale_factor) != 2:
            raise ValueError(f"RotatedBoxes.resize_: scale_factor must have 2 values, got {scale_factor}")
        boxes = self.tensor.clone()
        boxes[..., 2] *= scale_factor[0]
        boxes[..., 3] *= scale_factor[1]
        self.tensor = regularize_rboxes(boxes)

    # ---- queries ------------------------------------------------------------------------
    def is_inside(self, img_shape: Tuple[int, int], all_inside: bool = False,
                  allowed_border: int = 0) -> BoolTensor:
        """Boxes whose centre is inside the image (all_inside: whose four corners are)."""
        img_h, img_w = img_shape
        if all_inside:
            corners = self.corners
            xs, ys = corners[..., 0], corners[..., 1]
            return ((xs >= -allowed_border) & (xs < img_w + allowed_border) &
                    (ys >= -allowed_border) & (ys < img_h + allowed_border)).all(dim=-1)
        cx, cy = self.tensor[..., 0], self.tensor[..., 1]
        return ((cx > -allowed_border) & (cy > -allowed_border) &
                (cx < img_w + allowed_border) & (cy < img_h + allowed_border))

    def find_inside_points(self, points: Tensor, is_aligned: bool = False) -> BoolTensor:
        boxes = self.tensor
        if boxes.dim() != 2:
            raise ValueError(f"RotatedBoxes.find_inside_points: boxes must be (n, 5), got {tuple(boxes.shape)}")
        if not is_aligned:
            boxes = boxes[None, :, :]
            points = points[:, None, :]
        elif boxes.size(0) != points.size(0):
            raise ValueError(f"RotatedBoxes.find_inside_points: is_aligned needs as many points as "
                             f"boxes, got {points.size(0)} points and {boxes.size(0)} boxes")
        cx, cy, w, h, theta = boxes.unbind(dim=-1)
        cos, sin = torch.cos(theta), torch.sin(theta)
        dx, dy = points[..., 0] - cx, points[..., 1] - cy
        along_w = dx * cos + dy * sin  # point in the box frame
        along_h = -dx * sin + dy * cos
        return (along_w.abs() <= w / 2) & (along_h.abs() <= h / 2)

    @staticmethod
    def overlaps(boxes1: BaseBoxes, boxes2: BaseBoxes, mode: str = 'iou',
                 is_aligned: bool = False, eps: float = 1e-6) -> Tensor:
        """Rotated IoU (or IoF) via mmcv.ops.box_iou_rotated."""
        from mmcv.ops import box_iou_rotated
        if mode not in ('iou', 'iof'):
            raise ValueError(f"RotatedBoxes.overlaps: mode must be 'iou' or 'iof', got {mode!r}")
        t1 = boxes1.convert_to('redet_rbox').tensor
        t2 = boxes2.convert_to('redet_rbox').tensor
        if t1.numel() == 0 or t2.numel() == 0:
            shape = (t1.shape[0],) if is_aligned else (t1.shape[0], t2.shape[0])
            return t1.new_zeros(shape)
        return box_iou_rotated(t1.float(), t2.float(), mode=mode, aligned=is_aligned).to(t1.dtype)

    @staticmethod
    def from_instance_masks(masks: Union[BitmapMasks, PolygonMasks]) -> 'RotatedBoxes':
        """The minimum-area rectangle around each mask's pixels or polygon points."""
        rboxes = []
        if isinstance(masks, BitmapMasks):
            for mask in masks.masks:
                ys, xs = np.nonzero(mask)
                points = np.stack([xs, ys], axis=-1).astype(np.float32)
                rboxes.append(_min_area_rbox(points))
        elif isinstance(masks, PolygonMasks):
            for polygons in masks.masks:
                points = np.concatenate([np.asarray(p).reshape(-1, 2) for p in polygons], axis=0)
                rboxes.append(_min_area_rbox(points.astype(np.float32)))
        else:
            raise TypeError(f"RotatedBoxes.from_instance_masks: expected BitmapMasks or "
                            f"PolygonMasks, got {type(masks).__name__}")
        return RotatedBoxes(np.array(rboxes, dtype=np.float32).reshape(-1, 5))


def _min_area_rbox(points: np.ndarray) -> list:
    if len(points) == 0:
        return [0.0] * 5
    corners = cv2.boxPoints(cv2.minAreaRect(points))
    return qbox2rbox(corners.reshape(1, 8)).reshape(5).tolist()


@register_box_converter('redet_rbox', 'hbox')
def _rbox_to_hbox(boxes: Tensor) -> Tensor:
    return rbox2hbox(boxes)


@register_box_converter('hbox', 'redet_rbox')
def _hbox_to_rbox(boxes: Tensor) -> Tensor:
    return hbox2rbox(boxes)


__all__ = ['RotatedBoxes']
