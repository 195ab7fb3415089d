"""DIOR-R (20 classes of remote-sensing objects): `ImageSets/Main/<split>.txt` lists image ids;
images are `JPEGImages-trainval/<id>.jpg` or `JPEGImages-test/<id>.jpg`, annotations
`Annotations/Oriented Bounding Boxes/<id>.xml`: VOC-style <object>s whose <robndbox> gives the
four corners (x_left_top, y_left_top, x_right_top, ..., y_left_bottom).

The constructor takes mmrotate's DIORDataset arguments, so a config swaps `type='DIORDataset'` for
'RedetDIORDataset'. Class names are matched in any case (DIOR-R writes e.g.
'Expressway-Service-area'). Where mmrotate 1.x is wrong, this class differs:
- an object without a needed field, or a missing image or XML file, raises DIORAnnotationError
  naming the file and the object (mmrotate: a bare AttributeError); an object of a class not in
  metainfo.classes is left out with a warning (mmrotate: a bare KeyError);
- filter_cfg's bbox_min_size compares the object's sides (mmrotate compares the image's);
- without a <size>, the size is read from the image's header (mmrotate swaps width and height).
Each instance's 'bbox' is the le90 rotated box (the corners' minimum-area rectangle), as
RedetDOTADataset stores it; 'polygon' holds the annotated corners.
"""
import os.path as osp
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Dict, List

import numpy as np
from mmdet.registry import DATASETS

from redet_plugin.utils.registration import register

from ..structures import qbox2rbox
from .bad_images import BadImagesMixin
from .dota import DOTAAnnotationError
from .listed_xml import ListedXMLDataset, image_size, load_listed_images, xml_number

DIOR_CLASSES = ('airplane', 'airport', 'baseballfield', 'basketballcourt', 'bridge', 'chimney',
                'expressway-service-area', 'expressway-toll-station', 'dam', 'golffield',
                'groundtrackfield', 'harbor', 'overpass', 'ship', 'stadium', 'storagetank',
                'tenniscourt', 'trainstation', 'vehicle', 'windmill')
DIOR_PALETTE = [(220, 20, 60), (119, 11, 32), (0, 0, 142), (0, 0, 230), (106, 0, 228), (0, 60, 100),
                (0, 80, 100), (0, 0, 70), (0, 0, 192), (250, 170, 30), (100, 170, 30), (220, 220, 0),
                (175, 116, 175), (250, 0, 30), (165, 42, 42), (255, 77, 255), (0, 226, 252),
                (182, 182, 255), (0, 82, 0), (120, 166, 157)]
# The corners of each ann_type, as x1 y1 ... x4 y4 (clockwise on screen from the top left).
BOX_TAGS = {
    'obb': ('robndbox', ('x_left_top', 'y_left_top', 'x_right_top', 'y_right_top',
                         'x_right_bottom', 'y_right_bottom', 'x_left_bottom', 'y_left_bottom')),
    'hbb': ('bndbox', ('xmin', 'ymin', 'xmax', 'ymin', 'xmax', 'ymax', 'xmin', 'ymax')),
}


class DIORAnnotationError(DOTAAnnotationError):
    """A DIOR-R file is missing or malformed; the message names the file and the object."""


