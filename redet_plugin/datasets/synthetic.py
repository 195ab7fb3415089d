"""Synthetic DOTA-format data: aerial-like textures with rotated objects of visually distinct classes.

The project's embedded default data set (small, CPU-friendly): `ensure_synthetic_dota(root)`
writes root/{train,val}/{images/*.png,labelTxt/*.txt} on first use. Each image is drawn from its
own generator seeded by (seed, split, index), so the data set is deterministic per seed.

Classes (DOTA names, so DOTA configs and palettes apply), each with its own shape and colours:
  plane          light-grey cross: fuselage, swept wings, tail plane
  ship           dark elongated hull with a pointed bow and a pale superstructure
  storage-tank   bright disc with a dark rim and a shadow (annotated axis-aligned)
  small-vehicle  small saturated rectangle with a dark windscreen
  tennis-court   green court with white lines and a net
About 8% of the objects are faint (low contrast) and annotated as difficult. Objects keep their
size (20-80 px) in images larger than 256 px; their number grows with the area (up to 8 per 256²).
"""
import glob
import json
import math
import os
import os.path as osp
from typing import Callable, Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

SYNTHETIC_CLASSES = ('plane', 'ship', 'storage-tank', 'small-vehicle', 'tennis-court')
_SHIFT = 4  # cv2 sub-pixel bits
_META_FILE = 'synthetic_meta.json'


def _to_image(points_uv: np.ndarray, center: Tuple[float, float], theta: float) -> np.ndarray:
    """Object-frame points (u along the box's w side, v along h) -> image (x, y)."""
    cos, sin = math.cos(theta), math.sin(theta)
    u, v = points_uv[:, 0], points_uv[:, 1]
    return np.stack([center[0] + u * cos - v * sin, center[1] + u * sin + v * cos], axis=-1)


def _fill(img: np.ndarray, points: np.ndarray, color) -> None:
    pts = np.round(points * (1 << _SHIFT)).astype(np.int32)
    cv2.fillPoly(img, [pts], tuple(float(c) for c in color), cv2.LINE_AA, _SHIFT)


def _rect(u0: float, v0: float, u1: float, v1: float) -> np.ndarray:
    return np.array([[u0, v0], [u1, v0], [u1, v1], [u0, v1]], dtype=np.float64)


# ---- class painters: each returns the box size (w along u, h along v) it drew --------------------
def _paint_plane(img, rng, center, theta, scale):
    length = scale * rng.uniform(44, 72)
    span = length * rng.uniform(0.85, 1.0)
    body = np.array([215, 215, 220]) + rng.normal(0, 12, 3)
    shade = body * 0.75
    draw = lambda pts, c: _fill(img, _to_image(pts, center, theta), c)  # noqa: E731
    # Wings and tail swept back (towards -u); the nose points to +u.
    draw(np.array([[0.12, -0.06], [-0.12, -0.5], [-0.22, -0.5], [-0.08, -0.06],
                   [-0.08, 0.06], [-0.22, 0.5], [-0.12, 0.5], [0.12, 0.06]]) * [length, span], shade)
    draw(np.array([[-0.36, -0.04], [-0.46, -0.2], [-0.5, -0.2], [-0.46, 0.0],
                   [-0.5, 0.2], [-0.46, 0.2], [-0.36, 0.04]]) * [length, span], shade)
    draw(np.array([[0.5, 0.0], [0.42, -0.06], [-0.5, -0.045], [-0.5, 0.045], [0.42, 0.06]])
         * [length, span], body)
    return length, span


def _paint_ship(img, rng, center, theta, scale):
    length = scale * rng.uniform(44, 80)
    beam = length * rng.uniform(0.2, 0.28)
    hull = np.array([70, 60, 50]) + rng.normal(0, 10, 3)
    deck = np.array([200, 190, 170]) + rng.normal(0, 10, 3)
    draw = lambda pts, c: _fill(img, _to_image(pts, center, theta), c)  # noqa: E731
    draw(np.array([[-0.5, -0.5], [0.25, -0.5], [0.5, 0.0], [0.25, 0.5], [-0.5, 0.5]]) * [length, beam], hull)
    draw(_rect(-0.42, -0.3, -0.12, 0.3) * [length, beam], deck)
    return length, beam


def _paint_tank(img, rng, center, theta, scale):
    diameter = scale * rng.uniform(22, 48)
    radius = diameter / 2
    fill = np.array([235, 235, 225]) + rng.normal(0, 8, 3)
    c = (int(round(center[0] * (1 << _SHIFT))), int(round(center[1] * (1 << _SHIFT))))
    shadow = (c[0] + int(radius * 0.25 * (1 << _SHIFT)), c[1] + int(radius * 0.25 * (1 << _SHIFT)))
    r = int(round(radius * (1 << _SHIFT)))
    cv2.circle(img, shadow, r, (25, 25, 25), -1, cv2.LINE_AA, _SHIFT)
    cv2.circle(img, c, r, tuple(float(v) for v in fill), -1, cv2.LINE_AA, _SHIFT)
    cv2.circle(img, c, r, (60, 60, 60), max(1, int(radius * 0.12)) * 1, cv2.LINE_AA, _SHIFT)
    cv2.circle(img, c, int(r * 0.3), tuple(float(v) for v in fill * 0.85), -1, cv2.LINE_AA, _SHIFT)
    return diameter, diameter


