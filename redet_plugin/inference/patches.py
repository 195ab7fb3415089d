"""The pixels of the patches of one image, read lazily on the patch grid (structures/patch_grid.py,
the splitter's grid): at scale s the image is resized to round(W * s) x round(H * s) with the
grid's RESIZE_INTERPOLATION, cut into patch_size squares (plan_patches) and zero-padded
(pad_patch). Nothing of the resized image is made: each patch is resampled from the source
region under it, with the same geometry as resizing the whole image.
"""
import math
from typing import Iterator, Sequence

import cv2
import numpy as np

from ..structures.patch_grid import RESIZE_INTERPOLATION, Patch, pad_patch, scaled_size
from .image_source import ImageSource

_MARGIN = 3  # source pixels read around a region: bicubic taps reach 2 pixels out


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
