"""DOTA split (patches + cut annotations) and the merge of patch detections back to full images."""
import cv2
import numpy as np
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.datasets import cut_objects, patch_origins, split_dota
from redet_plugin.datasets.dota_split import read_dota_objects
from redet_plugin.evaluation import merge_patch_detections, parse_patch_id, patch_id
from redet_plugin.structures import qbox2rbox, rbox2qbox


def test_patch_origins():
    assert patch_origins(3000, 1024, 200) == [0, 824, 1648, 1976]
    assert patch_origins(1024, 1024, 200) == [0]
    assert patch_origins(500, 1024, 200) == [0]
    assert patch_origins(1900, 1024, 200) == [0, 824, 876]
    with pytest.raises(ValueError, match='larger than gap'):
        patch_origins(100, 50, 50)


def square(x0, y0, size):
    return np.array([x0, y0, x0 + size, y0, x0 + size, y0 + size, x0, y0 + size], dtype=np.float64)


def test_cut_objects_rules():
    objects = [(square(110, 110, 20), 'plane', 0),     # inside patch (100, 100, 100)
               (square(185, 120, 20), 'ship', 1),      # 75% inside -> difficult 2, cut
               (square(190, 150, 20), 'ship', 0),      # 50% inside -> dropped
               (square(300, 300, 20), 'plane', 0)]     # outside
    kept = cut_objects(objects, 100, 100, 100, thresh=0.7)
    assert [(name, diff) for _, name, diff in kept] == [('plane', 0), ('ship', 2)]
    assert kept[0][0].tolist() == square(10, 10, 20).tolist()
    cut = kept[1][0].reshape(4, 2)
    assert cut[:, 0].max() == pytest.approx(100) and cut[:, 0].min() == pytest.approx(85)
    assert cut[:, 1].min() == pytest.approx(20) and cut[:, 1].max() == pytest.approx(40)


@pytest.fixture
def dota_folder(tmp_path):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (500, 600, 3), dtype=np.uint8)
    boxes = torch.tensor([[40.0, 40.0, 30.0, 12.0, 0.3], [300.0, 250.0, 40.0, 20.0, -0.7],
                          [560.0, 460.0, 24.0, 10.0, 1.0], [250.0, 60.0, 20.0, 20.0, 0.0]])
    src = tmp_path / 'src'
    (src / 'images').mkdir(parents=True)
    (src / 'labelTxt').mkdir()
    cv2.imwrite(str(src / 'images' / 'P0001.png'), img)
    lines = ['imagesource:test', 'gsd:1'] + [' '.join(f'{v:.3f}' for v in q) + ' plane 0'
                                             for q in rbox2qbox(boxes.double()).numpy()]
    (src / 'labelTxt' / 'P0001.txt').write_text('\n'.join(lines) + '\n')
    return src, img, boxes


def test_split_dota_patches_and_annotations(dota_folder, tmp_path):
    src, img, boxes = dota_folder
    count = split_dota(str(src), str(tmp_path / 'dst'), patch_size=256, gap=64, progress=False)
    xs, ys = patch_origins(600, 256, 64), patch_origins(500, 256, 64)
    assert count == len(xs) * len(ys)
    for left in xs:
        for top in ys:
            stem = patch_id('P0001', 1.0, left, top)
            patch = cv2.imread(str(tmp_path / 'dst' / 'images' / f'{stem}.png'))
            assert patch.shape == (256, 256, 3)
            assert np.array_equal(patch, img[top:top + 256, left:left + 256])
            for coords, name, difficulty in read_dota_objects(str(tmp_path / 'dst' / 'labelTxt' / f'{stem}.txt')):
                assert (coords >= -1e-6).all() and (coords <= 256 + 1e-6).all()
                if difficulty == 0:  # whole object: the original box, shifted
                    rbox = qbox2rbox(coords.reshape(1, 8)).float() + torch.tensor([left, top, 0, 0, 0])
                    assert torch.isclose(rbox, boxes, atol=0.05).all(dim=1).any()


def test_split_pads_small_images(tmp_path):
    (tmp_path / 'src' / 'images').mkdir(parents=True)
    cv2.imwrite(str(tmp_path / 'src' / 'images' / 'small.png'), np.full((100, 120, 3), 7, np.uint8))
    assert split_dota(str(tmp_path / 'src'), str(tmp_path / 'dst'), patch_size=256, gap=64, progress=False) == 1
    patch = cv2.imread(str(tmp_path / 'dst' / 'images' / 'small__1__0___0.png'))
    assert patch.shape == (256, 256, 3) and patch[:100, :120].min() == 7 and patch[100:].max() == 0


def test_parse_patch_id():
    assert parse_patch_id('P0001__1__824___0') == ('P0001', 1.0, 824, 0)
    assert parse_patch_id('P0001__0.5__0___412') == ('P0001', 0.5, 0, 412)
    assert parse_patch_id('plain_image') == ('plain_image', 1.0, 0, 0)
    assert patch_id('a__b', 1.0, 3, 4) == 'a__b__1__3___4' and parse_patch_id('a__b__1__3___4')[0] == 'a__b'


def test_merge_maps_patch_detections_back_and_removes_duplicates(dota_folder):
    _, _, boxes = dota_folder
    objects = [(q, 'plane', 0) for q in rbox2qbox(boxes.double()).numpy()]
    per_patch = []
    for rate in (1.0, 0.5):
        scaled = [(q * rate, n, d) for q, n, d in objects]
        for top in patch_origins(int(500 * rate), 256, 64):
            for left in patch_origins(int(600 * rate), 256, 64):
                found = [q for q, _, d in cut_objects(scaled, left, top, 256) if d == 0]
                dets = qbox2rbox(np.array(found).reshape(-1, 8)).numpy()
                per_patch.append((patch_id('P0001', rate, left, top), dets, np.full(len(dets), 0.9), np.zeros(len(dets))))
    per_patch.append(('P0002', np.zeros((0, 5)), np.zeros(0), np.zeros(0)))
    merged = merge_patch_detections(per_patch, iou_thr=0.1)
    assert [m[0] for m in merged] == ['P0001', 'P0002']
    name, merged_boxes, scores, labels = merged[0]
    assert len(merged_boxes) == len(boxes)  # each object found in several patches and scales, kept once
    dist = torch.cdist(torch.from_numpy(merged_boxes[:, :2]).float(), boxes[:, :2])
    assert dist.min(dim=1).values.max() < 0.1
    assert len(merged[1][1]) == 0


def test_merge_suppresses_within_a_class_only():
    # The same box found as class 0 in two patches and as class 3 in one: one box per class stays
    # (mmcv's CPU nms_rotated ignores labels, so a merge that relied on them lost class 3).
    box = np.array([[40., 50., 30., 12., 0.3]])
    per_patch = [(patch_id('P0001', 1.0, 0, 0), box, np.array([0.9]), np.array([0])),
                 (patch_id('P0001', 1.0, 10, 0), box - [10, 0, 0, 0, 0], np.array([0.7]), np.array([0])),
                 (patch_id('P0001', 1.0, 0, 0), box, np.array([0.8]), np.array([3]))]
    (name, boxes, scores, labels), = merge_patch_detections(per_patch, iou_thr=0.1)
    assert name == 'P0001' and labels.tolist() == [0, 3]
    np.testing.assert_allclose(scores, [0.9, 0.8])
    np.testing.assert_allclose(boxes, np.concatenate([box, box]).astype(np.float32))