_VEHICLE_COLOURS = np.array([[40, 40, 220], [220, 60, 30], [30, 200, 230], [230, 230, 40]], dtype=float)


def _paint_vehicle(img, rng, center, theta, scale):
    length = scale * rng.uniform(20, 28)
    width = length * rng.uniform(0.45, 0.55)
    colour = _VEHICLE_COLOURS[rng.integers(len(_VEHICLE_COLOURS))] + rng.normal(0, 10, 3)
    draw = lambda pts, c: _fill(img, _to_image(pts, center, theta), c)  # noqa: E731
    draw(_rect(-0.5, -0.5, 0.5, 0.5) * [length, width], colour)
    draw(_rect(0.12, -0.4, 0.28, 0.4) * [length, width], (20, 20, 20))
    return length, width


def _paint_court(img, rng, center, theta, scale):
    length = scale * rng.uniform(52, 80)
    width = length * rng.uniform(0.48, 0.56)
    ground = np.array([60, 150, 70]) + rng.normal(0, 10, 3)
    draw = lambda pts, c: _fill(img, _to_image(pts, center, theta), c)  # noqa: E731
    draw(_rect(-0.5, -0.5, 0.5, 0.5) * [length, width], (235, 235, 235))
    draw(_rect(-0.46, -0.42, 0.46, 0.42) * [length, width], ground)
    draw(_rect(-0.01, -0.5, 0.01, 0.5) * [length, width] + [[-0.6, 0], [0.6, 0], [0.6, 0], [-0.6, 0]],
         (240, 240, 240))
    draw(_rect(-0.25, -0.015, 0.25, 0.015) * [length, width] + [[0, -0.6], [0, -0.6], [0, 0.6], [0, 0.6]],
         (240, 240, 240))
    return length, width


PAINTERS: Dict[str, Callable] = {
    'plane': _paint_plane, 'ship': _paint_ship, 'storage-tank': _paint_tank,
    'small-vehicle': _paint_vehicle, 'tennis-court': _paint_court}
AXIS_ALIGNED = {'storage-tank'}  # round: annotated with theta = 0, as DOTA annotators do


