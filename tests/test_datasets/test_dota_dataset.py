"""DOTADataset: parsing, difficult/ignore flags, empty images, bad lines, mmdet pipeline output."""
import math
import warnings

import cv2
import numpy as np
import pytest
import torch
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (DOTA_V1_CLASSES, DOTAAnnotationError, DOTAAnnotationWarning, DOTADataError,
                                   DOTADataset, parse_dota_line)
from redet_plugin.structures import RotatedBoxes

CLASSES = ('plane', 'ship', 'small-vehicle')


def write_dota(root, annotations, sizes=None, missing_images=()):
    """annotations: {stem: [lines]} -> root/images/<stem>.png + root/labelTxt/<stem>.txt."""
    (root / 'images').mkdir(parents=True, exist_ok=True)
    (root / 'labelTxt').mkdir(parents=True, exist_ok=True)
    for stem, lines in annotations.items():
        (root / 'labelTxt' / f'{stem}.txt').write_text(''.join(line + '\n' for line in lines))
        if stem not in missing_images:
            h, w = (sizes or {}).get(stem, (64, 80))
            cv2.imwrite(str(root / 'images' / f'{stem}.png'), np.zeros((h, w, 3), np.uint8))
    return root


def build(root, **kwargs):
    kwargs.setdefault('metainfo', dict(classes=CLASSES))
    return DOTADataset(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='images'),
                       pipeline=kwargs.pop('pipeline', []), **kwargs)


GOOD = {
    'a': ['imagesource:GoogleEarth', 'gsd:0.146', '10 10 30 10 30 20 10 20 plane 0',
          '40 40 50 40 50 60 40 60 ship 1', '5 5 9 5 9 7 5 7 small-vehicle 0', '1 1 2 1 2 2 1 2 harbor 0'],
    'b': ['imagesource:GoogleEarth', 'gsd:null'],
    'c': ['0 0 8 0 8 4 0 4 small-vehicle'],  # 9 fields: difficulty 0
}


def test_parse_dota_line():
    assert parse_dota_line('gsd:0.1') is None and parse_dota_line('  \n') is None
    assert parse_dota_line('1 2 3 4 5 6 7 8 plane 1') == ([1, 2, 3, 4, 5, 6, 7, 8], 'plane', 1)
    with pytest.raises(ValueError, match='9 or 10 fields'):
        parse_dota_line('1 2 3 plane 0')
    with pytest.raises(ValueError, match='numbers'):
        parse_dota_line('1 2 3 4 5 6 7 x plane 0')
    with pytest.raises(ValueError, match='difficulty'):
        parse_dota_line('1 2 3 4 5 6 7 8 plane hard')


def test_loads_instances_headers_difficult_and_classes(tmp_path):
    ds = build(write_dota(tmp_path, GOOD))
    assert len(ds) == 3 and ds.metainfo['classes'] == CLASSES
    info = ds.get_data_info(0)
    assert info['img_id'] == 'a' and (info['width'], info['height']) == (80, 64)
    inst = info['instances']
    assert [i['bbox_label'] for i in inst] == [0, 1, 2]  # harbor is not in classes: left out
    assert [i['ignore_flag'] for i in inst] == [0, 1, 0]
    assert inst[0]['bbox'] == pytest.approx([20, 15, 20, 10, 0], abs=1e-4)
    assert inst[1]['bbox'] == pytest.approx([45, 50, 20, 10, -math.pi / 2], abs=1e-4)  # tall: le90
    assert inst[0]['polygon'] == [10, 10, 30, 10, 30, 20, 10, 20]
    assert ds.get_data_info(1)['instances'] == []
    assert ds.get_data_info(2)['instances'][0]['ignore_flag'] == 0


def test_default_classes_are_dota_v1(tmp_path):
    ds = build(write_dota(tmp_path, GOOD), metainfo=None)
    assert ds.metainfo['classes'] == DOTA_V1_CLASSES and len(DOTA_V1_CLASSES) == 15
    assert len(ds.get_data_info(0)['instances']) == 4  # harbor is a DOTA class


