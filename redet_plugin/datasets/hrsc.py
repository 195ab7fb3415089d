"""HRSC2016 (ships): `ImageSets/<split>.txt` lists image ids; each id has
`FullDataSet/AllImages/<id>.bmp` and `FullDataSet/Annotations/<id>.xml`, whose HRSC_Object
elements give the rotated box (mbox_cx, mbox_cy, mbox_w, mbox_h, mbox_ang in radians), the bow
(header_x, header_y), `difficult` and the ship class (Class_ID, e.g. 100000001 = 'ship').

The constructor takes mmrotate's HRSCDataset arguments, so a config swaps `type='HRSCDataset'`
for 'RedetHRSCDataset' and nothing else. Where mmrotate 1.x is wrong, this class differs:
- the height comes from Img_SizeHeight (mmrotate reads Img_SizeWidth for both, so every
  non-square image, most of HRSC, gets a wrong height); without the size fields it is read
  from the image's header;
- an object without a needed field, or with a Class_ID that is not HRSC's, raises
  HRSCAnnotationError naming the file and the object (mmrotate: a bare KeyError or
  AttributeError), and so does a missing image or XML file.
Each instance's 'bbox' is the le90 rotated box, as RedetDOTADataset stores it (mmdet's
`LoadAnnotations(box_type='redet_rbox')` loads it); 'polygon' holds its corners, 'head' the bow.
"""
import os.path as osp
import xml.etree.ElementTree as ET
from collections import Counter
from typing import Dict, List, Optional

import torch
from mmdet.registry import DATASETS

from redet_plugin.utils.registration import register

from ..structures import rbox2qbox, regularize_rboxes
from .bad_images import BadImagesMixin
from .dota import DOTAAnnotationError
from .listed_xml import ListedXMLDataset, image_size, load_listed_images, xml_number

# HRSC2016's 31 classes with their Class_IDs ('1' + '0' * 6 + two digits; 21 and 23 are unused),
# in mmrotate's order (its label numbers).
HRSC_CLASSES = ('ship', 'aircraft carrier', 'warcraft', 'merchant ship', 'Nimitz', 'Enterprise',
                'Arleigh Burke', 'WhidbeyIsland', 'Perry', 'Sanantonio', 'Ticonderoga', 'Kitty Hawk',
                'Kuznetsov', 'Abukuma', 'Austen', 'Tarawa', 'Blue Ridge', 'Container', 'OXo|--)',
                'Car carrier([]==[])', 'Hovercraft', 'yacht', 'CntShip(_|.--.--|_]=', 'Cruise',
                'submarine', 'lute', 'Medical', 'Car carrier(======|', 'Ford-class', 'Midway-class',
                'Invincible-class')
HRSC_CLASS_IDS = tuple(f'1000000{n:02d}' for n in (*range(1, 21), 22, *range(24, 34)))
HRSC_PALETTE = [(220, 20, 60), (119, 11, 32), (0, 0, 142), (0, 0, 230), (106, 0, 228), (0, 60, 100),
                (0, 80, 100), (0, 0, 70), (0, 0, 192), (250, 170, 30), (100, 170, 30), (220, 220, 0),
                (175, 116, 175), (250, 0, 30), (165, 42, 42), (255, 77, 255), (0, 226, 252),
                (182, 182, 255), (0, 82, 0), (120, 166, 157), (110, 76, 0), (174, 57, 255),
                (199, 100, 0), (72, 0, 118), (255, 179, 240), (0, 125, 92), (209, 0, 151),
                (188, 208, 182), (0, 220, 176), (255, 99, 164), (92, 0, 73)]
RBOX_FIELDS = ('mbox_cx', 'mbox_cy', 'mbox_w', 'mbox_h', 'mbox_ang')


class HRSCAnnotationError(DOTAAnnotationError):
    """An HRSC2016 file is missing or malformed; the message names the file and the object."""


