"""The synthetic DOTA-format data set: layout, determinism, annotations, first-use generation."""
import filecmp
import os

import cv2
import numpy as np
import pytest

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import (SYNTHETIC_CLASSES, DOTADataError, DOTADataset, SyntheticDOTADataset,
                                   ensure_synthetic_dota, generate_synthetic_dota)
from redet_plugin.datasets.synthetic import generate_image


def test_layout_and_annotations(tmp_path):
    generate_synthetic_dota(str(tmp_path), num_train=6, num_val=3, image_size=128, seed=1, progress=False)
    for split, count in (('train', 6), ('val', 3)):
        assert len(os.listdir(tmp_path / split / 'images')) == count
        assert len(os.listdir(tmp_path / split / 'labelTxt')) == count
    ds = DOTADataset(data_root=str(tmp_path), ann_file='train/labelTxt', data_prefix=dict(img_path='train/images'),
                     metainfo=dict(classes=SYNTHETIC_CLASSES))
    assert len(ds) == 6
    instances = [i for k in range(6) for i in ds.get_data_info(k)['instances']]
    assert len(instances) >= 12
    for inst in instances:  # inside the image and of plausible size
        cx, cy, w, h, _ = inst['bbox']
        assert 0 < cx < 128 and 0 < cy < 128 and 4 < h <= w < 60
    assert ds.get_data_info(0)['width'] == 128


def test_deterministic_per_seed(tmp_path):
    for name, seed in (('a', 3), ('b', 3), ('c', 4)):
        generate_synthetic_dota(str(tmp_path / name), num_train=3, num_val=1, image_size=96, seed=seed, progress=False)
    same = filecmp.dircmp(tmp_path / 'a' / 'train' / 'labelTxt', tmp_path / 'b' / 'train' / 'labelTxt')
    assert not same.diff_files and filecmp.cmp(tmp_path / 'a/train/images/train_00000.png',
                                               tmp_path / 'b/train/images/train_00000.png', shallow=False)
    assert not filecmp.cmp(tmp_path / 'a/train/labelTxt/train_00000.txt',
                           tmp_path / 'c/train/labelTxt/train_00000.txt', shallow=False)


def test_all_classes_and_difficult_objects_appear():
    rng = np.random.default_rng(0)
    seen, difficult = set(), 0
    for _ in range(60):
        _, objects = generate_image(rng, 256, SYNTHETIC_CLASSES)
        seen.update(name for _, name, _ in objects)
        difficult += sum(d for _, _, d in objects)
    assert seen == set(SYNTHETIC_CLASSES) and difficult > 0


def test_classes_look_different():
    """Mean colour inside the boxes differs between classes (the data set must be learnable)."""
    rng = np.random.default_rng(1)
    colours = {name: [] for name in SYNTHETIC_CLASSES}
    for _ in range(40):
        img, objects = generate_image(rng, 256, SYNTHETIC_CLASSES, difficult_rate=0.0)
        for (cx, cy, w, h, _), name, _ in objects:
            r = max(int(min(w, h) / 4), 1)
            colours[name].append(img[int(cy) - r:int(cy) + r, int(cx) - r:int(cx) + r].reshape(-1, 3).mean(0))
    means = {name: np.mean(v, axis=0) for name, v in colours.items()}
    names = list(means)
    gaps = [np.abs(means[a] - means[b]).max() for i, a in enumerate(names) for b in names[i + 1:]]
    assert min(gaps) > 20, means


def test_ensure_generates_once_and_regenerates_on_change(tmp_path):
    root = str(tmp_path)
    assert ensure_synthetic_dota(root, num_train=4, num_val=1, image_size=96, progress=False) is not None
    assert ensure_synthetic_dota(root, num_train=4, num_val=1, image_size=96, progress=False) is None
    assert ensure_synthetic_dota(root, num_train=2, num_val=1, image_size=96, progress=False) is not None
    assert len(os.listdir(tmp_path / 'train' / 'images')) == 2  # no stale files from the larger set


def test_synthetic_dataset_generates_on_first_use(tmp_path):
    ds = SyntheticDOTADataset(data_root=str(tmp_path / 'syn'), ann_file='val/labelTxt/',
                              data_prefix=dict(img_path='val/images/'),
                              synthetic=dict(num_train=2, num_val=3, image_size=96, progress=False))
    assert len(ds) == 3 and ds.metainfo['classes'] == SYNTHETIC_CLASSES


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match='classes must be a non-empty subset'):
        generate_synthetic_dota(str(tmp_path), classes=('plane', 'bridge'))
    with pytest.raises(ValueError, match='image_size must be >= 64, got 32'):
        generate_synthetic_dota(str(tmp_path), image_size=32)
    with pytest.raises(ValueError, match='data_root'):
        SyntheticDOTADataset(ann_file='val/labelTxt/')


def test_large_images_hold_more_objects_of_the_same_size():
    rng = np.random.default_rng(2)
    _, small = generate_image(rng, 256, SYNTHETIC_CLASSES)
    _, large = generate_image(rng, 768, SYNTHETIC_CLASSES)
    assert len(large) > 8 >= len(small)
    assert max(max(w, h) for (_, _, w, h, _), _, _ in large) <= 80


def test_one_folder_with_two_parameter_sets_at_once_is_refused(tmp_path):
    """The train loader of a config with another image_size: the val loader regenerated the folder
    under the train set's labels, silently."""
    root = str(tmp_path / 'syn')
    common = dict(data_root=root, ann_file='train/labelTxt/', data_prefix=dict(img_path='train/images/'))
    train = SyntheticDOTADataset(**common, synthetic=dict(num_train=2, num_val=1, image_size=128, progress=False))
    val = SyntheticDOTADataset(**common, synthetic=dict(num_train=2, num_val=1, image_size=128))  # same: fine
    with pytest.raises(DOTADataError, match=r"'.*syn' is in use with the synthetic parameters \{.*'image_size': "
                                            r"128.*\}; these are \{.*'image_size': 96.*\}"):
        SyntheticDOTADataset(**common, synthetic=dict(num_train=2, num_val=1, image_size=96))
    assert train.get_data_info(0)['width'] == 128  # the folder was left as it was
    assert cv2.imread(str(tmp_path / 'syn/train/images/train_00000.png')).shape[0] == 128
    del train, val  # no longer in use: other parameters regenerate the set, as documented
    assert SyntheticDOTADataset(**common, synthetic=dict(num_train=2, num_val=1, image_size=96,
                                                         progress=False)).get_data_info(0)['width'] == 96