def make_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Aerial-like texture: smooth multi-scale colour fields, a few roads, fine grain (uint8 BGR)."""
    base = np.array(rng.choice([[90, 120, 110], [110, 125, 130], [80, 105, 95], [120, 130, 140]]), float)
    img = np.tile(base, (size, size, 1))
    for cells, amplitude in ((4, 25.0), (16, 12.0)):
        # Mostly brightness variation (fields, soil, shade) with a little colour variation.
        noise = rng.normal(0, 1, (cells, cells, 1)) + 0.25 * rng.normal(0, 1, (cells, cells, 3))
        img += amplitude * cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
    for _ in range(rng.integers(0, 3)):  # roads
        p0, p1 = rng.uniform(0, size, 2), rng.uniform(0, size, 2)
        grey = float(rng.uniform(95, 125))
        cv2.line(img, tuple(int(v) for v in p0), tuple(int(v) for v in p1), (grey, grey, grey),
                 int(rng.integers(5, 11)), cv2.LINE_AA)
    img += rng.normal(0, 5, img.shape)
    return img


def _iou_axis_aligned(a: np.ndarray, b: np.ndarray) -> float:
    lt, rb = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = np.prod(np.clip(rb - lt, 0, None))
    union = np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter
    return float(inter / union) if union > 0 else 0.0


def generate_image(rng: np.random.Generator, size: int, classes: Sequence[str],
                   max_objects: Optional[int] = None, difficult_rate: float = 0.08, max_overlap: float = 0.25):
    """Returns (uint8 BGR image, list of (rbox (cx, cy, w, h, theta), class, difficult)).

    max_objects defaults to 8 per 256x256 area (objects keep their size in larger images).
    """
    img = make_background(rng, size)
    objects, hulls = [], []
    scale = size / 256 if size < 256 else 1.0
    if max_objects is None:
        max_objects = max(8, int(round(8 * (size / 256) ** 2)))
    reach = int(math.ceil(64 * scale))  # every painter stays within +-reach px of the centre
    for _ in range(int(rng.integers(2, max_objects + 1))):
        name = classes[int(rng.integers(len(classes)))]
        theta = 0.0 if name in AXIS_ALIGNED else float(rng.uniform(-math.pi, math.pi))
        for _attempt in range(20):  # find a place inside the image, overlapping others little
            center = rng.uniform(0.1 * size, 0.9 * size, 2)
            # Paint on a copy of the window around the object only (large images stay fast).
            x0, y0 = max(int(center[0]) - reach, 0), max(int(center[1]) - reach, 0)
            window = img[y0:int(center[1]) + reach, x0:int(center[0]) + reach]
            layer = window.copy()
            w, h = PAINTERS[name](layer, rng, (center[0] - x0, center[1] - y0), theta, scale)
            corners = _to_image(_rect(-w / 2, -h / 2, w / 2, h / 2), tuple(center), theta)
            hull = np.concatenate([corners.min(0), corners.max(0)])
            if hull[0] < 1 or hull[1] < 1 or hull[2] > size - 1 or hull[3] > size - 1:
                continue
            if any(_iou_axis_aligned(hull, other) > max_overlap for other in hulls):
                continue
            difficult = bool(rng.uniform() < difficult_rate)
            alpha = 0.35 if difficult else 1.0  # difficult objects are faint
            window[:] = alpha * layer + (1 - alpha) * window
            hulls.append(hull)
            objects.append(((float(center[0]), float(center[1]), w, h, theta), name, difficult))
            break
    return np.clip(img, 0, 255).astype(np.uint8), objects


def dota_lines(objects) -> list:
    """DOTA annotation lines for (rbox, class, difficult) objects (corners clockwise on screen)."""
    lines = ['imagesource:synthetic', 'gsd:null']
    for (cx, cy, w, h, theta), name, difficult in objects:
        corners = _to_image(_rect(-w / 2, -h / 2, w / 2, h / 2), (cx, cy), theta)
        coords = ' '.join(f'{v:.1f}' for v in corners.reshape(-1))
        lines.append(f'{coords} {name} {int(difficult)}')
    return lines


def generate_synthetic_dota(root: str, num_train: int = 400, num_val: int = 100, image_size: int = 256,
                            seed: int = 0, classes: Sequence[str] = SYNTHETIC_CLASSES,
                            progress: bool = True) -> dict:
    """Writes root/{train,val}/{images,labelTxt} in the DOTA layout. Returns the parameters used."""
    unknown = [c for c in classes if c not in PAINTERS]
    if unknown or not classes:
        raise ValueError(f'generate_synthetic_dota: classes must be a non-empty subset of '
                         f'{list(PAINTERS)}, got {list(classes)}')
    if image_size < 64:
        raise ValueError(f'generate_synthetic_dota: image_size must be >= 64, got {image_size}')
    if num_train < 0 or num_val < 0:
        raise ValueError(f'generate_synthetic_dota: num_train and num_val must be >= 0, '
                         f'got {num_train}, {num_val}')
    params = synthetic_params(num_train, num_val, image_size, seed, classes)
    jobs = [('train', i) for i in range(num_train)] + [('val', i) for i in range(num_val)]
    for split in ('train', 'val'):
        for folder, ext in (('images', 'png'), ('labelTxt', 'txt')):
            os.makedirs(osp.join(root, split, folder), exist_ok=True)
            # A previous, larger generation must not leave stale files behind.
            for stale in glob.glob(osp.join(root, split, folder, f'{split}_*.{ext}')):
                os.remove(stale)
    bar = _progress_bar(len(jobs)) if progress else None
    for split, index in jobs:
        rng = np.random.default_rng([seed, 0 if split == 'train' else 1, index])
        img, objects = generate_image(rng, image_size, classes)
        stem = f'{split}_{index:05d}'
        cv2.imwrite(osp.join(root, split, 'images', f'{stem}.png'), img)
        with open(osp.join(root, split, 'labelTxt', f'{stem}.txt'), 'w') as f:
            f.write('\n'.join(dota_lines(objects)) + '\n')
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    with open(osp.join(root, _META_FILE), 'w') as f:
        json.dump(params, f, indent=1)
    return params


def _progress_bar(total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc='synthetic DOTA', unit='img')


def synthetic_params(num_train: int = 400, num_val: int = 100, image_size: int = 256, seed: int = 0,
                     classes: Sequence[str] = SYNTHETIC_CLASSES, progress: bool = True) -> dict:
    """The parameters that make a synthetic set (as its synthetic_meta.json records them), from
    the arguments of ensure_synthetic_dota; `progress` changes nothing in the set."""
    return dict(num_train=num_train, num_val=num_val, image_size=image_size, seed=seed,
                classes=list(classes))


def read_synthetic_params(root: str) -> Optional[dict]:
    """The parameters of the synthetic set under `root`, None where there is none."""
    meta = osp.join(root, _META_FILE)
    if not osp.isfile(meta):
        return None
    with open(meta) as f:
        return json.load(f)


def ensure_synthetic_dota(root: str, num_train: int = 400, num_val: int = 100, image_size: int = 256,
                          seed: int = 0, classes: Sequence[str] = SYNTHETIC_CLASSES,
                          progress: bool = True) -> Optional[dict]:
    """Generates the synthetic data set under `root` unless the same one is already there.

    Returns the parameters when it generated, None when the existing data set was kept.
    """
    params = synthetic_params(num_train, num_val, image_size, seed, classes)
    if read_synthetic_params(root) == params:
        return None
    return generate_synthetic_dota(root, num_train, num_val, image_size, seed, classes, progress)
