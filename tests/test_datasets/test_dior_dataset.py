"""DIORDataset: the DIOR-R layout, parity with mmrotate's DIORDataset on the same files (oriented
and horizontal boxes, class names in any case), the difficult rule, one-line errors naming the
file and the object, the synthetic DIOR layout."""
import pytest
import torch
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (DIOR_CLASSES, SYNTHETIC_DIOR_CLASSES, DIORAnnotationError, DIORDataset,
                                   DOTAAnnotationWarning, DOTADataError, generate_synthetic_dior)
from redet_plugin.structures import RotatedBoxes

from tests._helpers import register_mmrotate
from tests.test_datasets.test_hrsc_dataset import compare_with_mmrotate, write_image, write_xml

ANN = 'Annotations/Oriented Bounding Boxes'
CORNER_TAGS = ('x_left_top', 'y_left_top', 'x_right_top', 'y_right_top', 'x_right_bottom', 'y_right_bottom',
               'x_left_bottom', 'y_left_bottom')


def dior_object(name, corners, difficult=0, without=()):
    """A DIOR-R <object> with <robndbox> corners and the enclosing <bndbox>; `without`: tags
    left out (of the object or of its boxes)."""
    xs, ys = corners[0::2], corners[1::2]
    robndbox = [(tag, value) for tag, value in zip(CORNER_TAGS, corners) if tag not in without]
    numbers = all(isinstance(v, (int, float)) for v in corners)
    bndbox = [('xmin', min(xs)), ('ymin', min(ys)), ('xmax', max(xs)), ('ymax', max(ys))] if numbers else []
    fields = [('name', name), ('difficult', difficult), ('type', 'robndbox'), ('robndbox', robndbox),
              ('bndbox', bndbox)]
    return 'object', [(tag, value) for tag, value in fields if tag not in without]


def write_dior(root, images, split='train', size=True, append=False):
    """images: {img_id: (width, height, [dior_object(...)])} -> the DIOR-R layout under root."""
    folder = 'JPEGImages-test' if split == 'test' else 'JPEGImages-trainval'
    for img_id, (width, height, objects) in images.items():
        write_image(root / folder / f'{img_id}.jpg', width, height)
        size_field = [('size', [('width', width), ('height', height), ('depth', 3)])] if size else []
        write_xml(root / ANN / f'{img_id}.xml', 'annotation', [('filename', f'{img_id}.jpg'), *size_field,
                                                               *objects])
    (root / 'ImageSets' / 'Main').mkdir(parents=True, exist_ok=True)
    with open(root / 'ImageSets' / 'Main' / f'{split}.txt', 'a' if append else 'w') as f:
        f.write(''.join(f'{img_id}\n' for img_id in images))
    return root


def build(root, split='train', **kwargs):
    folder = 'JPEGImages-test' if split == 'test' else 'JPEGImages-trainval'
    return DIORDataset(data_root=str(root), ann_file=f'ImageSets/Main/{split}.txt',
                       data_prefix=dict(img_path=folder), pipeline=kwargs.pop('pipeline', []), **kwargs)


def mmrotate_build(root, split='train', **kwargs):
    register_mmrotate()
    from mmrotate.datasets import DIORDataset as MMRotateDIORDataset
    folder = 'JPEGImages-test' if split == 'test' else 'JPEGImages-trainval'
    return MMRotateDIORDataset(data_root=str(root), ann_file=f'ImageSets/Main/{split}.txt',
                               data_prefix=dict(img_path=folder), pipeline=[], **kwargs)


HAND = {  # DIOR-R's own spellings: some names capitalised
    'hand': (160, 120, [dior_object('Expressway-Service-area', [10, 10, 70, 10, 70, 50, 10, 50]),
                        dior_object('Airplane', [100, 20, 130, 50, 110, 70, 80, 40], difficult=1),
                        dior_object('vehicle', [20, 80, 30, 80, 30, 100, 20, 100])]),
}


@pytest.fixture(scope='module')
def synthetic_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('dior')
    generate_synthetic_dior(str(root), num_trainval=4, num_test=2, image_size=96, seed=2)
    return write_dior(root, HAND, append=True)


