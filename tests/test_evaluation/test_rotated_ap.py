"""Rotated VOC AP: hand-computed cases, mmdet's eval_map on axis-aligned boxes, shapely reference."""
import math

import numpy as np
import pytest
from mmdet.evaluation.functional import eval_map
from shapely.geometry import Polygon

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.evaluation import average_precision, eval_rotated_map, match_detections, rotated_iou
from redet_plugin.structures import rbox2qbox
import torch


def ann(boxes, labels, ignore_boxes=(), ignore_labels=()):
    return dict(bboxes=np.array(boxes, np.float32).reshape(-1, 5), labels=np.array(labels, np.int64),
                bboxes_ignore=np.array(ignore_boxes, np.float32).reshape(-1, 5),
                labels_ignore=np.array(ignore_labels, np.int64))


def dets(*rows):
    return np.array(rows, np.float32).reshape(-1, 6)


def ap_of(detections, annotations, mode='11points', num_classes=1, thr=0.5):
    return [c['ap'] for c in eval_rotated_map(detections, annotations, num_classes, thr, mode)]


BOX_A = [50, 50, 40, 20, 0.3]
BOX_B = [150, 60, 30, 10, -0.8]


@pytest.mark.parametrize('mode', ['11points', 'area'])
def test_perfect_predictions(mode):
    annotations = [ann([BOX_A, BOX_B], [0, 1]), ann([BOX_B], [1])]
    detections = [[dets(BOX_A + [0.9]), dets(BOX_B + [0.8])], [dets(), dets(BOX_B + [0.7])]]
    assert ap_of(detections, annotations, mode, num_classes=2) == [1.0, 1.0]


def test_one_miss():  # 2 objects, 1 found: recall 0.5 at precision 1
    annotations = [ann([BOX_A, BOX_B], [0, 0])]
    detections = [[dets(BOX_A + [0.9])]]
    assert ap_of(detections, annotations, '11points') == [pytest.approx(6 / 11)]  # t = 0, 0.1, ..., 0.5
    assert ap_of(detections, annotations, 'area') == [pytest.approx(0.5)]


def test_duplicate_is_a_false_positive():
    annotations = [ann([BOX_A], [0])]
    duplicate_after = [[dets(BOX_A + [0.9], BOX_A + [0.8])]]  # tp then fp: AP 1
    assert ap_of(duplicate_after, annotations) == [1.0]
    match = match_detections(duplicate_after[0][0][:, :5], duplicate_after[0][0][:, 5],
                             np.array([BOX_A], np.float32), np.zeros(1, bool), 0.5)
    assert match[0].tolist() == [1, 0] and match[1].tolist() == [0, 1]
    wrong_first = [[dets(BOX_B + [0.9], BOX_A + [0.8])]]  # fp then tp: precision 1/2 at recall 1
    assert ap_of(wrong_first, annotations, '11points') == [pytest.approx(0.5)]
    assert ap_of(wrong_first, annotations, 'area') == [pytest.approx(0.5)]


def test_rotated_by_90_degrees():
    square = [100, 100, 30, 30, 0.0]
    annotations = [ann([square], [0])]
    assert ap_of([[dets([100, 100, 30, 30, math.pi / 2, 0.9])]], annotations) == [pytest.approx(1.0)]
    # a 45-degree turned square still overlaps by IoU 0.707
    assert rotated_iou(np.array([square]), np.array([[100, 100, 30, 30, math.pi / 4]]))[0, 0] == \
        pytest.approx(1 / math.sqrt(2), abs=1e-4)
    # a 2:1 rectangle turned by 90 degrees: IoU = 1/3 -> false positive
    rect = [100, 100, 40, 20, 0.0]
    assert rotated_iou(np.array([rect]), np.array([[100, 100, 40, 20, math.pi / 2]]))[0, 0] == \
        pytest.approx(1 / 3, abs=1e-4)
    assert ap_of([[dets([100, 100, 40, 20, math.pi / 2, 0.9])]], [ann([rect], [0])]) == [0.0]


def test_difficult_objects_are_ignored():
    annotations = [ann([BOX_A], [0], ignore_boxes=[BOX_B], ignore_labels=[0])]
    # a detection of the difficult object is neither right nor wrong; missing it costs nothing
    assert ap_of([[dets(BOX_B + [0.95], BOX_A + [0.9])]], annotations) == [1.0]
    assert ap_of([[dets(BOX_A + [0.9])]], annotations) == [1.0]
    stats = eval_rotated_map([[dets(BOX_B + [0.95])]], annotations, 1)[0]
    assert stats['num_gts'] == 1 and stats['ap'] == 0.0


