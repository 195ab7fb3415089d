"""multiclass_nms_fixed against mmdet's multiclass_nms (the path mmdet and mmrotate run): the same
detections (boxes, scores, labels, in order of score) from fixed-size tensors, on random head
outputs and on the rotated bbox head of a tiny ReDet."""
import math

import pytest
import torch
from mmdet.models.layers import multiclass_nms

from redet_plugin.models.layers import multiclass_nms_fixed
from redet_plugin.models.roi_heads.bbox_heads import rotated_bbox_head
from redet_plugin.testing import waits_for_nothing
from tests._helpers import safe_iou_threshold

ROTATED_NMS = dict(type='nms_rotated', iou_threshold=0.1)


def head_outputs(num_rois, num_classes, box_dim=5, class_agnostic=False, seed=0, sharp=3.0):
    """Per-class boxes around a few objects and softmax scores, as a bbox head gives them."""
    g = torch.Generator().manual_seed(seed)
    per_roi = 1 if class_agnostic else num_classes
    centres = torch.rand(max(1, num_rois // 8), 2, generator=g) * 200
    pick = torch.randint(0, centres.shape[0], (num_rois * per_roi,), generator=g)
    ctr = centres[pick] + torch.randn(num_rois * per_roi, 2, generator=g) * 3
    wh = torch.rand(num_rois * per_roi, 2, generator=g) * 20 + 10
    if box_dim == 5:
        theta = (torch.rand(num_rois * per_roi, 1, generator=g) - 0.5) * math.pi
        boxes = torch.cat([ctr, wh, theta], 1)
    else:
        boxes = torch.cat([ctr - wh / 2, ctr + wh / 2], 1)
    logits = torch.randn(num_rois, num_classes + 1, generator=g) * sharp
    return boxes.reshape(num_rois, per_roi * box_dim), logits.softmax(-1)


def mmdet_detections(boxes, scores, score_thr, nms_cfg, max_num, box_dim=5):
    dets, labels = multiclass_nms(boxes, scores, score_thr, nms_cfg, max_num, box_dim=box_dim)
    return dets[:, :-1], dets[:, -1], labels


def fixed_detections(boxes, scores, score_thr, nms_cfg, max_num, box_dim=5):
    out = multiclass_nms_fixed(boxes, scores, score_thr, nms_cfg, max_num, box_dim=box_dim)
    expected_rows = max_num if max_num > 0 else scores.shape[0] * (scores.shape[1] - 1)
    assert out.bboxes.shape == (expected_rows, box_dim) and out.valid.shape == (expected_rows,)
    count = int(out.valid.sum())
    assert out.valid[:count].all(), 'valid rows must come before the padding'
    return out.bboxes[:count], out.scores[:count], out.labels[:count]


def assert_same_detections(ours, theirs):
    """Equal within float tolerance, in the same order (the scores here have no exact ties)."""
    (boxes, scores, labels), (their_boxes, their_scores, their_labels) = ours, theirs
    assert boxes.shape == their_boxes.shape, f'{len(boxes)} vs {len(their_boxes)} detections'
    torch.testing.assert_close(scores, their_scores)
    assert torch.equal(labels, their_labels)
    torch.testing.assert_close(boxes, their_boxes)


@pytest.mark.parametrize('num_rois, num_classes', [(1, 1), (40, 3), (300, 15)])
@pytest.mark.parametrize('max_num', [-1, 10, 100, 2000])
def test_same_detections_as_mmdet_rotated(num_rois, num_classes, max_num):
    boxes, scores = head_outputs(num_rois, num_classes, seed=num_rois)
    args = (boxes, scores, 0.05, ROTATED_NMS, max_num)
    assert_same_detections(fixed_detections(*args), mmdet_detections(*args))


@pytest.mark.parametrize('nms_cfg', [
    dict(type='nms_rotated', iou_threshold=0.5, class_agnostic=True),
    dict(type='nms_rotated', iou_threshold=0.3, clockwise=False),
    None])
def test_same_detections_as_mmdet_with_other_nms_configs(nms_cfg):
    boxes, scores = head_outputs(80, 4, seed=1)
    args = (boxes, scores, 0.05, nms_cfg, 100)
    assert_same_detections(fixed_detections(*args), mmdet_detections(*args))


def test_same_detections_as_mmdet_class_agnostic_regression():
    boxes, scores = head_outputs(100, 5, class_agnostic=True, seed=2)
    args = (boxes, scores, 0.05, ROTATED_NMS, 200)
    assert_same_detections(fixed_detections(*args), mmdet_detections(*args))


def test_same_detections_as_mmdet_horizontal():
    boxes, scores = head_outputs(100, 5, box_dim=4, seed=3)
    args = (boxes, scores, 0.05, dict(type='nms', iou_threshold=0.5), 100)
    assert_same_detections(fixed_detections(*args, box_dim=4), mmdet_detections(*args, box_dim=4))


def test_all_below_threshold_and_no_rois_give_no_detections():
    boxes, scores = head_outputs(30, 3, seed=4)
    ours = fixed_detections(boxes, scores, 1.0, ROTATED_NMS, 50)
    theirs = mmdet_detections(boxes, scores, 1.0, ROTATED_NMS, 50)
    assert ours[0].shape == theirs[0].shape == (0, 5)
    out = multiclass_nms_fixed(boxes[:0], scores[:0], 0.05, ROTATED_NMS, 50, box_dim=5)
    assert out.bboxes.shape == (50, 5) and not out.valid.any()  # (mmdet's fails on 0 RoIs)


def test_scores_at_the_threshold_and_nan_are_not_candidates():
    # mmdet keeps scores > score_thr; a NaN score is no candidate and suppresses nothing
    boxes = torch.tensor([[50.0, 50.0, 20.0, 10.0, 0.0]]).repeat(3, 1)
    scores = torch.tensor([[0.05, 0.0], [float('nan'), 0.0], [0.04, 0.0]])
    assert not multiclass_nms_fixed(boxes, scores, 0.05, ROTATED_NMS, 5, box_dim=5).valid.any()
    scores = torch.tensor([[float('nan'), 0.0], [0.3, 0.0], [0.2, 0.0]])
    out = multiclass_nms_fixed(boxes, scores, 0.05, ROTATED_NMS, 5, box_dim=5)
    assert out.valid.tolist() == [True, False, False, False, False] and out.scores[0] == 0.3


def test_equal_scores_give_the_same_detections_in_some_order():
    """Ties whose order cannot change what is kept: classes 0 and 1 score equally in every RoI (and
    never suppress each other), and duplicated RoIs (identical boxes and scores: whichever is
    kept, the detection is the same). mmdet orders ties as its unstable sort does."""
    boxes, scores = head_outputs(60, 3, seed=5)
    scores[:, 1] = scores[:, 0]
    boxes, scores = torch.cat([boxes, boxes[:20]]), torch.cat([scores, scores[:20]])
    args = (boxes, scores, 0.05, ROTATED_NMS, -1)
    ours, theirs = fixed_detections(*args), mmdet_detections(*args)

    def as_sorted_rows(boxes, scores, labels):  # gathered from the same inputs: exact values
        return torch.tensor(sorted(torch.cat([scores[:, None], labels[:, None].to(boxes), boxes],
                                             1).tolist()))

    assert ours[1].unique().numel() < ours[1].numel()  # there are ties among the detections
    assert torch.equal(as_sorted_rows(*ours), as_sorted_rows(*theirs))
    torch.testing.assert_close(ours[1], theirs[1])  # both by score, highest first


@pytest.mark.parametrize('class_agnostic', [False, True])
def test_the_nms_pairs_only_candidates_of_one_class(class_agnostic, monkeypatch):
    """The pairs at or below score_thr get labels of their own: the NMS computes IoUs among the
    candidates of each class (all of them when class-agnostic), never with a non-candidate."""
    from redet_plugin.models.layers import multiclass_nms as module
    seen = {}
    real = module.nms_keep_mask

    def spy(boxes, scores, iou_threshold, labels=None):
        seen['labels'] = labels
        return real(boxes, scores, iou_threshold, labels)

    monkeypatch.setattr(module, 'nms_keep_mask', spy)
    boxes, scores = head_outputs(60, 4)
    score_thr = 0.05
    nms_cfg = dict(ROTATED_NMS, class_agnostic=class_agnostic)
    assert_same_detections(fixed_detections(boxes, scores, score_thr, nms_cfg, 100),
                           mmdet_detections(boxes, scores, score_thr, nms_cfg, 100))
    candidate = scores[:, :-1].reshape(-1) > score_thr
    labels = seen['labels']
    assert 0 < int(candidate.sum()) < candidate.numel()
    classes = torch.arange(4).repeat(60)
    assert torch.equal(labels[candidate], torch.zeros_like(classes[candidate]) if class_agnostic
                       else classes[candidate])
    others = labels[~candidate]
    assert bool((others >= 4).all()) and others.unique().numel() == others.numel()


def test_bad_nms_config_is_named():
    boxes, scores = head_outputs(5, 2)
    with pytest.raises(ValueError, match="type must be 'nms_rotated'"):
        multiclass_nms_fixed(boxes, scores, 0.05, dict(type='soft_nms', iou_threshold=0.1), 5, 5)
    with pytest.raises(ValueError, match=r"keys \['sigma'\] are not supported"):
        multiclass_nms_fixed(boxes, scores, 0.05, dict(type='nms_rotated', iou_threshold=0.1,
                                                       sigma=0.5), 5, 5)
    with pytest.raises(ValueError, match='needs iou_threshold'):
        multiclass_nms_fixed(boxes, scores, 0.05, dict(type='nms_rotated'), 5, 5)


def test_meta_tensors_prove_no_value_is_read():
    # a read-back (.item(), boolean indexing, nonzero) of a meta tensor raises
    boxes = torch.empty(300, 15 * 5, device='meta')
    scores = torch.empty(300, 16, device='meta')
    out = multiclass_nms_fixed(boxes, scores, 0.05, ROTATED_NMS, 2000, box_dim=5)
    assert out.bboxes.shape == (2000, 5) and out.valid.shape == (2000,)
    assert all(t.device.type == 'meta' for t in out)


def test_tiny_detector_head_outputs_give_mmdets_detections(monkeypatch):
    """The rotated bbox head of a tiny ReDet, on a random image: the (boxes, scores) it hands to the
    NMS give mmdet's detections, and the head returns exactly the valid rows."""
    from mmdet.registry import MODELS
    from mmdet.structures import DetDataSample
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    import redet_plugin.mm  # noqa: F401  (registers the mm layer)
    register_all_modules(init_default_scope=True)
    cfg = Config.fromfile('configs/redet/redet-le90_re18_refpn_tiny-synthetic.py').model
    torch.manual_seed(0)
    model = MODELS.build(cfg).eval()
    calls = []

    def recording(*args, **kwargs):
        out = multiclass_nms_fixed(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    monkeypatch.setattr(rotated_bbox_head, 'multiclass_nms_fixed', recording)
    size = 128
    sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size),
                                         pad_shape=(size, size), scale_factor=(1.0, 1.0),
                                         batch_input_shape=(size, size)))
    with torch.no_grad():
        (result,) = model.predict(torch.rand(1, 3, size, size) * 255, [sample])
    (args, kwargs, out), = calls
    boxes, scores, score_thr, nms_cfg, max_num = args
    assert boxes.shape[0] > 10
    theirs = mmdet_detections(boxes, scores, score_thr, nms_cfg, max_num, **kwargs)
    assert theirs[0].shape[0] > 0
    found = result.pred_instances
    assert_same_detections((found.bboxes, found.scores, found.labels), theirs)


@pytest.mark.cuda
def test_cuda_no_host_synchronisation_and_same_detections():
    boxes, scores = head_outputs(300, 15, seed=6)
    boxes, scores = boxes.cuda(), scores.cuda()
    # a threshold no IoU is within 5e-5 of: GPU and CPU rounding, and mmdet's rounding of the
    # class offsets it adds to the centres, cannot flip a decision
    labels = torch.arange(15, device='cuda').repeat(300)
    nms_cfg = dict(type='nms_rotated', iou_threshold=safe_iou_threshold(
        boxes.view(-1, 5), labels, near=0.1, margin=5e-5))
    multiclass_nms_fixed(boxes, scores, 0.05, nms_cfg, 2000, box_dim=5)  # warm-up
    with waits_for_nothing():
        out = multiclass_nms_fixed(boxes, scores, 0.05, nms_cfg, 2000, box_dim=5)
    count = int(out.valid.sum())
    assert out.valid[:count].all()
    ours = (out.bboxes[:count].cpu(), out.scores[:count].cpu(), out.labels[:count].cpu())
    assert_same_detections(ours, mmdet_detections(boxes.cpu(), scores.cpu(), 0.05, nms_cfg, 2000))