def test_loads_rboxes_corners_and_names_in_any_case(tmp_path):
    ds = build(write_dior(tmp_path, HAND))
    assert ds.metainfo['classes'] == DIOR_CLASSES and ds.metainfo['ignore_difficult'] is False
    info = ds.get_data_info(0)
    assert (info['img_id'], info['width'], info['height']) == ('hand', 160, 120)
    service, plane, vehicle = info['instances']
    assert [service['bbox_label'], plane['bbox_label'], vehicle['bbox_label']] == [
        DIOR_CLASSES.index('expressway-service-area'), 0, DIOR_CLASSES.index('vehicle')]
    assert service['bbox'] == pytest.approx([40, 30, 60, 40, 0], abs=1e-4)
    assert vehicle['bbox'] == pytest.approx([25, 90, 20, 10, -1.5707963], abs=1e-4)  # tall: le90
    assert plane['polygon'] == [100, 20, 130, 50, 110, 70, 80, 40]
    assert [i['ignore_flag'] for i in info['instances']] == [0, 0, 0]  # mmrotate: difficult kept


@pytest.mark.parametrize('ann_type', ['obb', 'hbb'])
def test_same_objects_as_mmrotate(synthetic_root, ann_type):
    for split in ('train', 'val', 'test'):
        ours = build(synthetic_root, split, ann_type=ann_type)
        theirs = mmrotate_build(synthetic_root, split, ann_type=ann_type)
        assert compare_with_mmrotate(ours, theirs) > 3
        assert [ours.get_data_info(i)['height'] for i in range(len(ours))] == \
               [theirs.get_data_info(i)['height'] for i in range(len(theirs))]
    assert ours.metainfo['classes'] == theirs.metainfo['classes']


def test_size_from_the_image_without_size_element(tmp_path):
    root = write_dior(tmp_path, HAND, size=False)
    assert (build(root).get_data_info(0)['width'], build(root).get_data_info(0)['height']) == (160, 120)
    theirs = mmrotate_build(root).get_data_info(0)
    assert (theirs['width'], theirs['height']) == (120, 160)  # mmrotate 1.x swaps them


def test_ignore_difficult_and_bbox_min_size(tmp_path):
    root = write_dior(tmp_path, HAND)
    devkit = build(root, ignore_difficult=True)
    assert devkit.metainfo['ignore_difficult'] is True
    assert [i['ignore_flag'] for i in devkit.get_data_info(0)['instances']] == [0, 1, 0]
    # the object's shorter side (the vehicle's 10 px), not the image's as mmrotate compares
    small = build(root, filter_cfg=dict(bbox_min_size=15))
    assert [i['ignore_flag'] for i in small.get_data_info(0)['instances']] == [0, 0, 1]
    assert [i['ignore_flag'] for i in mmrotate_build(root, filter_cfg=dict(bbox_min_size=15))
            .get_data_info(0)['instances']] == [0, 0, 0]


def test_mmdet_pipeline_and_registry(tmp_path):
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    assert DATASETS.get('RedetDIORDataset') is DIORDataset
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
                dict(type='PackDetInputs')]
    ds = DATASETS.build(dict(type='RedetDIORDataset', data_root=str(write_dior(tmp_path, HAND)),
                             ann_file='ImageSets/Main/train.txt', data_prefix=dict(img_path='JPEGImages-trainval'),
                             filter_cfg=dict(filter_empty_gt=True), pipeline=pipeline))
    gt = ds[0]['data_samples'].gt_instances
    assert isinstance(gt.bboxes, RotatedBoxes) and len(gt) == 3
    assert torch.allclose(gt.bboxes.tensor[0], torch.tensor([40., 30, 60, 40, 0]), atol=1e-4)


# ---- errors: one line, naming the file and the object ---------------------------------------------
def with_object(tmp_path, obj, **kwargs):
    return build(write_dior(tmp_path, dict(HAND, b=(100, 100, [HAND['hand'][2][2], obj]))), **kwargs)


@pytest.mark.parametrize('tag,message', [
    ('y_left_bottom', r'object 2 \(ship\), <robndbox>: no <y_left_bottom>$'),
    ('robndbox', r"object 2 \(ship\): no <robndbox> \(ann_type='obb'\)$"),
    ('name', r'object 2: no <name>$')])
