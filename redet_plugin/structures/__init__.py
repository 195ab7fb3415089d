"""Rotated boxes: the 'redet_rbox' box type for mmdet and plain conversion helpers (le90 convention).
The patch grid of large images (patches, padding, patch ids, mapping back) is patch_grid.py."""
from .rbox_ops import (hbox2rbox, hbox_as_prior, norm_angle, qbox2rbox, rbox2hbox, rbox2qbox,
                       regularize_rboxes, rescale_rboxes)
from .rotated_boxes import RotatedBoxes

__all__ = ['RotatedBoxes', 'norm_angle', 'regularize_rboxes', 'rbox2qbox', 'qbox2rbox',
           'rbox2hbox', 'hbox2rbox', 'hbox_as_prior', 'rescale_rboxes']
