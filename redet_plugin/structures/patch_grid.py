"""The patch grid: how a large image is cut into overlapping square patches, what the patches are
called, and how what is found on a patch maps back to the image. The splitter
(datasets/dota_split.py), patch inference (inference/) and the merge of split patches
(evaluation/patch_merge.py) all cut, name and map back with this module.

Geometry. At scale `rate` the image is resized (RESIZE_INTERPOLATION) to
scaled_size(W, rate) x scaled_size(H, rate), then cut into patch_size squares that slide by
patch_size - gap, the last row and column moved back to end at the border (patch_windows);
where the image does not fill a patch (an image smaller than one), the patch is zero-padded at
the bottom and right (pad_patch).

Names. parse_patch_id reads the two forms in use:
- DOTA devkit's, which patch_id writes: `<image>__<rate>__<left>___<top>`, e.g.
  `P0003__0.5__824___0`: (left, top) is the patch's corner in the image resized by `rate`;
- mmrotate 1.x's split tool (tools/data/dota/split/img_split.py):
  `<image>__<size>__<left>___<top>`, e.g. `P0003__1024__824___0`: `size` is the window's side
  in the image's own pixels (its `--rates` change the window, not the image) and (left, top)
  is in the image's own pixels (mmrotate's merge, DOTAMetric.merge_results, adds them as they
  are). Such a patch maps back as a patch at rate 1.
The middle field tells the two apart: an integer of at least MIN_WINDOW_SIZE is a window size,
anything else (`1`, `0.5`, `1.5`, `1.0`) a rate. No real split scales an image 32-fold or uses
a window narrower than 32 pixels, and patch_id refuses the rates that would read as sizes.
"""
import re
from typing import List, NamedTuple, Sequence, Tuple

import cv2
import numpy as np

# How images are resized at rates != 1: dota_split resizes whole images so, inference/patches.py
# resamples its patches alike.
RESIZE_INTERPOLATION = cv2.INTER_CUBIC
MIN_WINDOW_SIZE = 32  # the smallest middle field read as mmrotate's window size (module docstring)
PATCH_ID = re.compile(r'^(?P<name>.+)__(?P<scale>\d+(?:\.\d+)?)__(?P<left>-?\d+)___(?P<top>-?\d+)$')


class Patch(NamedTuple):
    scale: float
    left: int  # the patch's corner in the image resized by `scale`
    top: int


class PatchId(NamedTuple):
    """A patch id read back: the full image's name, and the patch's corner (left, top) in that
    image resized by `rate`."""
    name: str
    rate: float
    left: int
    top: int


def patch_origins(length: int, patch_size: int, gap: int) -> List[int]:
    """Start offsets along one axis: stride patch_size - gap, the last one flush with the end."""
    if patch_size <= gap:
        raise ValueError(f'patch_size ({patch_size}) must be larger than gap ({gap})')
    stride = patch_size - gap
    starts, start = [], 0
    while True:
        if start + patch_size >= length:
            starts.append(max(length - patch_size, 0))
            return sorted(set(starts))
        starts.append(start)
        start += stride


def patch_windows(height: int, width: int, patch_size: int, gap: int) -> List[Tuple[int, int]]:
    """(left, top) of every patch of a height x width image, row by row (patch_origins per axis)."""
    return [(left, top) for top in patch_origins(height, patch_size, gap)
            for left in patch_origins(width, patch_size, gap)]


def scaled_size(length: int, scale: float) -> int:
    """An image side resized by `scale`, as cv2.resize(fx=scale) rounds it (at least 1)."""
    return max(int(round(length * scale)), 1)


def plan_patches(height: int, width: int, patch_size: int, overlap: int,
                 scales: Sequence[float]) -> List[Patch]:
    """Every patch of a height x width image, scale by scale, row by row."""
    return [Patch(scale, left, top) for scale in scales
            for left, top in patch_windows(scaled_size(height, scale), scaled_size(width, scale),
                                           patch_size, overlap)]


def pad_patch(crop: np.ndarray, patch_size: int) -> np.ndarray:
    """`crop` in the top-left corner of a zero (black) patch_size x patch_size patch."""
    patch = np.zeros((patch_size, patch_size) + crop.shape[2:], dtype=crop.dtype)
    patch[:crop.shape[0], :crop.shape[1]] = crop
    return patch


def patch_id(name: str, rate: float, left: int, top: int) -> str:
    """The devkit's patch id (rate written as the devkit does: `1` for 1.0, `0.5` for 0.5)."""
    if not 0 < rate < MIN_WINDOW_SIZE:
        raise ValueError(f'patch_id: rate must be in (0, {MIN_WINDOW_SIZE}) (a larger one would '
                         f'read back as a window size), got {rate}')
    return f'{name}__{rate:g}__{left}___{top}'


def parse_patch_id(img_id: str) -> PatchId:
    """`P0001__0.5__824___0` (devkit) -> ('P0001', 0.5, 824, 0); `P0001__1024__824___0`
    (mmrotate, window size 1024) -> ('P0001', 1.0, 824, 0); a plain id (a full image) ->
    (id, 1.0, 0, 0)."""
    match = PATCH_ID.match(img_id)
    if match is None:
        return PatchId(img_id, 1.0, 0, 0)
    scale = match['scale']
    is_window_size = scale.isdigit() and int(scale) >= MIN_WINDOW_SIZE
    rate = 1.0 if is_window_size else float(scale)
    return PatchId(match['name'], rate, int(match['left']), int(match['top']))


def patch_to_image(boxes, rate: float, left: float, top: float) -> np.ndarray:
    """Rotated boxes (N, 5) found on the patch at (left, top) of the image scaled by `rate`, in
    the full image's pixels (float32)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 5).copy()
    boxes[:, 0] += left
    boxes[:, 1] += top
    boxes[:, :4] /= rate
    return boxes