@register(DATASETS)
class HRSCDataset(BadImagesMixin, ListedXMLDataset):
    """HRSC2016 with mmrotate's arguments (and `ignore_difficult`).

    Args:
        ann_file: the list of image ids (relative to data_root), e.g. 'ImageSets/trainval.txt'.
        data_prefix: dict(sub_data_root='FullDataSet/'): the folder holding img_subdir and
            ann_subdir (data_root when not given).
        img_subdir: folder of the <id>.bmp images, in sub_data_root.
        ann_subdir: folder of the <id>.xml annotations, in sub_data_root.
        classwise: False: one class, every object is a 'ship' (HRSC's usual task; Class_ID is not
            read); `metainfo.classes`, if given, must then name one class. True: the 31 classes
            of HRSC_CLASSES by Class_ID; `metainfo.classes` may name a subset (objects of the other
            classes are left out, with one DOTAAnnotationWarning per class).
        ignore_difficult: False (default, mmrotate's rule: it never reads <difficult>): difficult
            objects are ground truth like any other. True (the DOTA devkit's rule): objects with
            difficult >= 1 get ignore_flag=1, neither hits nor misses in evaluation and no target
            in training. Recorded in `metainfo['ignore_difficult']`; the metric logs it.
        filter_cfg: as mmrotate's: filter_empty_gt drops training images without (non-ignored)
            objects, min_size drops images whose shorter side is smaller, bbox_min_size gives
            objects with a side shorter than it ignore_flag=1 (training only, test_mode keeps all).
        backend_args: accepted for configs written for mmrotate; files are read from local disk.
        on_bad_image: an image that cannot be loaded: 'error' (BadImageError naming it) or 'skip'
            (training: another image instead, listed at the end of the run; bad_images.py).
    """

    METAINFO = dict(classes=HRSC_CLASSES, palette=HRSC_PALETTE)

    def __init__(self, img_subdir: str = 'AllImages', ann_subdir: str = 'Annotations',
                 classwise: bool = False, ignore_difficult: bool = False,
                 metainfo: Optional[dict] = None, on_bad_image: str = 'error', **kwargs) -> None:
        self._set_on_bad_image(on_bad_image)
        self.img_subdir = img_subdir
        self.ann_subdir = ann_subdir
        self.classwise = bool(classwise)
        self.ignore_difficult = bool(ignore_difficult)
        if not self.classwise:
            metainfo = dict(metainfo or {})
            classes = tuple(metainfo.setdefault('classes', ('ship',)))
            if len(classes) != 1:
                raise ValueError(f'HRSCDataset: classwise=False has one class (every object is a '
                                 f'ship), metainfo.classes names {len(classes)}: {list(classes)}; '
                                 f'set classwise=True for the 31 classes')
            metainfo.setdefault('palette', HRSC_PALETTE[:1])
        super().__init__(metainfo=metainfo, **kwargs)
        self._metainfo['ignore_difficult'] = self.ignore_difficult

    @property
    def sub_data_root(self) -> str:
        return self.data_prefix.get('sub_data_root', self.data_root or '')

    def _labels_by_class_id(self) -> Optional[Dict[str, int]]:
        """Class_ID -> label for the configured classes (None: classwise=False, all label 0)."""
        if not self.classwise:
            return None
        classes = list(self.metainfo['classes'])
        unknown = [name for name in classes if name not in HRSC_CLASSES]
        if unknown:
            raise ValueError(f'HRSCDataset: metainfo.classes {unknown} are not HRSC2016 classes '
                             f'(classwise=True takes names of {list(HRSC_CLASSES)})')
        ids = dict(zip(HRSC_CLASSES, HRSC_CLASS_IDS))
        return {ids[name]: label for label, name in enumerate(classes)}

    def load_data_list(self) -> List[dict]:
        img_dir = osp.join(self.sub_data_root, self.img_subdir)
        ann_dir = osp.join(self.sub_data_root, self.ann_subdir)
        for folder, arg in ((img_dir, 'img_subdir'), (ann_dir, 'ann_subdir')):
            if not osp.isdir(folder):
                raise HRSCAnnotationError(f"HRSCDataset: {arg} folder {folder!r} (in "
                                          f"data_prefix['sub_data_root']) does not exist")
        labels = self._labels_by_class_id()
        return load_listed_images(
            'HRSCDataset', self.ann_file, ann_dir, img_dir, 'bmp',
            lambda img_id, xml_path, img_path, left_out: self._parse_xml(
                img_id, xml_path, img_path, labels, left_out),
            HRSCAnnotationError, self.metainfo['classes'],
            hint='check metainfo.classes and classwise')

    def _parse_xml(self, img_id: str, xml_path: str, img_path: str,
                   labels: Optional[Dict[str, int]], left_out: Counter) -> dict:
        try:
            root = ET.parse(xml_path).getroot()
        except ET.ParseError as error:
            raise HRSCAnnotationError(f'{xml_path}: not valid XML ({error})') from None
        width = xml_number(root, 'Img_SizeWidth', xml_path, HRSCAnnotationError, required=False)
        height = xml_number(root, 'Img_SizeHeight', xml_path, HRSCAnnotationError, required=False)
        if width is None or height is None:
            width, height = image_size(img_path)
        rows = []  # (rbox as annotated, label, difficult, head)
        for index, obj in enumerate(root.findall('HRSC_Objects/HRSC_Object'), start=1):
            object_id = (obj.findtext('Object_ID') or '').strip()
            where = f'{xml_path}, object {index}' + (f' (Object_ID {object_id})' if object_id else '')
            rbox = [xml_number(obj, tag, where, HRSCAnnotationError) for tag in RBOX_FIELDS]
            if rbox[2] <= 0 or rbox[3] <= 0:
                raise HRSCAnnotationError(f'{where}: mbox_w and mbox_h must be > 0, got '
                                          f'{rbox[2]:g}, {rbox[3]:g}')
            label = 0
            if labels is not None:
                class_id = (obj.findtext('Class_ID') or '').strip()
                if not class_id:
                    raise HRSCAnnotationError(f'{where}: no <Class_ID> (classwise=True needs it)')
                if class_id not in HRSC_CLASS_IDS:
                    raise HRSCAnnotationError(f'{where}: Class_ID {class_id!r} is not an HRSC2016 '
                                              f'class id ({HRSC_CLASS_IDS[0]} ... {HRSC_CLASS_IDS[-1]})')
                if class_id not in labels:
                    left_out[HRSC_CLASSES[HRSC_CLASS_IDS.index(class_id)]] += 1
                    continue
                label = labels[class_id]
            difficult = int(xml_number(obj, 'difficult', where, HRSCAnnotationError, required=False) or 0)
            head = [xml_number(obj, tag, where, HRSCAnnotationError, required=False)
                    for tag in ('header_x', 'header_y')]
            rows.append((rbox, label, difficult, None if None in head else [int(v) for v in head]))
        return dict(img_path=img_path, img_id=img_id, file_name=osp.basename(img_path),
                    xml_path=xml_path, width=int(width), height=int(height),
                    instances=self._instances(rows))

    def _instances(self, rows: list) -> List[dict]:
        if not rows:
            return []
        raw = torch.tensor([row[0] for row in rows], dtype=torch.float64)
        rboxes, polygons = regularize_rboxes(raw).tolist(), rbox2qbox(raw).tolist()
        instances = []
        for (annotated, label, difficult, head), rbox, polygon in zip(rows, rboxes, polygons):
            ignore = self.ignored(min(annotated[2], annotated[3]), difficult)
            instance = dict(bbox=rbox, bbox_label=label, ignore_flag=int(ignore), polygon=polygon,
                            difficulty=difficult)
            if head is not None:
                instance['head'] = head
            instances.append(instance)
        return instances
