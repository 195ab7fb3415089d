"""DOTA-format dataset: one image + one txt of `x1 y1 x2 y2 x3 y3 x4 y4 class difficulty` lines
(DOTA-v1.0, and DOTA-v1.5 / v2.0 with their own class tables).

Each instance's 'bbox' is the le90 rotated box (cx, cy, w, h, theta) of the annotated
quadrilateral (minimum-area rectangle), so mmdet's `LoadAnnotations(box_type='redet_rbox')` loads it as
RotatedBoxes. The quadrilateral itself stays in 'polygon'.
"""
import glob
import os.path as osp
import warnings
from collections import Counter
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
from mmdet.datasets import BaseDetDataset
from mmdet.registry import DATASETS

from redet_plugin.utils.registration import register

from ..structures import qbox2rbox
from .bad_images import BadImagesMixin, read_image_size
from .errors import DOTAAnnotationError, DOTAAnnotationWarning, DOTADataError  # noqa: F401

DOTA_V1_CLASSES = ('plane', 'baseball-diamond', 'bridge', 'ground-track-field', 'small-vehicle',
                   'large-vehicle', 'ship', 'tennis-court', 'basketball-court', 'storage-tank',
                   'soccer-ball-field', 'roundabout', 'harbor', 'swimming-pool', 'helicopter')
DOTA_V15_CLASSES = DOTA_V1_CLASSES + ('container-crane',)
DOTA_V2_CLASSES = DOTA_V15_CLASSES + ('airport', 'helipad')
HEADER_PREFIXES = ('imagesource:', 'gsd:')


def parse_dota_line(line: str) -> Optional[Tuple[List[float], str, int]]:
    """Returns (8 polygon coordinates, class name, difficulty), or None for header/blank lines.

    Raises ValueError (without location; the caller adds it) when the line is malformed.
    """
    stripped = line.strip()
    if not stripped or stripped.lower().startswith(HEADER_PREFIXES):
        return None
    fields = stripped.split()
    if len(fields) not in (9, 10):
        raise ValueError(f"expected 'x1 y1 x2 y2 x3 y3 x4 y4 class [difficulty]' (9 or 10 fields), "
                         f"got {len(fields)} fields")
    try:
        coords = [float(v) for v in fields[:8]]
    except ValueError:
        raise ValueError(f"coordinates must be numbers, got {fields[:8]}") from None
    if any(c != c or abs(c) == float('inf') for c in coords):
        raise ValueError(f"coordinates must be finite, got {fields[:8]}")
    difficulty = 0
    if len(fields) == 10:
        try:
            difficulty = int(fields[9])
        except ValueError:
            raise ValueError(f"difficulty must be an integer, got {fields[9]!r}") from None
    return coords, fields[8], difficulty


def difficult_rule_text(ignore_difficult: Optional[bool]) -> str:
    """How difficult objects are treated, for logs: RedetDOTADataset's `ignore_difficult`
    (None: a data set that does not say, its ignored_instances are used as given)."""
    if ignore_difficult is None:
        return "as the data set flags them (it does not say which rule it uses)"
    return 'ignored (DOTA devkit)' if ignore_difficult else 'kept as ground truth (mmrotate)'


