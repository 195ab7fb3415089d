"""HRSCDataset: the HRSC2016 layout, le90 boxes, parity with mmrotate's HRSCDataset on the same
files, the image height mmrotate gets wrong, the difficult rule, one-line errors naming the file
and the object, the synthetic HRSC layout.

The helpers at the top (write_image, write_xml, same_corners, compare_with_mmrotate) are shared
with test_dior_dataset.py and test_dota_versions.py."""
import math
import xml.etree.ElementTree as ET

import cv2
import numpy as np
import pytest
import torch
from mmengine.registry import init_default_scope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (HRSC_CLASS_IDS, HRSC_CLASSES, DOTAAnnotationWarning, DOTADataError,
                                   HRSCAnnotationError, HRSCDataset, generate_synthetic_hrsc)
from redet_plugin.structures import RotatedBoxes, rbox2qbox

from tests._helpers import register_mmrotate


# ---- shared helpers -----------------------------------------------------------------------------
def write_image(path, width, height):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((height, width, 3), 90, np.uint8))


def write_xml(path, root_tag, fields):
    """fields: [(tag, text or a nested list of fields)]; a text of None leaves the element out."""
    def fill(parent, items):
        for tag, value in items:
            if value is None:
                continue
            node = ET.SubElement(parent, tag)
            if isinstance(value, list):
                fill(node, value)
            else:
                node.text = str(value)
    root = ET.Element(root_tag)
    fill(root, fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(str(path))


def same_corners(ours, theirs, atol=1e-3):
    """Two quadrilaterals (8 numbers) are the same: the same corners in turn, from any corner, in
    either direction (mmrotate's rbox2qbox goes anticlockwise on screen, ours clockwise)."""
    a, b = np.asarray(ours, float).reshape(4, 2), np.asarray(theirs, float).reshape(4, 2)
    return any(np.allclose(np.roll(order, k, axis=0), b, atol=atol) for order in (a, a[::-1])
               for k in range(4))


def compare_with_mmrotate(ours, theirs, corners_of_theirs=lambda inst: inst['bbox'], rbox_atol=1e-3):
    """Same images (ids, paths, widths; matched by id: mmrotate's DOTADataset lists them in glob
    order), per object the same label, ignore flag and corners, and our le90 rbox is the rotated
    box mmrotate's pipeline makes of the corners (its qbox2rbox, in its own representation: the
    two boxes' corners are compared; mmcv's rotated IoU is not exact for nearly equal boxes).
    rbox_atol: the corners' tolerance. Where the quadrilaterals are not exact rectangles (corners
    rounded to 0.1 px, as DOTA's), two minimum-area fits (mmrotate's runs in float32 on uncentred
    coordinates) can land on different, equally small rectangles, up to the rounding apart.
    Returns the number of objects."""
    from mmrotate.structures.bbox import qbox2rbox as mmrotate_qbox2rbox
    from mmrotate.structures.bbox import rbox2qbox as mmrotate_rbox2qbox
    theirs_by_id = {info['img_id']: info for info in (theirs.get_data_info(i) for i in range(len(theirs)))}
    assert sorted(ours.get_data_info(i)['img_id'] for i in range(len(ours))) == sorted(theirs_by_id)
    objects = 0
    for i in range(len(ours)):
        a = ours.get_data_info(i)
        b = theirs_by_id[a['img_id']]
        assert a['img_path'] == b['img_path'] and a['width'] == b.get('width', a['width'])
        assert [x['bbox_label'] for x in a['instances']] == [x['bbox_label'] for x in b['instances']]
        assert [x['ignore_flag'] for x in a['instances']] == [x['ignore_flag'] for x in b['instances']]
        for mine, other in zip(a['instances'], b['instances']):
            corners = corners_of_theirs(other)
            assert same_corners(mine['polygon'], corners), (a['img_id'], mine, other)
            theirs_rbox = mmrotate_qbox2rbox(torch.tensor(list(corners), dtype=torch.float32)).double()
            assert same_corners(rbox2qbox(torch.tensor(mine['bbox'], dtype=torch.float64)).tolist(),
                                mmrotate_rbox2qbox(theirs_rbox).tolist(), atol=rbox_atol), (a['img_id'], mine, other)
            objects += 1
    return objects


# ---- HRSC files ---------------------------------------------------------------------------------
def hrsc_object(rbox, class_id=HRSC_CLASS_IDS[0], difficult=0, head=(0, 0), object_id=None, without=()):
    """An HRSC_Object; `without`: tags left out."""
    fields = [('Object_ID', object_id), ('Class_ID', class_id), ('difficult', difficult),
              *zip(('mbox_cx', 'mbox_cy', 'mbox_w', 'mbox_h', 'mbox_ang'), rbox),
              ('header_x', head[0]), ('header_y', head[1])]
    return 'HRSC_Object', [(tag, value) for tag, value in fields if tag not in without]


def write_hrsc(root, images, split='trainval', size_fields=True, append=False):
    """images: {img_id: (width, height, [hrsc_object(...)])} -> the HRSC2016 layout under root."""
    for img_id, (width, height, objects) in images.items():
        write_image(root / 'FullDataSet' / 'AllImages' / f'{img_id}.bmp', width, height)
        size = [('Img_SizeWidth', width), ('Img_SizeHeight', height)] if size_fields else []
        write_xml(root / 'FullDataSet' / 'Annotations' / f'{img_id}.xml', 'HRSC_Image',
                  [('Img_ID', img_id), *size, ('HRSC_Objects', list(objects))])
    (root / 'ImageSets').mkdir(parents=True, exist_ok=True)
    with open(root / 'ImageSets' / f'{split}.txt', 'a' if append else 'w') as f:
        f.write(''.join(f'{img_id}\n' for img_id in images))
    return root


def build(root, split='trainval', **kwargs):
    return HRSCDataset(data_root=str(root), ann_file=f'ImageSets/{split}.txt',
                       data_prefix=dict(sub_data_root='FullDataSet/'), pipeline=kwargs.pop('pipeline', []),
                       **kwargs)


def mmrotate_build(root, split='trainval', **kwargs):
    register_mmrotate()
    from mmrotate.datasets import HRSCDataset as MMRotateHRSCDataset
    return MMRotateHRSCDataset(data_root=str(root), ann_file=f'ImageSets/{split}.txt',
                               data_prefix=dict(sub_data_root='FullDataSet/'), pipeline=[], **kwargs)


NIMITZ = HRSC_CLASS_IDS[HRSC_CLASSES.index('Nimitz')]
HAND = {  # a wide image with boxes that le90 turns (tall, angles out of [-pi/2, pi/2)) and classes
    'wide': (300, 200, [hrsc_object((100, 80, 60, 20, 0.3), head=(128, 89), object_id=1),
                        hrsc_object((150, 120, 20, 50, 0.1), NIMITZ, difficult=1, object_id=2),
                        hrsc_object((60, 150, 40, 12, 2.5), HRSC_CLASS_IDS[3], object_id=3)]),
    'empty': (120, 90, []),
}


@pytest.fixture(scope='module')
def synthetic_root(tmp_path_factory):
    """The synthetic HRSC layout (ships of four classes) and the hand-written images."""
    root = tmp_path_factory.mktemp('hrsc')
    generate_synthetic_hrsc(str(root), num_trainval=4, num_test=2, image_size=96, seed=3,
                            class_ids=HRSC_CLASS_IDS[:4])
    return write_hrsc(root, HAND, append=True)


def test_loads_le90_rboxes_corners_heads_and_sizes(tmp_path):
    ds = build(write_hrsc(tmp_path, HAND))
    assert ds.metainfo['classes'] == ('ship',) and ds.metainfo['ignore_difficult'] is False
    info = ds.get_data_info(0)
    assert (info['img_id'], info['width'], info['height']) == ('wide', 300, 200)
    assert info['img_path'].endswith('FullDataSet/AllImages/wide.bmp')
    first, tall, turned = info['instances']
    assert first['bbox'] == pytest.approx([100, 80, 60, 20, 0.3])
    assert tall['bbox'] == pytest.approx([150, 120, 50, 20, 0.1 - math.pi / 2])  # w >= h
    assert turned['bbox'] == pytest.approx([60, 150, 40, 12, 2.5 - math.pi])  # theta in [-pi/2, pi/2)
    assert first['polygon'] == pytest.approx(rbox2qbox(torch.tensor([100., 80, 60, 20, 0.3])).tolist())
    assert first['head'] == [128, 89]
    assert [i['bbox_label'] for i in info['instances']] == [0, 0, 0]  # classwise=False: all ships
    assert [i['ignore_flag'] for i in info['instances']] == [0, 0, 0]  # mmrotate: difficult kept
    assert ds.get_data_info(1)['instances'] == []


def test_height_is_img_size_height_where_mmrotate_reads_the_width(tmp_path):
    root = write_hrsc(tmp_path, HAND)
    ours, theirs = build(root).get_data_info(0), mmrotate_build(root).get_data_info(0)
    assert (ours['width'], ours['height']) == (300, 200)
    assert (theirs['width'], theirs['height']) == (300, 300)  # mmrotate 1.x: Img_SizeWidth twice


def test_size_from_the_image_without_size_fields(tmp_path):
    info = build(write_hrsc(tmp_path, HAND, size_fields=False)).get_data_info(0)
    assert (info['width'], info['height']) == (300, 200)


@pytest.mark.parametrize('classwise', [False, True])
def test_same_objects_as_mmrotate(synthetic_root, classwise):
    ours, theirs = build(synthetic_root, classwise=classwise), mmrotate_build(synthetic_root, classwise=classwise)
    assert compare_with_mmrotate(ours, theirs) > 10
    assert ours.metainfo['classes'] == theirs.metainfo['classes']
    assert len(ours.metainfo['classes']) == (31 if classwise else 1)
    labels = {x['bbox_label'] for i in range(len(ours)) for x in ours.get_data_info(i)['instances']}
    assert labels == ({0, 1, 2, 3, HRSC_CLASSES.index('Nimitz')} if classwise else {0})
    heads = [[x['head'] for x in ds.get_data_info(i)['instances']] for ds in (ours, theirs)
             for i in range(len(ds))]
    assert heads[:len(ours)] == heads[len(ours):]
    assert compare_with_mmrotate(build(synthetic_root, 'test', classwise=classwise),
                                 mmrotate_build(synthetic_root, 'test', classwise=classwise)) > 0


def test_bbox_min_size_as_mmrotate(synthetic_root):
    cfg = dict(bbox_min_size=12)
    ours, theirs = build(synthetic_root, filter_cfg=cfg), mmrotate_build(synthetic_root, filter_cfg=cfg)
    compare_with_mmrotate(ours, theirs)
    flags = [x['ignore_flag'] for i in range(len(ours)) for x in ours.get_data_info(i)['instances']]
    assert 0 < sum(flags) < len(flags)
    assert not any(x['ignore_flag'] for i in range(len(ours))  # test_mode: no object ignored
                   for x in build(synthetic_root, filter_cfg=cfg, test_mode=True).get_data_info(i)['instances'])


def test_ignore_difficult_is_the_devkit_rule(tmp_path):
    root = write_hrsc(tmp_path, dict(HAND, hard=(100, 100, [hrsc_object((50, 50, 30, 10, 0), difficult=1)])))
    ds = build(root, ignore_difficult=True)
    assert ds.metainfo['ignore_difficult'] is True
    assert [i['ignore_flag'] for i in ds.get_data_info(0)['instances']] == [0, 1, 0]
    kept = build(root, ignore_difficult=True, filter_cfg=dict(filter_empty_gt=True))
    assert [kept.get_data_info(i)['img_id'] for i in range(len(kept))] == ['wide']
    assert len(build(root, filter_cfg=dict(filter_empty_gt=True))) == 2  # 'hard' is ground truth
    with pytest.raises(DOTADataError, match=r"filter_cfg .* leaves no image of '.*trainval\.txt'"):
        build(root, filter_cfg=dict(min_size=400))


def test_mmdet_pipeline_and_registry(tmp_path):
    init_default_scope('mmdet')
    from mmdet.registry import DATASETS
    assert DATASETS.get('RedetHRSCDataset') is HRSCDataset
    pipeline = [dict(type='LoadImageFromFile'), dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox'),
                dict(type='PackDetInputs')]
    # mmrotate's config with the type swapped
    ds = DATASETS.build(dict(type='RedetHRSCDataset', data_root=str(write_hrsc(tmp_path, HAND)),
                             ann_file='ImageSets/trainval.txt', data_prefix=dict(sub_data_root='FullDataSet/'),
                             classwise=False, filter_cfg=dict(filter_empty_gt=True), pipeline=pipeline,
                             backend_args=None))
    sample = ds[0]['data_samples']
    assert isinstance(sample.gt_instances.bboxes, RotatedBoxes) and len(sample.gt_instances) == 3
    assert torch.allclose(sample.gt_instances.bboxes.tensor[0], torch.tensor([100., 80, 60, 20, 0.3]))
    assert ds[0]['inputs'].shape == (3, 200, 300)


# ---- errors: one line, naming the file and the object ---------------------------------------------
def broken(tmp_path, obj, **kwargs):
    good = hrsc_object((40, 40, 30, 10, 0), object_id=6)
    return build(write_hrsc(tmp_path, dict(HAND, b=(100, 100, [good, obj]))), **kwargs)


@pytest.mark.parametrize('tag', ['mbox_cx', 'mbox_cy', 'mbox_w', 'mbox_h', 'mbox_ang'])
def test_missing_box_field_names_file_and_object(tmp_path, tag):
    with pytest.raises(HRSCAnnotationError, match=rf'b\.xml, object 2 \(Object_ID 7\): no <{tag}>$') as error:
        broken(tmp_path, hrsc_object((50, 50, 30, 10, 0.2), object_id=7, without=(tag,)))
    assert isinstance(error.value, DOTADataError) and '\n' not in str(error.value)


def test_bad_class_id_names_file_object_and_id(tmp_path):
    bad = hrsc_object((50, 50, 30, 10, 0.2), class_id='100000099')
    with pytest.raises(HRSCAnnotationError, match=r"b\.xml, object 2: Class_ID '100000099' is not an "
                                                  r"HRSC2016 class id"):
        broken(tmp_path, bad, classwise=True)
    assert len(broken(tmp_path, bad)) == 3  # one class: the Class_ID is not read
    with pytest.raises(HRSCAnnotationError, match=r'b\.xml, object 2: no <Class_ID> \(classwise=True'):
        broken(tmp_path, hrsc_object((50, 50, 30, 10, 0.2), without=('Class_ID',)), classwise=True)


@pytest.mark.parametrize('rbox,message', [((50, 'x', 30, 10, 0), "<mbox_cy> must be a number, got 'x'"),
                                          ((50, 50, 0, 10, 0), 'mbox_w and mbox_h must be > 0'),
                                          ((50, 50, 30, 10, 'nan'), '<mbox_ang> must be finite')])
def test_bad_values_name_file_and_object(tmp_path, rbox, message):
    with pytest.raises(HRSCAnnotationError, match=rf'b\.xml, object 2: {message}'):
        broken(tmp_path, hrsc_object(rbox))


def test_missing_files_are_named(tmp_path):
    root = write_hrsc(tmp_path, HAND)
    (root / 'FullDataSet' / 'AllImages' / 'empty.bmp').unlink()
    with pytest.raises(HRSCAnnotationError, match=r"image id 'empty' of .*trainval\.txt: no file .*empty\.bmp"):
        build(root)
    (root / 'FullDataSet' / 'Annotations' / 'wide.xml').unlink()
    with pytest.raises(HRSCAnnotationError, match=r"no file .*Annotations/wide\.xml"):
        build(root)
    with pytest.raises(HRSCAnnotationError, match=r"ann_file '.*val\.txt' \(the list of image ids"):
        build(root, split='val')
    with pytest.raises(HRSCAnnotationError, match=r"img_subdir folder '.*FullDataSet/Pictures'"):
        build(root, img_subdir='Pictures')
    (root / 'FullDataSet' / 'Annotations' / 'wide.xml').write_text('<HRSC_Image>')
    write_image(root / 'FullDataSet' / 'AllImages' / 'empty.bmp', 10, 10)
    with pytest.raises(HRSCAnnotationError, match=r'wide\.xml: not valid XML'):
        build(root)


def test_classes_matching_no_object_name_the_folder(tmp_path):
    root = write_hrsc(tmp_path, HAND)
    with pytest.warns(DOTAAnnotationWarning) as record, pytest.raises(
            DOTADataError, match=r"no annotations of the classes \['Kitty Hawk'\] in '.*FullDataSet/Annotations' "
                                 r".*its objects are of the classes \['Nimitz', 'merchant ship', 'ship'\]"):
        build(root, classwise=True, metainfo=dict(classes=('Kitty Hawk',)))
    assert len(record) == 3 and "1 object of class 'ship' (not in metainfo.classes)" in str(record[-1].message)
    with pytest.raises(DOTADataError, match=r"no annotations of the classes \['ship'\] .* its files hold no objects"):
        build(write_hrsc(tmp_path / 'blank', {'empty': HAND['empty']}))


def test_classwise_classes(tmp_path):
    root = write_hrsc(tmp_path, HAND)
    ds = build(root, classwise=True)
    assert ds.metainfo['classes'] == HRSC_CLASSES and len(ds.metainfo['palette']) == 31
    assert [i['bbox_label'] for i in ds.get_data_info(0)['instances']] == [0, 4, 3]
    with pytest.warns(DOTAAnnotationWarning, match=r"1 object of class 'merchant ship'"):
        subset = build(root, classwise=True, metainfo=dict(classes=('Nimitz', 'ship')))
    assert [i['bbox_label'] for i in subset.get_data_info(0)['instances']] == [1, 0]
    with pytest.raises(ValueError, match=r"metainfo.classes \['boat'\] are not HRSC2016 classes"):
        build(root, classwise=True, metainfo=dict(classes=('boat', 'ship')))
    with pytest.raises(ValueError, match=r'classwise=False has one class .* names 2'):
        build(root, metainfo=dict(classes=('ship', 'Nimitz')))
    assert build(root, metainfo=dict(classes=('vessel',))).metainfo['classes'] == ('vessel',)


def test_synthetic_hrsc_layout(tmp_path):
    params = generate_synthetic_hrsc(str(tmp_path / 'a'), num_trainval=3, num_test=1, image_size=64, seed=5)
    assert params['class_ids'] == [HRSC_CLASS_IDS[0]]
    ds = build(tmp_path / 'a', classwise=True)
    assert len(ds) == 3 and len(build(tmp_path / 'a', 'test')) == 1
    instances = [x for i in range(3) for x in ds.get_data_info(i)['instances']]
    assert {x['bbox_label'] for x in instances} == {0}
    for x in instances:  # inside the image, the bow at one end of the long side
        cx, cy, w, h, theta = x['bbox']
        assert 0 < cx < 64 and 0 < cy < 64 and w >= h > 0
        along = abs((x['head'][0] - cx) * math.cos(theta) + (x['head'][1] - cy) * math.sin(theta))
        assert along == pytest.approx(w / 2, abs=1.0)
    generate_synthetic_hrsc(str(tmp_path / 'b'), num_trainval=3, num_test=1, image_size=64, seed=5)
    for name in ('FullDataSet/Annotations/trainval_00002.xml', 'FullDataSet/AllImages/test_00000.bmp'):
        assert (tmp_path / 'a' / name).read_bytes() == (tmp_path / 'b' / name).read_bytes()
    with pytest.raises(ValueError, match=r'class_ids must be HRSC2016 Class_IDs'):
        generate_synthetic_hrsc(str(tmp_path / 'c'), 1, 1, 64, class_ids=('100000021',))