@register(DATASETS)
class DIORDataset(BadImagesMixin, ListedXMLDataset):
    """DIOR-R with mmrotate's arguments (and `ignore_difficult`).

    Args:
        ann_file: the list of image ids (relative to data_root), e.g. 'ImageSets/Main/test.txt'.
        data_prefix: dict(img_path='JPEGImages-test'): the folder of the <id>.jpg images.
        ann_subdir: folder of the <id>.xml annotations, in data_root (as mmrotate: not in
            data_prefix).
        ann_type: 'obb' reads <robndbox> (the oriented boxes), 'hbb' the horizontal <bndbox>.
        ignore_difficult: False (default, mmrotate's rule: it never reads <difficult>): difficult
            objects are ground truth like any other. True (the DOTA devkit's rule): objects with
            difficult >= 1 get ignore_flag=1. Recorded in `metainfo['ignore_difficult']`.
        filter_cfg: filter_empty_gt, min_size (images) and bbox_min_size (objects, ignore_flag=1),
            training only; see HRSCDataset.
        backend_args: accepted for configs written for mmrotate; files are read from local disk.
        on_bad_image: an image that cannot be loaded: 'error' (BadImageError naming it) or 'skip'
            (training: another image instead, listed at the end of the run; bad_images.py).
    Objects whose class is not in `metainfo.classes` are left out, with one DOTAAnnotationWarning
    per class name giving the count.
    """

    METAINFO = dict(classes=DIOR_CLASSES, palette=DIOR_PALETTE)

    def __init__(self, ann_subdir: str = 'Annotations/Oriented Bounding Boxes/', ann_type: str = 'obb',
                 ignore_difficult: bool = False, on_bad_image: str = 'error', **kwargs) -> None:
        self._set_on_bad_image(on_bad_image)
        if ann_type not in BOX_TAGS:
            raise ValueError(f"DIORDataset: ann_type must be 'obb' or 'hbb', got {ann_type!r}")
        self.ann_subdir = ann_subdir
        self.ann_type = ann_type
        self.ignore_difficult = bool(ignore_difficult)
        super().__init__(**kwargs)
        self._metainfo['ignore_difficult'] = self.ignore_difficult

    def _labels_by_name(self) -> Dict[str, int]:
        labels = {}
        for label, name in enumerate(self.metainfo['classes']):
            if name.lower() in labels:
                raise ValueError(f'DIORDataset: metainfo.classes names {name!r} twice (class names '
                                 f'are matched in any case)')
            labels[name.lower()] = label
        return labels

    def load_data_list(self) -> List[dict]:
        img_dir = self.data_prefix.get('img_path', '')
        ann_dir = osp.normpath(osp.join(self.data_root or '', self.ann_subdir))
        for folder, arg in ((img_dir, "data_prefix['img_path']"), (ann_dir, 'ann_subdir')):
            if not osp.isdir(folder):
                raise DIORAnnotationError(f'DIORDataset: {arg} folder {folder!r} does not exist')
        labels = self._labels_by_name()
        return load_listed_images(
            'DIORDataset', self.ann_file, ann_dir, img_dir, 'jpg',
            lambda img_id, xml_path, img_path, left_out: self._parse_xml(
                img_id, xml_path, img_path, labels, left_out),
            DIORAnnotationError, self.metainfo['classes'])

    def _parse_xml(self, img_id: str, xml_path: str, img_path: str, labels: Dict[str, int],
                   left_out: Counter) -> dict:
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError as error:
            raise DIORAnnotationError(f'{xml_path}: not valid XML ({error})') from None
        size = root.find('size')
        width = height = None
        if size is not None:
            width = xml_number(size, 'width', f'{xml_path}, <size>', DIORAnnotationError, required=False)
            height = xml_number(size, 'height', f'{xml_path}, <size>', DIORAnnotationError, required=False)
        if width is None or height is None:
            width, height = image_size(img_path)
        box_tag, corner_tags = BOX_TAGS[self.ann_type]
        rows = []  # (corners, label, difficult)
        for index, obj in enumerate(root.findall('object'), start=1):
            name = (obj.findtext('name') or '').strip()
            where = f'{xml_path}, object {index}' + (f' ({name})' if name else '')
            if not name:
                raise DIORAnnotationError(f'{where}: no <name>')
            if name.lower() not in labels:
                left_out[name.lower()] += 1
                continue
            box = obj.find(box_tag)
            if box is None:
                raise DIORAnnotationError(f"{where}: no <{box_tag}> (ann_type={self.ann_type!r})")
            corners = [xml_number(box, tag, f'{where}, <{box_tag}>', DIORAnnotationError)
                       for tag in corner_tags]
            difficult = int(xml_number(obj, 'difficult', where, DIORAnnotationError, required=False) or 0)
            rows.append((corners, labels[name.lower()], difficult, where))
        return dict(img_path=img_path, img_id=img_id, file_name=osp.basename(img_path),
                    xml_path=xml_path, width=int(width), height=int(height),
                    instances=self._instances(rows))

    def _instances(self, rows: list) -> List[dict]:
        if not rows:
            return []
        # One minimum-area-rectangle fit per file.
        rboxes = qbox2rbox(np.array([row[0] for row in rows], dtype=np.float64)).tolist()
        instances = []
        for (corners, label, difficult, where), rbox in zip(rows, rboxes):
            if rbox[2] * rbox[3] <= 0:
                raise DIORAnnotationError(f'{where}: degenerate box (zero area): {corners}')
            ignore = self.ignored(min(rbox[2], rbox[3]), difficult)
            instances.append(dict(bbox=rbox, bbox_label=label, ignore_flag=int(ignore),
                                  polygon=corners, difficulty=difficult))
        return instances