def test_average_precision_modes_and_bad_mode():
    recalls, precisions = np.array([0.2, 0.4, 0.4, 0.8]), np.array([1.0, 1.0, 0.67, 0.5])
    assert average_precision(recalls, precisions, 'area') == pytest.approx(0.4 * 1.0 + 0.4 * 0.5)
    assert average_precision(recalls, precisions, '11points') == pytest.approx((5 * 1.0 + 4 * 0.5) / 11)
    with pytest.raises(ValueError, match="'11points' or 'area', got 'voc'"):
        average_precision(recalls, precisions, 'voc')


def devkit_average_precision(recalls, precisions, mode):
    """The DOTA devkit's formulas, in float64."""
    if mode == '11points':
        return sum(max(precisions[recalls >= t], default=0.0) for t in np.arange(0.0, 1.1, 0.1)) / 11
    mrec = np.concatenate([[0.0], recalls, [1.0]])
    mpre = np.maximum.accumulate(np.concatenate([[0.0], precisions, [0.0]])[::-1])[::-1]
    steps = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[steps + 1] - mrec[steps]) * mpre[steps + 1]))


@pytest.mark.parametrize('seed', range(20))
@pytest.mark.parametrize('mode', ['11points', 'area'])
def test_average_precision_is_mmdets_and_the_devkits(seed, mode):
    """mmdet's value as a float (it rounds to float32: the devkit's float64 value to 1e-7), also
    for a recall of exactly 3/5, which the devkit's 0.6000000000000001 threshold leaves out."""
    from mmdet.evaluation.functional import average_precision as mmdet_average_precision
    rng = np.random.default_rng(seed)
    num_gts = int(rng.integers(1, 12))
    tp = np.cumsum(rng.uniform(size=int(rng.integers(0, 30))) < 0.5, dtype=np.float64)
    fp = np.arange(1, len(tp) + 1) - tp
    recalls, precisions = tp / num_gts, tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
    ours = average_precision(recalls, precisions, mode)
    assert type(ours) is float
    assert ours == float(mmdet_average_precision(recalls, precisions, mode))
    assert ours == pytest.approx(devkit_average_precision(recalls, precisions, mode), rel=1e-6, abs=1e-7)
    three_fifths = np.array([0.2, 0.4, 0.6]), np.array([1.0, 1.0, 0.5])
    assert average_precision(*three_fifths, '11points') == pytest.approx((5 * 1.0 + 0.5) / 11)


def random_case(seed, num_images=6, num_classes=3, rotated=True):
    rng = np.random.default_rng(seed)
    detections, annotations = [], []
    for _ in range(num_images):
        n = rng.integers(1, 8)
        boxes = np.concatenate([rng.uniform(30, 220, (n, 2)), rng.uniform(10, 50, (n, 2)),
                                rng.uniform(-math.pi / 2, math.pi / 2, (n, 1)) if rotated else np.zeros((n, 1))], 1)
        labels = rng.integers(0, num_classes, n)
        difficult = rng.uniform(size=n) < 0.2
        annotations.append(ann(boxes[~difficult], labels[~difficult], boxes[difficult], labels[difficult]))
        per_class = []
        for c in range(num_classes):
            own = boxes[labels == c]
            noisy = own + np.concatenate([rng.normal(0, 4, (len(own), 4)),
                                          rng.normal(0, 0.2, (len(own), 1)) if rotated else np.zeros((len(own), 1))], 1)
            noisy[:, 2:4] = np.abs(noisy[:, 2:4]) + 2
            spurious = np.concatenate([rng.uniform(30, 220, (2, 2)), rng.uniform(10, 50, (2, 2)),
                                       rng.uniform(-1, 1, (2, 1)) if rotated else np.zeros((2, 1))], 1)
            all_boxes = np.concatenate([noisy, noisy[:1], spurious])  # with a duplicate
            per_class.append(np.concatenate([all_boxes, rng.uniform(0, 1, (len(all_boxes), 1))], 1).astype(np.float32))
        detections.append(per_class)
    return detections, annotations


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('mode', ['11points', 'area'])
def test_matches_mmdet_eval_map_on_axis_aligned_boxes(seed, mode):
    detections, annotations = random_case(seed, rotated=False)

    def to_xyxy(b):
        return np.concatenate([b[:, :2] - b[:, 2:4] / 2, b[:, :2] + b[:, 2:4] / 2], 1)
    mm_dets = [[np.concatenate([to_xyxy(d), d[:, 5:]], 1) for d in per_image] for per_image in detections]
    mm_anns = [dict(bboxes=to_xyxy(a['bboxes']), labels=a['labels'], bboxes_ignore=to_xyxy(a['bboxes_ignore']),
                    labels_ignore=a['labels_ignore']) for a in annotations]
    mean_ap, per_class = eval_map(mm_dets, mm_anns, iou_thr=0.5, eval_mode=mode, logger='silent')
    ours = eval_rotated_map(detections, annotations, 3, 0.5, mode)
    assert [c['ap'] for c in ours] == pytest.approx([float(c['ap']) for c in per_class], abs=1e-5)
    assert sum(c['num_dets'] for c in ours) == sum(int(c['num_dets']) for c in per_class)