def test_unknown_class_names_warn_once_per_name_with_their_count(tmp_path):
    """A misspelt class in the config ('small vehicle') would empty that class without a word."""
    root = write_dota(tmp_path, dict(GOOD, d=['1 1 9 1 9 5 1 5 small-vehicle 0', '1 1 9 1 9 5 1 5 ship 0',
                                              '2 2 9 2 9 5 2 5 small-vehicle 1']))
    with pytest.warns(DOTAAnnotationWarning) as record:
        ds = build(root, metainfo=dict(classes=('plane', 'ship', 'small vehicle')))
    messages = sorted(str(w.message) for w in record if w.category is DOTAAnnotationWarning)
    assert messages == [
        "DOTADataset: 1 object of unknown class 'harbor' (not in metainfo.classes) was dropped "
        f"({root / 'labelTxt'})",
        "DOTADataset: 4 objects of unknown class 'small-vehicle' (not in metainfo.classes) were "
        f"dropped ({root / 'labelTxt'})"]
    assert [i['bbox_label'] for i in ds.get_data_info(0)['instances']] == [0, 1]
    assert [i['bbox_label'] for i in ds.get_data_info(3)['instances']] == [1]  # the ship stays


def test_known_class_names_do_not_warn(tmp_path):
    root = write_dota(tmp_path, GOOD)
    with warnings.catch_warnings():
        warnings.simplefilter('error', DOTAAnnotationWarning)
        build(root, metainfo=None)  # DOTA-v1 classes: harbor included


def test_ignore_difficult_false_keeps_them_as_objects(tmp_path):
    ds = build(write_dota(tmp_path, GOOD), ignore_difficult=False)
    assert [i['ignore_flag'] for i in ds.get_data_info(0)['instances']] == [0, 0, 0]
    assert ds.get_data_info(0)['instances'][1]['difficulty'] == 1


def test_filter_empty_gt(tmp_path):
    root = write_dota(tmp_path, dict(GOOD, d=['1 1 9 1 9 5 1 5 ship 1']))  # only a difficult object
    assert len(build(root)) == 4
    filtered = build(root, filter_cfg=dict(filter_empty_gt=True))
    assert [filtered.get_data_info(i)['img_id'] for i in range(len(filtered))] == ['a', 'c']
    assert len(build(root, filter_cfg=dict(filter_empty_gt=True), test_mode=True)) == 4


BAD_LINES = [('1 2 3 plane 0', '9 or 10 fields'), ('1 2 3 4 5 6 7 oops plane 0', 'numbers'),
             ('0 0 5 5 10 10 15 15 plane 0', 'degenerate'), ('1 2 3 4 5 6 7 8 plane x', 'difficulty')]


@pytest.mark.parametrize('line,reason', BAD_LINES)
def test_bad_line_error_names_file_and_line(tmp_path, line, reason):
    root = write_dota(tmp_path, dict(GOOD, e=['gsd:1', '10 10 30 10 30 20 10 20 plane 0', line]))
    with pytest.raises(DOTAAnnotationError, match=rf'e\.txt, line 3: .*{reason}'):
        build(root)


@pytest.mark.parametrize('line,reason', BAD_LINES)
def test_bad_line_warn_skips_only_that_line(tmp_path, line, reason):
    root = write_dota(tmp_path, dict(GOOD, e=['gsd:1', '10 10 30 10 30 20 10 20 plane 0', line]))
    with pytest.warns(DOTAAnnotationWarning, match=rf'e\.txt, line 3: .*{reason}'):
        ds = build(root, on_bad_line='warn')
    assert len(ds) == 4
    assert len(ds.get_data_info(3)['instances']) == 1


def test_missing_image_error_or_skip(tmp_path):
    root = write_dota(tmp_path, GOOD, missing_images=('b',))
    with pytest.raises(DOTAAnnotationError, match=r'b\.txt: no image b\.'):
        build(root)
    with pytest.warns(DOTAAnnotationWarning, match=r'b\.txt: no image'):
        ds = build(root, on_bad_line='warn')
    assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == ['a', 'c']


