"""What the data sets of listed images with one XML file each (HRSC2016, DIOR-R) share: the
image-id list, the XML numbers, the loop over the listed images with its one-line errors, and
mmrotate's image filters."""
import os.path as osp
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Callable, List, Optional, Sequence

from mmdet.datasets import BaseDetDataset
from PIL import Image

from .dota import DOTAAnnotationWarning, DOTADataError


def read_image_ids(ann_file: str, owner: str, error: type) -> List[str]:
    """The image ids listed in `ann_file` (one a line); `owner` (a class name) starts messages."""
    if not ann_file or not osp.isfile(ann_file):
        raise error(f'{owner}: ann_file {ann_file!r} (the list of image ids, e.g. '
                                  f'ImageSets/trainval.txt) is not a file')
    with open(ann_file) as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        raise DOTADataError(f'{owner}: no image ids in {ann_file!r}')
    return ids


def xml_number(parent: ET.Element, tag: str, where: str, error: type,
               required: bool = True) -> Optional[float]:
    """The finite number in `parent`'s child <tag>; None where it is absent and not required."""
    node = parent.find(tag)
    text = (node.text or '').strip() if node is not None else ''
    if not text:
        if required:
            raise error(f'{where}: no <{tag}>')
        return None
    try:
        value = float(text)
    except ValueError:
        raise error(f'{where}: <{tag}> must be a number, got {text!r}') from None
    if value != value or abs(value) == float('inf'):
        raise error(f'{where}: <{tag}> must be finite, got {text!r}')
    return value


def image_size(img_path: str) -> tuple:
    """(width, height) from the image file's header."""
    with Image.open(img_path) as image:
        return image.size


def load_listed_images(owner: str, ann_file: str, ann_dir: str, img_dir: str, img_ext: str,
                       parse: Callable, error: type, classes: Sequence[str],
                       hint: str = 'check metainfo.classes') -> List[dict]:
    """parse(img_id, xml_path, img_path, left_out) of every image listed in ann_file, whose
    <id>.xml is in ann_dir and <id>.<img_ext> in img_dir (a missing one: `error` naming it).
    `left_out` counts objects by class name that parse left out (their class is not in
    `classes`): one warning per class. No object at all: a DOTADataError naming the folder."""
    left_out = Counter()
    data_list = []
    for img_id in read_image_ids(ann_file, owner, error):
        xml_path = osp.join(ann_dir, f'{img_id}.xml')
        img_path = osp.join(img_dir, f'{img_id}.{img_ext}')
        for path in (xml_path, img_path):
            if not osp.isfile(path):
                raise error(f'{owner}: image id {img_id!r} of {ann_file}: no file {path}')
        data_list.append(parse(img_id, xml_path, img_path, left_out))
    for name, count in sorted(left_out.items()):
        warnings.warn(f'{owner}: {count} object{"s" if count != 1 else ""} of class {name!r} '
                      f'(not in metainfo.classes) left out ({ann_dir})', DOTAAnnotationWarning)
    if not any(info['instances'] for info in data_list):
        found = (f'its objects are of the classes {sorted(left_out)}' if left_out
                 else 'its files hold no objects')
        raise DOTADataError(f'{owner}: no annotations of the classes {list(classes)} in '
                            f'{ann_dir!r} for the images of {ann_file!r}: {found} ({hint})')
    return data_list


class ListedXMLDataset(BaseDetDataset):
    """What RedetHRSCDataset and RedetDIORDataset share once their XML rows are read: the ignore
    rule of an object, mmrotate's image filters, and the class ids of an image. Subclasses set
    `ignore_difficult` before loading."""

    ignore_difficult = False

    def ignored(self, short_side: float, difficult: int) -> bool:
        """An object the metric neither counts nor misses: under filter_cfg's bbox_min_size
        (training only), or difficult with ignore_difficult=True."""
        cfg = self.filter_cfg or {}
        min_size = None if self.test_mode else cfg.get('bbox_min_size')
        return ((min_size is not None and short_side < min_size) or
                (self.ignore_difficult and difficult >= 1))

    def filter_data(self) -> List[dict]:
        """Training only: mmrotate's image filters (filter_empty_gt counting non-ignored
        objects, as RedetDOTADataset does; min_size on the shorter image side); an error rather
        than an empty training set."""
        cfg = self.filter_cfg or {}
        if self.test_mode or not cfg:
            return self.data_list
        empty_out, min_size = cfg.get('filter_empty_gt', False), cfg.get('min_size', 0)
        kept = [info for info in self.data_list
                if min(info['width'], info['height']) >= min_size
                and not (empty_out and all(inst['ignore_flag'] for inst in info['instances']))]
        if not kept:
            raise DOTADataError(
                f'{type(self).__name__}: filter_cfg {dict(cfg)} leaves no image of '
                f'{self.ann_file!r} (every image is smaller than min_size or has no object that '
                f'is not ignored: difficult with ignore_difficult=True, or under bbox_min_size)')
        return kept

    def get_cat_ids(self, idx: int) -> List[int]:
        return [inst['bbox_label'] for inst in self.get_data_info(idx)['instances']]
