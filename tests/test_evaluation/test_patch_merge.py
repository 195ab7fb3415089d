"""classwise_rotated_nms (the patch merge's NMS, nms_keep_mask with labels) keeps what mmcv's
nms_rotated keeps when run one class at a time, in the same order."""
import math

import numpy as np
import pytest
import torch
from mmcv.ops import nms_rotated

from redet_plugin.evaluation.patch_merge import classwise_rotated_nms, merge_patch_detections


def mmcv_one_class_at_a_time(boxes, scores, labels, iou_thr):
    """mmcv's nms_rotated per class (its CPU kernel ignores labels), by descending score."""
    keep = [np.zeros(0, dtype=np.int64)]
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        _, kept = nms_rotated(torch.from_numpy(boxes[members]), torch.from_numpy(scores[members]),
                              iou_thr)
        keep.append(members[kept.numpy()])
    keep = np.concatenate(keep)
    return keep[np.argsort(-scores[keep], kind='stable')]


def patch_detections(seed, num_objects=40, copies=4, num_classes=5):
    """Objects found several times (as on overlapping patches and scales), jittered, with
    distinct scores, some objects sharing a place under another class."""
    rng = np.random.default_rng(seed)
    objects = np.concatenate([rng.uniform(0, 800, (num_objects, 2)), rng.uniform(8, 80, (num_objects, 2)),
                              rng.uniform(-math.pi / 2, math.pi / 2, (num_objects, 1))], 1)
    boxes = np.repeat(objects, copies, 0)
    boxes[:, :4] += rng.normal(0, 2, (len(boxes), 4))
    boxes[:, 4] += rng.normal(0, 0.1, len(boxes))
    labels = np.repeat(rng.integers(0, num_classes, num_objects), copies)
    labels[::7] = (labels[::7] + 1) % num_classes
    scores = rng.permutation(len(boxes)).astype(np.float32) / len(boxes) + 0.01
    return boxes.astype(np.float32), scores, labels.astype(np.int64)


@pytest.mark.parametrize('seed', range(5))
@pytest.mark.parametrize('iou_thr', [0.05, 0.1, 0.3, 0.5])
def test_same_detections_as_mmcv_nms_rotated_class_by_class(seed, iou_thr):
    boxes, scores, labels = patch_detections(seed)
    ours = classwise_rotated_nms(boxes, scores, labels, iou_thr)
    expected = mmcv_one_class_at_a_time(boxes, scores, labels, iou_thr)
    assert 0 < len(ours) < len(boxes)
    np.testing.assert_array_equal(ours, expected)


def test_classes_do_not_suppress_each_other_and_equal_scores_keep_input_order():
    box = [50.0, 50.0, 40.0, 20.0, 0.3]
    boxes = np.array([box, box, box, box], np.float32)
    scores = np.array([0.5, 0.9, 0.5, 0.9], np.float32)
    labels = np.array([0, 1, 1, 0], np.int64)
    assert classwise_rotated_nms(boxes, scores, labels, 0.1).tolist() == [1, 3]
    assert classwise_rotated_nms(boxes[:0], scores[:0], labels[:0], 0.1).tolist() == []


def test_merge_equals_mmcv_nms_rotated_class_by_class():
    boxes, scores, labels = patch_detections(7)
    half = len(boxes) // 2
    # two patches of one image (offset by the patch's corner), one of another
    per_patch = [('P0001__1__0___0', boxes[:half], scores[:half], labels[:half]),
                 ('P0001__1__512___0', boxes[half:] - np.float32([512, 0, 0, 0, 0]),
                  scores[half:], labels[half:]),
                 ('P0002', boxes, scores, labels)]
    expected = mmcv_one_class_at_a_time(boxes, scores, labels, 0.1)
    for name, merged_boxes, merged_scores, merged_labels in merge_patch_detections(per_patch, 0.1):
        np.testing.assert_allclose(merged_boxes, boxes[expected], atol=1e-4)
        np.testing.assert_array_equal(merged_scores, scores[expected])
        np.testing.assert_array_equal(merged_labels, labels[expected])


def test_a_box_inside_another_sharing_three_edges_is_suppressed():
    """Where mmcv's rotated IoU is 0 (tests/test_inference/test_patch_inference.py, xfail), the
    merge's exact polygon IoU suppresses the shorter copy."""
    whole = [255.946, 97.86, 60.541, 24.62, 0.738]
    shift = (60.541 - 54.083) / 2
    cut = [255.946 + shift * math.cos(0.738), 97.86 + shift * math.sin(0.738), 54.083, 24.62, 0.738]
    boxes = np.array([whole, cut], np.float32)
    assert classwise_rotated_nms(boxes, np.float32([0.9, 0.8]), np.int64([0, 0]), 0.1).tolist() == [0]