def shapely_iou(a, b):
    pa, pb = [Polygon(q.reshape(4, 2)) for q in rbox2qbox(torch.from_numpy(np.array([a, b], dtype=np.float64))).numpy()]
    return pa.intersection(pb).area / pa.union(pb).area


def reference_ap(detections, annotations, cls, thr, mode):
    """Independent VOC AP with shapely IoU, written plainly (the DOTA devkit's algorithm)."""
    records, num_gts = [], 0
    for img, (per_class, a) in enumerate(zip(detections, annotations)):
        num_gts += int((a['labels'] == cls).sum())
        for row in per_class[cls]:
            records.append((float(row[5]), img, row[:5]))
    records.sort(key=lambda r: -r[0])
    used = {}
    tp, fp = [], []
    for score, img, box in records:
        a = annotations[img]
        gts = [(g, False) for g in a['bboxes'][a['labels'] == cls]] + \
              [(g, True) for g in a['bboxes_ignore'][a['labels_ignore'] == cls]]
        ious = [shapely_iou(box, g) for g, _ in gts]
        best = int(np.argmax(ious)) if ious else -1
        if best >= 0 and ious[best] >= thr:
            if gts[best][1]:
                continue
            hit = (img, best) not in used
            used[(img, best)] = True
            tp.append(1 if hit else 0)
            fp.append(0 if hit else 1)
        else:
            tp.append(0)
            fp.append(1)
    tp, fp = np.cumsum(tp), np.cumsum(fp)
    return average_precision(tp / max(num_gts, 1), tp / np.maximum(tp + fp, 1e-9), mode)


@pytest.mark.parametrize('seed', range(3))
def test_agrees_with_shapely_reference_on_random_rotated_boxes(seed):
    detections, annotations = random_case(100 + seed)
    for mode in ('11points', 'area'):
        ours = ap_of(detections, annotations, mode, num_classes=3)
        expected = [reference_ap(detections, annotations, c, 0.5, mode) for c in range(3)]
        assert ours == pytest.approx(expected, abs=1e-4)
    assert 0.1 < np.mean(ours) < 0.99  # a non-trivial case


def test_rotated_iou_matches_shapely():
    _, annotations = random_case(7)
    boxes = np.concatenate([a['bboxes'] for a in annotations])
    ious = rotated_iou(boxes, boxes + np.array([3, -2, 1, 0, 0.1], np.float32))
    expected = np.array([[shapely_iou(a, b + np.array([3, -2, 1, 0, 0.1])) for b in boxes] for a in boxes])
    assert np.allclose(ious, expected, atol=1e-4)


def test_mismatched_lengths():
    with pytest.raises(ValueError, match='2 detection lists for 1 annotated images'):
        eval_rotated_map([[dets()], [dets()]], [ann([], [])], 1)


@pytest.mark.parametrize('spread', [60, 2000])
def test_rotated_iou_is_mmcvs_dense_matrix(spread):
    """Pairs skipped for circumscribed circles apart are the pairs mmcv puts at 0; every other
    value is mmcv's own. Crowded and spread-out boxes, boxes that touch along a side or at a
    corner of their circles, identical, empty and non-finite boxes."""
    from mmcv.ops import box_iou_rotated
    rng = np.random.default_rng(spread)
    def boxes(n):
        b = np.empty((n, 5), np.float32)
        b[:, :2] = rng.uniform(0, spread, (n, 2))
        b[:, 2:4] = rng.uniform(1, 80, (n, 2))
        b[:, 4] = rng.uniform(-math.pi / 2, math.pi / 2, n)
        return b
    det, gt = boxes(400), boxes(40)
    gt[0] = det[0]                                          # identical
    det[1, 2:4] = 0                                         # empty
    det[2, 4] = gt[1, 4] = 0                                # sides touching
    gt[1, 1:4] = det[2, 1:4]
    gt[1, 0] = det[2, 0] + det[2, 2]
    gt[2, :4] = [det[3, 0] + 50, det[3, 1], 30, 40]         # circles touching, boxes apart
    det[3, 2:4] = [30, 40]
    det[4, 0] = np.nan
    det[5, 2] = np.inf
    dense = box_iou_rotated(torch.from_numpy(det), torch.from_numpy(gt)).numpy()
    np.testing.assert_array_equal(rotated_iou(det, gt), dense)
    assert rotated_iou(det[:0], gt).shape == (0, 40) and rotated_iou(det, gt[:0]).shape == (400, 0)
