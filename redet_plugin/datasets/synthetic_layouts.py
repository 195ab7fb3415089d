"""The synthetic images of synthetic.py written in the HRSC2016 and DIOR-R layouts, so that
RedetHRSCDataset and RedetDIORDataset (and mmrotate's HRSCDataset and DIORDataset) can be tried
end to end without the real data sets.

HRSC2016: root/ImageSets/{trainval,test}.txt, root/FullDataSet/AllImages/<id>.bmp and
root/FullDataSet/Annotations/<id>.xml; every object a ship (the ship painter) with rotated box,
bow (header_x/y), difficult and a Class_ID of HRSC's table.
DIOR-R: root/ImageSets/Main/{train,val,trainval,test}.txt, root/JPEGImages-{trainval,test}/<id>.jpg
and root/Annotations/Oriented Bounding Boxes/<id>.xml with <robndbox> corners and <bndbox>.
Images are drawn as in generate_synthetic_dota: one generator per (seed, split, index).
"""
import glob
import math
import os
import os.path as osp
import xml.etree.ElementTree as ET
from typing import Iterable, List, Sequence, Tuple

import cv2
import numpy as np

from .hrsc import HRSC_CLASS_IDS
from .synthetic import _rect, _to_image, generate_image

# DIOR-R names of the synthetic painters' classes.
DIOR_PAINTERS = {'airplane': 'plane', 'ship': 'ship', 'storagetank': 'storage-tank',
                 'vehicle': 'small-vehicle', 'tenniscourt': 'tennis-court'}
SYNTHETIC_DIOR_CLASSES = tuple(DIOR_PAINTERS)
HRSC_SHIP_ID = HRSC_CLASS_IDS[0]  # 'ship'


def _check_counts(owner: str, image_size: int, **counts: int) -> None:
    if image_size < 64:
        raise ValueError(f'{owner}: image_size must be >= 64, got {image_size}')
    negative = {name: n for name, n in counts.items() if n < 0}
    if negative:
        raise ValueError(f'{owner}: image counts must be >= 0, got {negative}')


def _clear(folder: str, patterns: Iterable[str]) -> None:
    """Makes `folder` and removes what a previous, larger generation left there."""
    os.makedirs(folder, exist_ok=True)
    for pattern in patterns:
        for stale in glob.glob(osp.join(folder, pattern)):
            os.remove(stale)


def _add(parent: ET.Element, tag: str, text=None) -> ET.Element:
    node = ET.SubElement(parent, tag)
    if text is not None:
        node.text = text if isinstance(text, str) else f'{text:.4f}' if isinstance(text, float) else str(text)
    return node


def _write_xml(root: ET.Element, path: str) -> None:
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding='utf-8', xml_declaration=True)


def _images(split_code: int, count: int, seed: int, image_size: int, painters: Sequence[str]):
    """(index, image, objects, rng) of one split; the rng continues after the image."""
    for index in range(count):
        rng = np.random.default_rng([seed, split_code, index])
        img, objects = generate_image(rng, image_size, painters)
        yield index, img, objects, rng


def _corners(rbox) -> np.ndarray:
    cx, cy, w, h, theta = rbox
    return _to_image(_rect(-w / 2, -h / 2, w / 2, h / 2), (cx, cy), theta)


def hrsc_xml(img_id: str, image_size: int, objects, class_ids: List[str]) -> ET.Element:
    """An HRSC2016 annotation (the fields RedetHRSCDataset and mmrotate read, and the box)."""
    root = ET.Element('HRSC_Image')
    for tag, text in (('Img_ID', img_id), ('Img_FileName', img_id), ('Img_FileFmt', 'bmp'),
                      ('Img_SizeWidth', image_size), ('Img_SizeHeight', image_size), ('Img_SizeDepth', 3)):
        _add(root, tag, text)
    holder = _add(root, 'HRSC_Objects')
    for number, ((cx, cy, w, h, theta), _, difficult) in enumerate(objects, start=1):
        xy = _corners((cx, cy, w, h, theta))
        bow = (cx + w / 2 * math.cos(theta), cy + w / 2 * math.sin(theta))  # the painter's +u end
        angle = (theta + math.pi / 2) % math.pi - math.pi / 2  # HRSC's angles: [-pi/2, pi/2)
        obj = _add(holder, 'HRSC_Object')
        for tag, text in (('Object_ID', f'{img_id}{number:03d}'), ('Class_ID', class_ids[number - 1]),
                          ('Object_NotFullyVisible', 0), ('difficult', int(difficult)),
                          ('box_xmin', int(xy[:, 0].min())), ('box_ymin', int(xy[:, 1].min())),
                          ('box_xmax', int(math.ceil(xy[:, 0].max()))),
                          ('box_ymax', int(math.ceil(xy[:, 1].max()))),
                          ('mbox_cx', float(cx)), ('mbox_cy', float(cy)), ('mbox_w', float(w)),
                          ('mbox_h', float(h)), ('mbox_ang', float(angle)),
                          ('header_x', int(round(bow[0]))), ('header_y', int(round(bow[1])))):
            _add(obj, tag, text)
    return root