def test_bad_arguments(tmp_path):
    root = write_dota(tmp_path, GOOD)
    with pytest.raises(ValueError, match="on_bad_line must be 'error' or 'warn', got 'skip'"):
        build(root, on_bad_line='skip')
    with pytest.raises(DOTAAnnotationError, match='not a folder'):
        DOTADataset(data_root=str(root), ann_file='nothing', data_prefix=dict(img_path='images'))
    with pytest.raises(DOTAAnnotationError, match='image folder'):
        DOTADataset(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='nothing'))


def test_no_annotations_lists_images(tmp_path):
    root = write_dota(tmp_path, GOOD)
    ds = DOTADataset(data_root=str(root), ann_file='', data_prefix=dict(img_path='images'), test_mode=True)
    assert [ds.get_data_info(i)['img_id'] for i in range(len(ds))] == ['a', 'b', 'c']
    assert all(ds.get_data_info(i)['instances'] == [] for i in range(3))


def test_mmdet_pipeline_packs_rotated_boxes(tmp_path):
    init_default_scope('mmdet')
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
                dict(type='Resize', scale=(160, 128), keep_ratio=True, clip_object_border=False),
                dict(type='RandomFlip', prob=1.0, direction='horizontal'),
                dict(type='Pad', size_divisor=32), dict(type='PackDetInputs')]
    ds = build(write_dota(tmp_path, GOOD), pipeline=pipeline)
    sample = ds[0]['data_samples']
    assert ds[0]['inputs'].shape == (3, 128, 160)
    gt, ignored = sample.gt_instances, sample.ignored_instances
    assert isinstance(gt.bboxes, RotatedBoxes) and isinstance(ignored.bboxes, RotatedBoxes)
    assert gt.labels.tolist() == [0, 2] and ignored.labels.tolist() == [1]
    # plane (20, 15, 20, 10, 0) scaled by 2, flipped in a 160-wide image
    assert torch.allclose(gt.bboxes.tensor[0], torch.tensor([120.0, 30.0, 40.0, 20.0, 0.0]), atol=1e-3)
    assert sample.img_id == 'a' and sample.scale_factor == (2.0, 2.0)
    empty = ds[1]['data_samples']
    assert empty.gt_instances.bboxes.tensor.shape == (0, 5)


def test_empty_data_sets_name_the_folder_and_the_cause(tmp_path):
    """mmengine fails on an empty data set with 'need at least one array to concatenate'."""
    (tmp_path / 'none' / 'images').mkdir(parents=True)
    (tmp_path / 'none' / 'labelTxt').mkdir()
    with pytest.raises(DOTADataError, match=r"no images \(\*\.\{png,jpg,tif,bmp\}\) in '.*none/images'"):
        DOTADataset(data_root=str(tmp_path / 'none'), ann_file='', data_prefix=dict(img_path='images'),
                    test_mode=True)
    with pytest.raises(DOTADataError, match=r"no annotation files \(\*\.txt\) in '.*none/labelTxt'"):
        build(tmp_path / 'none')
    root = write_dota(tmp_path / 'good', GOOD)
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(
            DOTADataError, match=r"no annotations of the classes \['bridge'\] in '.*labelTxt': its "
                                 r"objects are of the classes \['harbor', 'plane', 'ship', 'small-vehicle'\]"):
        build(root, metainfo=dict(classes=('bridge',)), test_mode=True)
    with pytest.raises(DOTADataError, match="no annotations of the classes .* its files hold no objects"):
        build(write_dota(tmp_path / 'blank', {'b': GOOD['b']}))
    only_difficult = write_dota(tmp_path / 'difficult', {'d': ['1 1 9 1 9 5 1 5 ship 1']})
    with pytest.raises(DOTADataError, match="no image in '.*labelTxt' has an object that is not difficult"):
        build(only_difficult, filter_cfg=dict(filter_empty_gt=True))
    assert len(build(only_difficult, filter_cfg=dict(filter_empty_gt=True), ignore_difficult=False)) == 1