@register(DATASETS)
class DOTADataset(BadImagesMixin, BaseDetDataset):
    """DOTA-format rotated-box dataset (DOTA-v1.0's 15 classes unless `metainfo.classes` says otherwise).

    Args:
        ann_file: folder (relative to data_root) holding one `<image stem>.txt` per image. Empty
            string: no annotations (test set), the images in `data_prefix['img_path']` are listed.
        data_prefix: dict(img_path=folder of the images).
        img_suffixes: image file endings tried for each annotation file.
        on_bad_line: 'error' raises DOTAAnnotationError naming file and line for a malformed line
            or a missing image; 'warn' logs a warning and skips the line (or the image).
        on_bad_image: 'error' raises BadImageError naming an image that cannot be read (missing,
            empty, cut short, not an image: checked when the data set is listed, and when
            loaded); 'skip' leaves such images out, and RedetBadImagesHook lists them at the
            end of the run (redet_plugin/datasets/bad_images.py).
        ignore_difficult: the rule for difficult objects (difficulty >= 1 in the annotation; the
            splitter marks objects cut by a patch border 2).
            True (DOTA devkit's rule): they get `ignore_flag=1`, so mmdet packs them into
            `ignored_instances`: in training they are no target (the assigners' ignore_iof_thr=-1
            leaves them out entirely) and an image holding only such objects counts as empty for
            filter_empty_gt; in evaluation a detection of one is neither right nor wrong.
            False (mmrotate's rule, its DOTADataset's default diff_thr=100): they are ground truth
            like any other object, in training and in evaluation.
            The value is also in `metainfo['ignore_difficult']`, and RedetDOTAMetric logs it.
        filter_cfg: dict(filter_empty_gt=True) drops training images without (non-ignored) objects.
    Objects whose class is not in `classes` are left out (train on a subset of the classes), with
    one DOTAAnnotationWarning per such class name and load, giving its count (a misspelt class
    in the config would otherwise empty that class without a word).
    """

    METAINFO = dict(classes=DOTA_V1_CLASSES,
                    palette=[(165, 42, 42), (189, 183, 107), (0, 255, 0), (255, 0, 0), (138, 43, 226),
                             (255, 128, 0), (255, 0, 255), (0, 255, 255), (255, 193, 193),
                             (0, 51, 153), (255, 250, 205), (0, 139, 139), (255, 255, 0),
                             (147, 116, 116), (0, 0, 255)])

    def __init__(self, *args, img_suffixes: Union[str, Sequence[str]] = ('png', 'jpg', 'tif', 'bmp'),
                 on_bad_line: str = 'error', ignore_difficult: bool = True, on_bad_image: str = 'error',
                 **kwargs) -> None:
        if on_bad_line not in ('error', 'warn'):
            raise ValueError(f"DOTADataset: on_bad_line must be 'error' or 'warn', got {on_bad_line!r}")
        self._set_on_bad_image(on_bad_image)
        self.img_suffixes = (img_suffixes,) if isinstance(img_suffixes, str) else tuple(img_suffixes)
        self.on_bad_line = on_bad_line
        self.ignore_difficult = bool(ignore_difficult)
        super().__init__(*args, **kwargs)
        self._metainfo['ignore_difficult'] = self.ignore_difficult

    def _bad(self, message: str) -> None:
        if self.on_bad_line == 'error':
            raise DOTAAnnotationError(message)
        warnings.warn(f'DOTADataset: skipped: {message}', DOTAAnnotationWarning)

    def _find_image(self, stem: str) -> Optional[str]:
        for suffix in self.img_suffixes:
            path = osp.join(self.data_prefix['img_path'], f'{stem}.{suffix.lstrip(".")}')
            if osp.isfile(path):
                return path
        return None

    def load_data_list(self) -> List[dict]:
        img_dir = self.data_prefix.get('img_path', '')
        if not osp.isdir(img_dir):
            raise DOTAAnnotationError(f"DOTADataset: image folder {img_dir!r} (data_prefix['img_path']) "
                                      "does not exist")
        if not self.ann_file:  # no annotations: every image, without instances
            paths = sorted(p for s in self.img_suffixes for p in glob.glob(osp.join(img_dir, f'*.{s}')))
            if not paths:
                raise DOTADataError(f'DOTADataset: no images (*.{{{",".join(self.img_suffixes)}}}) '
                                    f'in {img_dir!r}')
            data_list = [info for info in (self._image_info(p, []) for p in paths) if info is not None]
            if not data_list:
                raise DOTADataError(f'DOTADataset: none of the {len(paths)} images in {img_dir!r} can be '
                                    f'read (on_bad_image=\'skip\' left them all out)')
            return data_list
        if not osp.isdir(self.ann_file):
            raise DOTAAnnotationError(f'DOTADataset: ann_file must be a folder of DOTA txt files, '
                                      f'{self.ann_file!r} is not a folder')
        txts = sorted(glob.glob(osp.join(self.ann_file, '*.txt')))
        if not txts:
            raise DOTADataError(f'DOTADataset: no annotation files (*.txt) in {self.ann_file!r}')
        class_ids = {name: i for i, name in enumerate(self.metainfo['classes'])}
        unknown = Counter()  # class name -> objects dropped, over all files
        data_list = []
        for txt in txts:
            stem = osp.splitext(osp.basename(txt))[0]
            img_path = self._find_image(stem)
            if img_path is None:
                missing = f'{txt}: no image {stem}.{{{",".join(self.img_suffixes)}}} in {img_dir}'
                if self.on_bad_image == 'skip':
                    self._bad_image(osp.join(img_dir, f'{stem}.*'), f'missing (the image of {txt})')
                else:
                    self._bad(missing)
                continue
            info = self._image_info(img_path, self._parse_file(txt, class_ids, unknown))
            if info is not None:
                data_list.append(info)
        for name, count in sorted(unknown.items()):
            warnings.warn(f'DOTADataset: {count} object{"s" if count != 1 else ""} of unknown class '
                          f'{name!r} (not in metainfo.classes) {"were" if count != 1 else "was"} '
                          f'dropped ({self.ann_file})', DOTAAnnotationWarning)
        # mmengine fails on an empty list with "need at least one array to concatenate"
        if not data_list:
            bad = (f' ({len(self.skipped_images)} images left out as unreadable)'
                   if self.skipped_images else '')
            raise DOTADataError(f'DOTADataset: none of the {len(txts)} annotation files in '
                                f'{self.ann_file!r} has its image in {img_dir!r}{bad}')
        if not any(info['instances'] for info in data_list):
            found = (f'its objects are of the classes {sorted(unknown)}' if unknown
                     else 'its files hold no objects')
            raise DOTADataError(f'DOTADataset: no annotations of the classes '
                                f'{list(self.metainfo["classes"])} in {self.ann_file!r}: {found} '
                                f'(check metainfo.classes)')
        return data_list

    def _parse_file(self, txt: str, class_ids: dict, unknown: Counter) -> List[dict]:
        rows = []  # (line number, line, coords, class, difficulty)
        with open(txt) as f:
            lines = f.readlines()
        for number, line in enumerate(lines, start=1):
            try:
                parsed = parse_dota_line(line)
            except ValueError as error:
                self._bad(f'{txt}, line {number}: {error}: {line.strip()!r}')
                continue
            if parsed is not None:
                rows.append((number, line, *parsed))
        if not rows:
            return []
        # One minimum-area-rectangle fit per file (per line is slow on DOTA's dense images).
        rboxes = qbox2rbox(np.array([row[2] for row in rows], dtype=np.float64)).tolist()
        instances = []
        for (number, line, coords, name, difficulty), rbox in zip(rows, rboxes):
            if rbox[2] * rbox[3] <= 0:
                self._bad(f'{txt}, line {number}: degenerate polygon (zero area): {line.strip()!r}')
                continue
            if name not in class_ids:
                unknown[name] += 1
                continue
            ignore = self.ignore_difficult and difficulty >= 1
            instances.append(dict(bbox=rbox, bbox_label=class_ids[name], ignore_flag=int(ignore),
                                  polygon=coords, difficulty=difficulty))
        return instances

    def _image_info(self, img_path: str, instances: List[dict]) -> Optional[dict]:
        """The data info of one image; None for a bad image left out (on_bad_image='skip')."""
        size, problem = read_image_size(img_path)  # the header and the file's ends
        if problem is not None:
            self._bad_image(img_path, problem)
            return None
        width, height = size
        img_id = osp.splitext(osp.basename(img_path))[0]
        return dict(img_path=img_path, img_id=img_id, file_name=osp.basename(img_path),
                    width=width, height=height, instances=instances)

    def filter_data(self) -> List[dict]:
        """Drops images without non-ignored objects when filter_cfg.filter_empty_gt (training only)."""
        if self.test_mode or not self.filter_cfg or not self.filter_cfg.get('filter_empty_gt', False):
            return self.data_list
        kept = [info for info in self.data_list
                if any(not inst['ignore_flag'] for inst in info['instances'])]
        if not kept:  # every object is difficult
            raise DOTADataError(f'DOTADataset: no image in {self.ann_file!r} has an object that is '
                                f'not difficult (ignored); set ignore_difficult=False to train on them')
        return kept


@register(DATASETS)
class DOTAv15Dataset(DOTADataset):
    """DOTA-v1.5: DOTA-v1.0's classes and 'container-crane' (mmrotate's order and palette), with
    DOTADataset's arguments and rules (ignore_difficult=True: the devkit's rule)."""

    METAINFO = dict(classes=DOTA_V15_CLASSES,
                    palette=DOTADataset.METAINFO['palette'] + [(220, 20, 60)])


@register(DATASETS)
class DOTAv2Dataset(DOTADataset):
    """DOTA-v2.0: DOTA-v1.5's classes and 'airport', 'helipad' (mmrotate's order and palette), with
    DOTADataset's arguments and rules (ignore_difficult=True: the devkit's rule)."""

    METAINFO = dict(classes=DOTA_V2_CLASSES,
                    palette=DOTAv15Dataset.METAINFO['palette'] + [(119, 11, 32), (0, 0, 142)])
