"""Padded ground truth (structures/gt_padding.py) gives the training losses of the real gts alone:
RedetRPNHead's, the RoI Transformer's stages' and the whole ReDet's, for the same draw; and
the padding marks matter (read as real gts, the padding rows change the losses)."""
import copy

import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures.gt_padding import PADDING_BOX_XYXY, pad_gt_instances
from redet_plugin.structures import RotatedBoxes
from tests._helpers import make_samples, tiny_detector
from tests.test_models.test_fixed_size_rcnn_loss import (features_and_proposals,
                                                      first_members_draw, set_sampler_num)
from tests.test_models.test_rpn_head import (ground_truth, head_outputs, head_pair,
                                             image_metas)

CAPACITY = 12


def losses_close(result, expected):
    assert set(result) == set(expected)
    for key in expected:
        torch.testing.assert_close(result[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)


def losses_differ(result, expected):
    return any(not torch.allclose(result[key], expected[key], rtol=1e-5, atol=1e-6)
               for key in expected)


def without_marks(batch):
    """The padded gts read as real ones (the test that the marks matter)."""
    batch = copy.deepcopy(batch)
    for gt in batch:
        gt.pop('valid')
    return batch


def seeded(seed, fn, *args):
    torch.manual_seed(seed)
    return fn(*args)


# ---- RedetRPNHead -------------------------------------------------------------------------------
@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('min_pos_iou', [0.3, 0.0])
def test_rpn_losses_equal_with_and_without_padding(seed, min_pos_iou):
    """One draw key per anchor: the same seed draws the same anchors, padded or not."""
    ours, _ = head_pair()
    ours.assigner.min_pos_iou = min_pos_iou
    outs, metas = head_outputs(seed), image_metas()
    gts = ground_truth(seed, [(7, 0), (3, 12), (0, 0)][seed])
    padded = [pad_gt_instances(gt, CAPACITY) for gt in gts]
    expected = seeded(seed, ours.loss_by_feat, *outs, gts, metas)
    losses_close(seeded(seed, ours.loss_by_feat, *outs, padded, metas), expected)
    if min_pos_iou == 0:  # as real gts the padding boxes claim their best anchors
        assert losses_differ(seeded(seed, ours.loss_by_feat, *outs, without_marks(padded),
                                    metas), expected)


# ---- the RoI Transformer's stages ---------------------------------------------------------------
@pytest.fixture(scope='module')
def model():
    return tiny_detector().train()


def padded_samples(samples, capacity=CAPACITY, box_type=None):
    samples = copy.deepcopy(samples)
    for sample in samples:
        gt = sample.gt_instances
        if box_type is not None:
            gt.bboxes = box_type(gt.bboxes)
        sample.gt_instances = pad_gt_instances(gt, capacity)
    return samples


def unmarked_samples(samples):
    samples = copy.deepcopy(samples)
    for sample in samples:
        sample.gt_instances.pop('valid')
    return samples


@pytest.mark.parametrize('num_boxes', [(3, 0), (6, 2), (0, 0), (CAPACITY, 1)])
@pytest.mark.parametrize('sampler_num', [64, 4096])
def test_rcnn_losses_equal_with_and_without_padding(model, num_boxes, sampler_num,
                                                    monkeypatch):
    """Padding gts are candidates that are never drawn; the draw is made comparable by keys
    that rise with the candidate index (the first members are drawn, padded or not: the
    padding gts are no members) or, at num 4096, by drawing every candidate."""
    head = model.roi_head
    set_sampler_num(head, sampler_num)
    samples, x, proposals = features_and_proposals(model, num_boxes)
    if sampler_num < 4096:
        first_members_draw(monkeypatch)
    padded = padded_samples(samples)
    expected = head.loss(x, copy.deepcopy(proposals), samples)
    losses_close(head.loss(x, copy.deepcopy(proposals), padded), expected)
    if sum(num_boxes) and num_boxes != (CAPACITY, 1):
        assert float(expected['s1.loss_bbox'].detach()) > 0  # positives reached the second stage
    # as real gts the padding gts become positives
    assert losses_differ(head.loss(x, copy.deepcopy(proposals), unmarked_samples(padded)),
                         expected)


def test_padding_gts_are_never_candidates_that_can_be_drawn():
    from mmdet.models.task_modules.samplers import RandomSampler
    from mmengine.structures import InstanceData

    from redet_plugin.models.task_modules.samplers.fixed_size_sampler import sample_fixed
    from tests.test_models.test_max_iou_assigner import assigner_pair, grid_boxes
    assigner, _ = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.0)
    sampler = RandomSampler(num=1000, pos_fraction=0.5, add_gt_as_proposals=True)
    g = torch.Generator().manual_seed(0)
    gts = pad_gt_instances(InstanceData(bboxes=grid_boxes(3, g),
                                        labels=torch.tensor([1, 2, 3])), 8)
    sample = sample_fixed(assigner, sampler, grid_boxes(20, g), None, gts, None)
    assert sample.priors.shape == (28, 4)
    padding_rows = sample.is_gt & (sample.priors == torch.tensor(PADDING_BOX_XYXY)).all(1)
    assert padding_rows.sum() == 5
    assert not (sample.pos | sample.neg)[padding_rows].any()
    assert (sample.pos & sample.is_gt).sum() == 3  # the real gts are drawn as positives
    assert (sample.pos | sample.neg).sum() == 23


# ---- the whole detector -------------------------------------------------------------------------
def detector_step(model, inputs, samples, seed):
    """Losses and gradients of one training step from `seed`."""
    model.zero_grad()
    losses = seeded(seed, model.loss, inputs, samples)
    sum(v for k, v in losses.items() if 'loss' in k).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()
             if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


@pytest.mark.parametrize('draw', ['seeded-all-rois', 'first-members'])
def test_detector_step_equal_with_and_without_padding(model, draw, monkeypatch):
    """ReDet.loss and its gradients: the RPN draws from the same seed either way (a key per
    anchor); the R-CNN stages draw every candidate (num 4096), or the first members."""
    set_sampler_num(model.roi_head, 4096 if draw == 'seeded-all-rois' else 64)
    inputs = torch.randn(2, 3, 128, 128, generator=torch.Generator().manual_seed(7))
    samples = make_samples(num_boxes=(5, 0))
    for sample in samples:  # the box type of the DOTA pipeline
        sample.gt_instances.bboxes = RotatedBoxes(sample.gt_instances.bboxes)
    padded = padded_samples(samples, capacity=9)
    if draw == 'first-members':
        first_members_draw(monkeypatch)
    expected, expected_grads = detector_step(model, inputs, samples, 3)
    result, grads = detector_step(model, inputs, padded, 3)
    losses_close(result, expected)
    assert set(grads) == set(expected_grads)
    for name, grad in grads.items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    wrong, _ = detector_step(model, inputs, unmarked_samples(padded), 3)
    assert losses_differ(wrong, expected)


def test_horizontal_rpn_samples_keep_the_marks():
    from redet_plugin.models.detectors.redet import _horizontal_rpn_samples
    padded = padded_samples(make_samples(num_boxes=(3, 0)), capacity=4, box_type=RotatedBoxes)
    for rpn, sample in zip(_horizontal_rpn_samples(padded), padded):
        assert torch.equal(rpn.gt_instances.valid, sample.gt_instances.valid)
        boxes = rpn.gt_instances.bboxes
        assert boxes.shape == (4, 4) and (rpn.gt_instances.labels == 0).all()
        assert (boxes[~rpn.gt_instances.valid] == torch.tensor(PADDING_BOX_XYXY)).all()
