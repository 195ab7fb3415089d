"""Splits large DOTA images into overlapping square patches, cutting the annotations (DOTA devkit rules).

The patches, their padding and their ids `<image>__<rate>__<left>___<top>` are the patch grid's
(structures/patch_grid.py), which patch inference cuts and evaluation.patch_merge maps back with:
patches of `patch_size` slide by `patch_size - gap`, the last row/column moved back to end at
the image border; patches smaller than `patch_size` (small images) are zero-padded.
Per object and patch, with r = area(object ∩ patch) / area(object):
  r == 1            kept as is (coordinates shifted);
  thresh < r < 1    kept as the minimum-area rectangle of the intersection, marked difficult (2);
  r <= thresh       dropped.
"""
import glob
import os
import os.path as osp
from typing import Iterable, List, Sequence, Tuple

import cv2
import numpy as np
from shapely.geometry import Polygon, box

from ..structures import qbox2rbox, rbox2qbox
from ..structures.patch_grid import RESIZE_INTERPOLATION, pad_patch, patch_id, patch_windows
from .dota import parse_dota_line

DotaObject = Tuple[np.ndarray, str, int]  # polygon (8,), class name, difficulty


def cut_objects(objects: Sequence[DotaObject], left: int, top: int, patch_size: int,
                thresh: float = 0.7) -> List[DotaObject]:
    """The objects of one patch, in patch coordinates (rules in the module docstring)."""
    window = box(left, top, left + patch_size, top + patch_size)
    kept = []
    for polygon, name, difficulty in objects:
        shape = Polygon(polygon.reshape(4, 2))
        if not shape.is_valid:
            shape = shape.buffer(0)
        if shape.area <= 0:
            continue
        inside = shape.intersection(window)
        ratio = inside.area / shape.area
        if ratio >= 1 - 1e-9:
            coords = polygon.reshape(4, 2) - [left, top]
        elif ratio > thresh:
            hull = np.asarray(inside.convex_hull.exterior.coords, dtype=np.float64)[:-1]
            rect = cv2.minAreaRect(hull.astype(np.float32))
            coords = cv2.boxPoints(rect).astype(np.float64) - [left, top]
            # DOTA's clockwise corner order, then inside the patch (float32 fitting may overshoot).
            coords = rbox2qbox(qbox2rbox(coords.reshape(1, 8)).double()).reshape(4, 2).numpy()
            coords = np.clip(coords, 0, patch_size)
            difficulty = 2
        else:
            continue
        kept.append((coords.reshape(8), name, difficulty))
    return kept


def split_image(img: np.ndarray, objects: Sequence[DotaObject], patch_size: int = 1024, gap: int = 200,
                thresh: float = 0.7) -> Iterable[Tuple[int, int, np.ndarray, List[DotaObject]]]:
    """Yields (left, top, patch image (patch_size², zero-padded), patch objects)."""
    height, width = img.shape[:2]
    for left, top in patch_windows(height, width, patch_size, gap):
        patch = pad_patch(img[top:top + patch_size, left:left + patch_size], patch_size)
        yield left, top, patch, cut_objects(objects, left, top, patch_size, thresh)


def read_dota_objects(txt: str) -> List[DotaObject]:
    """Reads a DOTA annotation file; a malformed line raises ValueError naming file and line."""
    objects = []
    with open(txt) as f:
        for number, line in enumerate(f, start=1):
            try:
                parsed = parse_dota_line(line)
            except ValueError as error:
                raise ValueError(f'{txt}, line {number}: {error}') from None
            if parsed is not None:
                coords, name, difficulty = parsed
                objects.append((np.asarray(coords, dtype=np.float64), name, difficulty))
    return objects


def write_dota_objects(txt: str, objects: Sequence[DotaObject]) -> None:
    with open(txt, 'w') as f:
        for coords, name, difficulty in objects:
            f.write(' '.join(f'{v:.2f}' for v in coords) + f' {name} {difficulty}\n')


def split_dota(src: str, dst: str, patch_size: int = 1024, gap: int = 200, rates: Sequence[float] = (1.0,),
               thresh: float = 0.7, img_ext: str = 'png', progress: bool = True) -> int:
    """Splits src/{images,labelTxt} into dst/{images,labelTxt}; a missing labelTxt folder means a
    test set (images only). Returns the number of patches written."""
    img_dir, ann_dir = osp.join(src, 'images'), osp.join(src, 'labelTxt')
    if not osp.isdir(img_dir):
        raise FileNotFoundError(f'split_dota: no image folder {img_dir}')
    images = sorted(p for p in glob.glob(osp.join(img_dir, '*')) if osp.splitext(p)[1].lower() in
                    ('.png', '.jpg', '.jpeg', '.tif', '.tiff', '.bmp'))
    os.makedirs(osp.join(dst, 'images'), exist_ok=True)
    with_ann = osp.isdir(ann_dir)
    if with_ann:
        os.makedirs(osp.join(dst, 'labelTxt'), exist_ok=True)
    count = 0
    iterator = images
    if progress:
        from tqdm import tqdm
        iterator = tqdm(images, desc='split DOTA', unit='img')
    for path in iterator:
        name = osp.splitext(osp.basename(path))[0]
        img = cv2.imread(path, cv2.IMREAD_COLOR)
        if img is None:
            raise ValueError(f'split_dota: cannot read image {path}')
        objects = []
        if with_ann:
            txt = osp.join(ann_dir, f'{name}.txt')
            if not osp.isfile(txt):
                raise FileNotFoundError(f'split_dota: no annotation {txt} for image {path}')
            objects = read_dota_objects(txt)
        for rate in rates:
            scaled = img if rate == 1 else cv2.resize(img, None, fx=rate, fy=rate, interpolation=RESIZE_INTERPOLATION)
            scaled_objects = [(c * rate, n, d) for c, n, d in objects]
            for left, top, patch, patch_objects in split_image(scaled, scaled_objects, patch_size, gap, thresh):
                stem = patch_id(name, rate, left, top)
                cv2.imwrite(osp.join(dst, 'images', f'{stem}.{img_ext}'), patch)
                if with_ann:
                    write_dota_objects(osp.join(dst, 'labelTxt', f'{stem}.txt'), patch_objects)
                count += 1
    return count
