"""DOTAMetric through mmengine's Evaluator: data samples in, mAP out, Task1 files written."""
import math

import numpy as np
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.evaluator import Evaluator
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.evaluation import DOTAMetric
from redet_plugin.structures import RotatedBoxes

CLASSES = ('plane', 'ship')


def sample(img_id, gt_boxes, gt_labels, pred_boxes, pred_scores, pred_labels, ignored=None, rotated_type=True):
    s = DetDataSample(metainfo=dict(img_id=img_id))
    s.gt_instances = InstanceData(bboxes=RotatedBoxes(torch.tensor(gt_boxes).reshape(-1, 5)),
                                  labels=torch.tensor(gt_labels, dtype=torch.long))
    boxes, labels = ignored or ([], [])
    s.ignored_instances = InstanceData(bboxes=RotatedBoxes(torch.tensor(boxes).reshape(-1, 5)),
                                       labels=torch.tensor(labels, dtype=torch.long))
    pred = torch.tensor(pred_boxes).reshape(-1, 5)
    s.pred_instances = InstanceData(bboxes=RotatedBoxes(pred) if rotated_type else pred,
                                    scores=torch.tensor(pred_scores), labels=torch.tensor(pred_labels, dtype=torch.long))
    return s


def evaluate(samples, **kwargs):
    evaluator = Evaluator(DOTAMetric(**kwargs))
    evaluator.dataset_meta = dict(classes=CLASSES)
    evaluator.process(samples)  # mmengine turns the data samples into dicts
    return evaluator.evaluate(len(samples))


A, B = [50.0, 50.0, 40.0, 20.0, 0.3], [150.0, 60.0, 30.0, 10.0, -0.8]


@pytest.mark.parametrize('rotated_type', [True, False])
def test_perfect_predictions(rotated_type):
    samples = [sample('x', [A, B], [0, 1], [A, B], [0.9, 0.8], [0, 1], rotated_type=rotated_type),
               sample('y', [B], [0], [B], [0.7], [0], rotated_type=rotated_type)]
    assert evaluate(samples) == {'dota/AP50': 1.0, 'dota/mAP': 1.0}


def test_miss_duplicate_and_difficult():
    samples = [sample('x', [A, B], [0, 0], [A, A, [300.0, 300, 10, 10, 0]], [0.9, 0.8, 0.7], [0, 0, 0],
                      ignored=([[300.0, 300, 10, 10, 0]], [0]))]
    # plane: 2 objects, 1 found (duplicate = fp later, detection of the difficult one ignored)
    assert evaluate(samples, ap_method='area') == {'dota/AP50': 0.5, 'dota/mAP': 0.5}
    assert evaluate(samples)['dota/AP50'] == pytest.approx(6 / 11, abs=1e-4)


def test_several_thresholds():
    shifted = [A[0] + 6, A[1], A[2], A[3], A[4]]  # IoU with A ~ 0.74
    samples = [sample('x', [A], [0], [shifted], [0.9], [0])]
    result = evaluate(samples, iou_thrs=[0.5, 0.75])
    assert result['dota/AP50'] == 1.0 and result['dota/AP75'] == 0.0 and result['dota/mAP'] == 0.5


def test_submission_files_with_patch_merge(tmp_path):
    # the same object seen by two overlapping patches of P0001, plus a plain image
    samples = [sample('P0001__1__0___0', [], [], [[900.0, 100, 40, 20, 0.1]], [0.9], [0]),
               sample('P0001__1__824___0', [], [], [[76.0, 100, 40, 20, 0.1]], [0.8], [0]),
               sample('P0002', [], [], [[10.0, 20, 8, 4, math.pi / 4]], [0.5], [1])]
    out = evaluate(samples, format_only=True, outfile_prefix=str(tmp_path / 'Task1'), merge_patches=True)
    assert out == {}
    plane = (tmp_path / 'Task1' / 'Task1_plane.txt').read_text().splitlines()
    ship = (tmp_path / 'Task1' / 'Task1_ship.txt').read_text().splitlines()
    assert len(plane) == 1 and plane[0].startswith('P0001 0.9000 ')
    coords = np.array(plane[0].split()[2:], dtype=float).reshape(4, 2)
    assert coords.mean(0) == pytest.approx([900, 100], abs=0.1)
    assert len(ship) == 1 and ship[0].split()[:2] == ['P0002', '0.5000']


def test_bad_arguments():
    with pytest.raises(ValueError, match='iou_thrs must be in'):
        DOTAMetric(iou_thrs=[0.5, 1.5])
    with pytest.raises(ValueError, match="ap_method must be '11points' or 'area', got 'voc'"):
        DOTAMetric(ap_method='voc')
    with pytest.raises(ValueError, match='format_only=True needs outfile_prefix'):
        DOTAMetric(format_only=True)


def test_missing_ground_truth_is_explained():
    s = DetDataSample(metainfo=dict(img_id='x'))
    s.pred_instances = InstanceData(bboxes=torch.zeros(0, 5), scores=torch.zeros(0), labels=torch.zeros(0).long())
    with pytest.raises(ValueError, match="'x' has no gt_instances.*format_only=True"):
        evaluate([s])
