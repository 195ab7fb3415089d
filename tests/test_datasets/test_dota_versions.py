"""DOTA-v1.5 and DOTA-v2.0: mmrotate's class tables and palettes, DOTADataset's rules (the
devkit's difficult rule by default, mmrotate's by ignore_difficult=False), parity with mmrotate's
DOTAv15Dataset / DOTAv2Dataset on the same files."""
import numpy as np
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (DOTA_V1_CLASSES, DOTA_V15_CLASSES, DOTA_V2_CLASSES, DOTAAnnotationWarning,
                                   DOTADataError, DOTAv15Dataset, DOTAv2Dataset)
from redet_plugin.structures import rbox2qbox

from tests._helpers import register_mmrotate
from tests.test_datasets.test_hrsc_dataset import compare_with_mmrotate, write_image

VERSIONS = [(DOTAv15Dataset, 'DOTAv15Dataset', DOTA_V15_CLASSES), (DOTAv2Dataset, 'DOTAv2Dataset', DOTA_V2_CLASSES)]


def write_dota(root, classes, images=4, seed=0):
    """DOTA files (10 fields, as mmrotate reads them) with objects of every class in `classes`,
    difficulty 0, 1 or 2."""
    rng = np.random.default_rng(seed)
    for i in range(images):
        lines = []
        for k in range(8):
            rbox = [rng.uniform(20, 108), rng.uniform(20, 108), rng.uniform(8, 30), rng.uniform(4, 20),
                    rng.uniform(-np.pi, np.pi)]
            corners = rbox2qbox(torch.tensor(rbox, dtype=torch.float64)).tolist()
            name = classes[(i * 8 + k) % len(classes)]
            lines.append(' '.join(f'{v:.1f}' for v in corners) + f' {name} {int(rng.choice([0, 0, 1, 2]))}\n')
        (root / 'labelTxt').mkdir(parents=True, exist_ok=True)
        (root / 'labelTxt' / f'img{i}.txt').write_text(''.join(lines))
        write_image(root / 'images' / f'img{i}.png', 128, 128)
    return root


def build(cls, root, **kwargs):
    return cls(data_root=str(root), ann_file='labelTxt', data_prefix=dict(img_path='images'), pipeline=[],
               **kwargs)


def mmrotate_build(name, root, **kwargs):
    register_mmrotate()
    import mmrotate.datasets
    return getattr(mmrotate.datasets, name)(data_root=str(root), ann_file='labelTxt/',
                                            data_prefix=dict(img_path='images/'), pipeline=[], **kwargs)


@pytest.mark.parametrize('cls,name,classes', VERSIONS)
def test_class_tables_and_palettes_are_mmrotates(cls, name, classes):
    register_mmrotate()
    import mmrotate.datasets
    theirs = getattr(mmrotate.datasets, name).METAINFO
    assert cls.METAINFO['classes'] == classes == theirs['classes']
    assert list(cls.METAINFO['palette']) == list(theirs['palette'])
    assert classes[:15] == DOTA_V1_CLASSES and len(classes) == {'DOTAv15Dataset': 16, 'DOTAv2Dataset': 18}[name]
    from mmdet.registry import DATASETS
    assert DATASETS.get(f'Redet{name}') is cls


@pytest.mark.parametrize('cls,name,classes', VERSIONS)
def test_same_objects_as_mmrotate_under_both_rules(tmp_path, cls, name, classes):
    root = write_dota(tmp_path, classes)
    devkit = build(cls, root)  # DOTADataset's default: the devkit's rule
    assert devkit.metainfo['ignore_difficult'] is True and devkit.metainfo['classes'] == classes
    kept = build(cls, root, ignore_difficult=False)
    assert kept.metainfo['ignore_difficult'] is False
    # mmrotate's default diff_thr=100 keeps every object; diff_thr=0 ignores the difficult ones
    assert compare_with_mmrotate(kept, mmrotate_build(name, root), rbox_atol=0.1) == 32
    assert compare_with_mmrotate(devkit, mmrotate_build(name, root, diff_thr=0), rbox_atol=0.1) == 32
    flags = [x['ignore_flag'] for i in range(len(devkit)) for x in devkit.get_data_info(i)['instances']]
    assert 0 < sum(flags) < len(flags)
    labels = {x['bbox_label'] for i in range(len(kept)) for x in kept.get_data_info(i)['instances']}
    assert labels == set(range(len(classes)))


def test_v15_leaves_out_v2_classes_with_a_warning(tmp_path):
    root = write_dota(tmp_path, ('plane', 'helipad'), images=1)
    with pytest.warns(DOTAAnnotationWarning, match=r"4 objects of unknown class 'helipad'"):
        ds = build(DOTAv15Dataset, root)
    assert [x['bbox_label'] for x in ds.get_data_info(0)['instances']] == [0] * 4


@pytest.mark.parametrize('cls,name,classes', VERSIONS)
def test_classes_matching_no_object_name_the_folder(tmp_path, cls, name, classes):
    root = write_dota(tmp_path, ('plane', 'ship'), images=1)
    with pytest.warns(DOTAAnnotationWarning), pytest.raises(
            DOTADataError, match=r"no annotations of the classes \['container-crane'\] in '.*labelTxt': its "
                                 r"objects are of the classes \['plane', 'ship'\]") as error:
        build(cls, root, metainfo=dict(classes=('container-crane',)))
    assert '\n' not in str(error.value)
