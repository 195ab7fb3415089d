"""The patches of one image at each scale, cut lazily on dota_split's grid.

At scale s the image is (as dota_split's `rates`) resized to round(W * s) x round(H * s) with
dota_split.RESIZE_INTERPOLATION, then cut by dota_split.patch_windows into patch_size squares that
overlap by `overlap` pixels; patches are zero-padded to patch_size x patch_size by
dota_split.pad_patch. Nothing of the resized image is made: each patch is resampled from the
source region under it, with the same geometry as resizing the whole image.
"""
import math
from typing import Iterator, List, NamedTuple, Sequence

import cv2
import numpy as np

from ..datasets.dota_split import RESIZE_INTERPOLATION, pad_patch, patch_windows
from .image_source import ImageSource

_MARGIN = 3  # source pixels read around a region: bicubic taps reach 2 pixels out


class Patch(NamedTuple):
    scale: float
    left: int  # the patch's corner in the image resized by `scale`
    top: int


def scaled_size(length: int, scale: float) -> int:
    """An image side resized by `scale`, as cv2.resize(fx=scale) rounds it (at least 1)."""
    return max(int(round(length * scale)), 1)


def plan_patches(height: int, width: int, patch_size: int, overlap: int,
                 scales: Sequence[float]) -> List[Patch]:
    """Every patch of a height x width image, scale by scale, row by row."""
    return [Patch(scale, left, top) for scale in scales
            for left, top in patch_windows(scaled_size(height, scale), scaled_size(width, scale),
                                           patch_size, overlap)]


def read_patch(source: ImageSource, patch: Patch, patch_size: int) -> np.ndarray:
    """The patch's pixels, uint8 (patch_size, patch_size, 3) BGR, zero-padded."""
    if patch.scale == 1:
        return pad_patch(source.read(patch.top, patch.left, patch_size, patch_size), patch_size)
    s = patch.scale
    out_w = min(patch_size, scaled_size(source.width, s) - patch.left)
    out_h = min(patch_size, scaled_size(source.height, s) - patch.top)
    # cv2.resize samples output pixel x at source x_src = (x + 0.5) / s - 0.5
    x0 = max(int(math.floor((patch.left + 0.5) / s - 0.5)) - _MARGIN, 0)
    y0 = max(int(math.floor((patch.top + 0.5) / s - 0.5)) - _MARGIN, 0)
    x1 = int(math.ceil((patch.left + out_w - 0.5) / s - 0.5)) + _MARGIN + 1
    y1 = int(math.ceil((patch.top + out_h - 0.5) / s - 0.5)) + _MARGIN + 1
    region = source.read(y0, x0, y1 - y0, x1 - x0)
    matrix = np.array([[1 / s, 0, (patch.left + 0.5) / s - 0.5 - x0],
                       [0, 1 / s, (patch.top + 0.5) / s - 0.5 - y0]], dtype=np.float64)
    # replicated borders: cv2.resize clamps its taps to the image the same way
    resized = cv2.warpAffine(region, matrix, (out_w, out_h), flags=RESIZE_INTERPOLATION | cv2.WARP_INVERSE_MAP,
                             borderMode=cv2.BORDER_REPLICATE)
    return pad_patch(resized, patch_size)


def iter_patch_batches(source: ImageSource, patches: Sequence[Patch], patch_size: int,
                       batch_size: int) -> Iterator[tuple]:
    """(patches, their pixels) in batches of `batch_size`: one batch's pixels exist at a time."""
    for start in range(0, len(patches), batch_size):
        chunk = list(patches[start:start + batch_size])
        yield chunk, [read_patch(source, p, patch_size) for p in chunk]
