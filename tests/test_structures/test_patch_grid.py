"""The patch grid's names: DOTA devkit's `<image>__<rate>__<x>___<y>` and mmrotate's split tool's
`<image>__<size>__<x>___<y>` both read back, and boxes found on either kind of patch land on the
full image."""
import importlib.util
import os.path as osp
import re

import cv2
import numpy as np
import pytest

from redet_plugin.evaluation import merge_patch_detections
from redet_plugin.structures import qbox2rbox
from redet_plugin.structures.patch_grid import (MIN_WINDOW_SIZE, parse_patch_id, patch_id,
                                                patch_to_image)


@pytest.mark.parametrize('img_id, expected', [
    ('P0003__1__0___0', ('P0003', 1.0, 0, 0)),
    ('P0003__1.0__824___0', ('P0003', 1.0, 824, 0)),
    ('P0003__0.5__0___412', ('P0003', 0.5, 0, 412)),
    ('P0003__1.5__1236___618', ('P0003', 1.5, 1236, 618)),
    (f'P0003__{MIN_WINDOW_SIZE - 1}__5___6', ('P0003', MIN_WINDOW_SIZE - 1.0, 5, 6)),
])
def test_parse_reads_the_devkits_rate(img_id, expected):
    assert parse_patch_id(img_id) == expected


@pytest.mark.parametrize('img_id, expected', [
    ('P0003__1024__0___0', ('P0003', 1.0, 0, 0)),
    ('P0003__1024__824___1648', ('P0003', 1.0, 824, 1648)),
    ('P0003__2048__1648___0', ('P0003', 1.0, 1648, 0)),   # --rates 0.5: a wider window, same image
    ('P0003__682__500___0', ('P0003', 1.0, 500, 0)),      # --rates 1.5
    (f'a__b__{MIN_WINDOW_SIZE}__3___4', ('a__b', 1.0, 3, 4)),
])
def test_parse_reads_mmrotates_window_size_as_the_image_itself(img_id, expected):
    """mmrotate's middle field is the window's side in the image's pixels, not a rate: the
    corner is in the image's own pixels."""
    assert parse_patch_id(img_id) == expected


@pytest.mark.parametrize('rate', [0.5, 1.0, 1.5, 2.0, 0.37, MIN_WINDOW_SIZE - 0.5])
def test_devkit_ids_read_back_as_written(rate):
    assert parse_patch_id(patch_id('P0003', rate, 824, 412)) == ('P0003', rate, 824, 412)


@pytest.mark.parametrize('rate', [MIN_WINDOW_SIZE, 1024, 0, -1])
def test_patch_id_refuses_rates_that_would_not_read_back(rate):
    with pytest.raises(ValueError, match='patch_id: rate must be in'):
        patch_id('P0003', rate, 0, 0)


def test_a_box_maps_back_by_the_ids_corner_and_rate():
    box = np.array([[10., 20., 4., 6., 0.3]])
    devkit = patch_to_image(box, *parse_patch_id('P0003__0.5__100___50')[1:])
    np.testing.assert_allclose(devkit, [[220., 140., 8., 12., 0.3]], rtol=1e-6)
    mmrotate = patch_to_image(box, *parse_patch_id('P0003__1024__100___50')[1:])
    np.testing.assert_allclose(mmrotate, [[110., 70., 4., 6., 0.3]], rtol=1e-6)


def _mmrotate_img_split():
    """mmrotate 1.x's tools/data/dota/split/img_split.py, as installed with mmrotate."""
    mmrotate = pytest.importorskip('mmrotate')
    path = osp.join(osp.dirname(mmrotate.__file__), '.mim', 'tools', 'data', 'dota', 'split',
                    'img_split.py')
    if not osp.isfile(path):
        pytest.skip(f'mmrotate without its split tool ({path})')
    spec = importlib.util.spec_from_file_location('mmrotate_img_split', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_patches_of_mmrotates_split_tool_merge_back_onto_the_image(tmp_path):
    """An image split by mmrotate's own tool at two rates (windows of 256 and 512 pixels): the
    objects of every patch, as detections, map back onto the objects of the image, and the merge
    keeps each object once."""
    img_split = _mmrotate_img_split()
    height, width = 700, 900
    centres = [(100, 120), (450, 300), (820, 650), (600, 80), (300, 600)]
    polygons = np.array([cv2.boxPoints(((x, y), (40, 18), angle)).reshape(8)
                         for (x, y), angle in zip(centres, (0, 30, 60, -45, 80))], dtype=np.float32)
    cv2.imwrite(str(tmp_path / 'P0003.png'), np.zeros((height, width, 3), np.uint8))
    info = dict(id='P0003', filename='P0003.png', width=width, height=height,
                ann=dict(bboxes=polygons, labels=['plane'] * len(polygons),
                         diffs=np.zeros(len(polygons), dtype=np.int64)))
    # as its main() turns --sizes 256 --gaps 64 --rates 1.0 0.5 into windows
    rates = (1.0, 0.5)
    sizes, gaps = [int(256 / r) for r in rates], [int(64 / r) for r in rates]
    windows = img_split.get_sliding_window(info, sizes, gaps, img_rate_thr=0.6)
    window_anns = img_split.get_window_obj(info, windows, iof_thr=0.7)
    (tmp_path / 'images').mkdir()
    (tmp_path / 'annfiles').mkdir()
    patches = img_split.crop_and_save_img(info, windows, window_anns, str(tmp_path), False,
                                          [104, 116, 124], str(tmp_path / 'images'),
                                          str(tmp_path / 'annfiles'), '.png')
    assert {p['id'].split('__')[1] for p in patches} == {'256', '512'}

    truth = qbox2rbox(polygons.astype(np.float64)).numpy()
    per_patch = []
    for patch in patches:
        # the tool keeps an object's whole polygon (shifted) in every window that holds most of it
        found = qbox2rbox(patch['ann']['bboxes'].reshape(-1, 8).astype(np.float64)).numpy()
        name, rate, left, top = parse_patch_id(patch['id'])
        # mmrotate's merge (DOTAMetric.merge_results) reads the same corner
        x, y = map(int, re.findall(r'\d+', re.findall(r'__\d+___\d+', patch['id'])[0]))
        assert (name, rate, left, top) == ('P0003', 1.0, x, y)
        for box in patch_to_image(found, rate, left, top):
            assert np.abs(truth[:, :4] - box[:4]).max(axis=1).min() < 1e-3
        per_patch.append((patch['id'], found, np.full(len(found), 0.9), np.zeros(len(found))))

    (name, merged, _, _), = merge_patch_detections(per_patch, iou_thr=0.1)
    assert name == 'P0003' and len(merged) == len(truth)
    order = np.lexsort((merged[:, 1], merged[:, 0])), np.lexsort((truth[:, 1], truth[:, 0]))
    np.testing.assert_allclose(merged[order[0], :4], truth[order[1], :4], atol=1e-3)