def test_missing_fields_name_file_and_object(tmp_path, tag, message):
    with pytest.raises(DIORAnnotationError, match=rf'b\.xml, {message}') as error:
        with_object(tmp_path, dior_object('ship', [1, 1, 9, 1, 9, 5, 1, 5], without=(tag,)))
    assert isinstance(error.value, DOTADataError) and '\n' not in str(error.value)


def test_bad_values_name_file_and_object(tmp_path):
    with pytest.raises(DIORAnnotationError, match=r"b\.xml, object 2 \(ship\), <robndbox>: <x_right_top> "
                                                  r"must be a number, got 'x'"):
        with_object(tmp_path, dior_object('ship', [1, 1, 'x', 1, 9, 5, 1, 5]))
    with pytest.raises(DIORAnnotationError, match=r'b\.xml, object 2 \(ship\): degenerate box'):
        with_object(tmp_path, dior_object('ship', [0, 0, 5, 5, 10, 10, 15, 15]))
    with pytest.raises(ValueError, match=r"ann_type must be 'obb' or 'hbb', got 'qbb'"):
        build(tmp_path, ann_type='qbb')


def test_unknown_classes_left_out_with_a_warning(tmp_path):
    with pytest.warns(DOTAAnnotationWarning, match=r"1 object of class 'boat' \(not in metainfo.classes\) left out"):
        ds = with_object(tmp_path, dior_object('Boat', [1, 1, 9, 1, 9, 5, 1, 5]))
    assert len(ds.get_data_info(1)['instances']) == 1


def test_classes_matching_no_object_name_the_folder(tmp_path):
    root = write_dior(tmp_path, HAND)
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(
            DOTADataError, match=r"no annotations of the classes \['dam'\] in '.*Annotations/Oriented Bounding "
                                 r"Boxes' .*its objects are of the classes \['airplane', "
                                 r"'expressway-service-area', 'vehicle'\]"):
        build(root, metainfo=dict(classes=('dam',)))
    (write_dior(tmp_path / 'missing', HAND, split='test') / 'JPEGImages-test' / 'hand.jpg').unlink()
    with pytest.raises(DIORAnnotationError,
                       match=r"image id 'hand' of .*test\.txt: no file .*JPEGImages-test/hand\.jpg"):
        build(tmp_path / 'missing', 'test')


def test_synthetic_dior_layout(tmp_path):
    params = generate_synthetic_dior(str(tmp_path), num_trainval=5, num_test=2, image_size=64, seed=1)
    assert params['classes'] == list(SYNTHETIC_DIOR_CLASSES)
    lists = {name: (tmp_path / 'ImageSets' / 'Main' / f'{name}.txt').read_text().split()
             for name in ('train', 'val', 'trainval', 'test')}
    assert lists['train'] + lists['val'] == lists['trainval'] and len(lists['train']) == 3
    assert sorted(p.name for p in (tmp_path / 'JPEGImages-test').iterdir()) == ['test_00000.jpg', 'test_00001.jpg']
    ds = build(tmp_path, 'trainval', metainfo=dict(classes=SYNTHETIC_DIOR_CLASSES))
    labels = {x['bbox_label'] for i in range(len(ds)) for x in ds.get_data_info(i)['instances']}
    assert len(ds) == 5 and labels <= set(range(5)) and len(labels) >= 3
    assert len(build(tmp_path, 'test', ann_type='hbb')) == 2


@pytest.mark.parametrize('layout', ['hrsc', 'dior'])
def test_make_synthetic_tool_layouts(tmp_path, monkeypatch, layout):
    from tests.test_tools.test_data_tools import run_tool
    from tests.test_datasets.test_hrsc_dataset import build as build_hrsc
    run_tool('dataset_converters/make_synthetic_dota.py', [str(tmp_path), '--layout', layout, '--num-train', '2',
                                             '--num-val', '1', '--image-size', '64'], monkeypatch)
    ds = build_hrsc(tmp_path, 'test') if layout == 'hrsc' else build(tmp_path, 'test')
    assert len(ds) == 1 and ds.get_data_info(0)['width'] == 64
    with pytest.raises(SystemExit, match=f'--classes for --layout {layout}'):
        run_tool('dataset_converters/make_synthetic_dota.py', [str(tmp_path), '--layout', layout, '--classes', 'plane'],
                 monkeypatch)