def generate_synthetic_hrsc(root: str, num_trainval: int = 40, num_test: int = 10, image_size: int = 256,
                            seed: int = 0, class_ids: Sequence[str] = (HRSC_SHIP_ID,)) -> dict:
    """Writes the HRSC2016 layout under `root` (ships only). Each ship gets a Class_ID drawn from
    `class_ids` (HRSC's, HRSC_CLASS_IDS; the default: all 'ship'). Returns the parameters used."""
    _check_counts('generate_synthetic_hrsc', image_size, num_trainval=num_trainval, num_test=num_test)
    unknown = [c for c in class_ids if c not in HRSC_CLASS_IDS]
    if unknown or not class_ids:
        raise ValueError(f'generate_synthetic_hrsc: class_ids must be HRSC2016 Class_IDs '
                         f'({HRSC_CLASS_IDS[0]} ...), got {list(class_ids)}')
    img_dir = osp.join(root, 'FullDataSet', 'AllImages')
    ann_dir = osp.join(root, 'FullDataSet', 'Annotations')
    splits = (('trainval', num_trainval), ('test', num_test))
    _clear(img_dir, [f'{split}_*.bmp' for split, _ in splits])
    _clear(ann_dir, [f'{split}_*.xml' for split, _ in splits])
    os.makedirs(osp.join(root, 'ImageSets'), exist_ok=True)
    for code, (split, count) in enumerate(splits):
        ids = []
        for index, img, objects, rng in _images(code, count, seed, image_size, ('ship',)):
            img_id = f'{split}_{index:05d}'
            ids.append(img_id)
            chosen = [class_ids[int(rng.integers(len(class_ids)))] for _ in objects]
            cv2.imwrite(osp.join(img_dir, f'{img_id}.bmp'), img)
            _write_xml(hrsc_xml(img_id, image_size, objects, chosen), osp.join(ann_dir, f'{img_id}.xml'))
        _write_list(osp.join(root, 'ImageSets', f'{split}.txt'), ids)
    return dict(layout='hrsc', num_trainval=num_trainval, num_test=num_test, image_size=image_size,
                seed=seed, class_ids=list(class_ids))


def dior_xml(img_id: str, image_size: int, objects: List[Tuple[tuple, str, bool]]) -> ET.Element:
    """A DIOR-R annotation: per object name, difficult, <robndbox> corners and <bndbox>."""
    root = ET.Element('annotation')
    _add(root, 'filename', f'{img_id}.jpg')
    _add(_add(root, 'source'), 'database', 'DIOR')
    size = _add(root, 'size')
    for tag, value in (('width', image_size), ('height', image_size), ('depth', 3)):
        _add(size, tag, value)
    for rbox, name, difficult in objects:
        xy = _corners(rbox)
        obj = _add(root, 'object')
        for tag, text in (('name', name), ('pose', 'Unspecified'), ('truncated', 0),
                          ('difficult', int(difficult)), ('type', 'robndbox')):
            _add(obj, tag, text)
        corners = _add(obj, 'robndbox')
        for tag, value in zip(('x_left_top', 'y_left_top', 'x_right_top', 'y_right_top', 'x_right_bottom',
                               'y_right_bottom', 'x_left_bottom', 'y_left_bottom'), xy.reshape(-1)):
            _add(corners, tag, float(value))
        box = _add(obj, 'bndbox')
        for tag, value in zip(('xmin', 'ymin', 'xmax', 'ymax'), (*xy.min(0), *xy.max(0))):
            _add(box, tag, float(value))
    return root


def generate_synthetic_dior(root: str, num_trainval: int = 40, num_test: int = 10, image_size: int = 256,
                            seed: int = 0, classes: Sequence[str] = SYNTHETIC_DIOR_CLASSES) -> dict:
    """Writes the DIOR-R layout under `root`; the trainval images are split in halves into
    train.txt and val.txt (trainval.txt lists both). Returns the parameters used."""
    _check_counts('generate_synthetic_dior', image_size, num_trainval=num_trainval, num_test=num_test)
    unknown = [c for c in classes if c not in DIOR_PAINTERS]
    if unknown or not classes:
        raise ValueError(f'generate_synthetic_dior: classes must be a non-empty subset of '
                         f'{list(DIOR_PAINTERS)}, got {list(classes)}')
    to_dior = {DIOR_PAINTERS[name]: name for name in classes}
    ann_dir = osp.join(root, 'Annotations', 'Oriented Bounding Boxes')
    _clear(ann_dir, ['trainval_*.xml', 'test_*.xml'])
    lists = osp.join(root, 'ImageSets', 'Main')
    os.makedirs(lists, exist_ok=True)
    for code, (split, count) in enumerate((('trainval', num_trainval), ('test', num_test))):
        img_dir = osp.join(root, f'JPEGImages-{split}')
        _clear(img_dir, [f'{split}_*.jpg'])
        ids = []
        for index, img, objects, _ in _images(code, count, seed, image_size, list(to_dior)):
            img_id = f'{split}_{index:05d}'
            ids.append(img_id)
            cv2.imwrite(osp.join(img_dir, f'{img_id}.jpg'), img)
            named = [(rbox, to_dior[name], difficult) for rbox, name, difficult in objects]
            _write_xml(dior_xml(img_id, image_size, named), osp.join(ann_dir, f'{img_id}.xml'))
        _write_list(osp.join(lists, f'{split}.txt'), ids)
        if split == 'trainval':
            half = (len(ids) + 1) // 2
            _write_list(osp.join(lists, 'train.txt'), ids[:half])
            _write_list(osp.join(lists, 'val.txt'), ids[half:])
    return dict(layout='dior', num_trainval=num_trainval, num_test=num_test, image_size=image_size,
                seed=seed, classes=list(classes))


def _write_list(path: str, ids: List[str]) -> None:
    with open(path, 'w') as f:
        f.write(''.join(f'{img_id}\n' for img_id in ids))
