"""Ground truth padded to a fixed count (structures/gt_padding.py) and RedetMaxIoUAssigner's
`gt_instances.valid`: the priors get exactly mmdet's assignment to the real gts alone."""
import itertools

import pytest
import torch
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.structures.gt_padding import (PADDING_BOX_XYWHA, PADDING_BOX_XYXY,
                                            pad_gt_instances, padding_box)
from redet_plugin.models.task_modules import (DeltaXYWHBBoxCoder, DeltaXYWHTHBBoxCoder,
                                              DeltaXYWHTRBBoxCoder, RBboxOverlaps2D)
from redet_plugin.structures import RotatedBoxes, rbox2hbox
from tests.test_models.test_max_iou_assigner import assigner_pair, grid_boxes

SEEDS = range(30)


# ---- pad_gt_instances ---------------------------------------------------------------------------
def rotated_gts(n, g=None):
    g = g or torch.Generator().manual_seed(n)
    boxes = torch.cat([torch.rand(n, 2, generator=g) * 60, 8 + torch.rand(n, 2, generator=g) * 20,
                       torch.rand(n, 1, generator=g) - 0.5], 1)
    return boxes, torch.randint(0, 5, (n, ), generator=g)


@pytest.mark.parametrize('box_type', [torch.Tensor, RotatedBoxes, HorizontalBoxes])
@pytest.mark.parametrize('count, capacity', [(3, 7), (0, 4), (5, 5), (0, 0)])
def test_pad_gt_instances(box_type, count, capacity):
    boxes, labels = rotated_gts(count)
    if box_type is HorizontalBoxes:
        boxes = HorizontalBoxes(rbox2hbox(boxes))
    elif box_type is RotatedBoxes:
        boxes = RotatedBoxes(boxes)
    gt = InstanceData(metainfo=dict(img_id=3), bboxes=boxes, labels=labels)
    padded = pad_gt_instances(gt, capacity)
    assert type(padded.bboxes) is type(boxes) and padded.metainfo == dict(img_id=3)
    box_dim = 4 if box_type is HorizontalBoxes else 5
    tensor = padded.bboxes if box_type is torch.Tensor else padded.bboxes.tensor
    assert tensor.shape == (capacity, box_dim) and padded.labels.shape == (capacity, )
    assert padded.valid.dtype == torch.bool and padded.valid.tolist() == [True] * count + [
        False] * (capacity - count)
    original = boxes if box_type is torch.Tensor else boxes.tensor
    assert torch.equal(tensor[:count], original) and torch.equal(padded.labels[:count], labels)
    assert (tensor[count:] == torch.tensor(padding_box(box_dim))).all()
    assert (padded.labels[count:] == 0).all() and padded.labels.dtype == labels.dtype
    assert len(gt) == count and 'valid' not in gt  # the input is left alone


def test_padding_again_keeps_valid_and_other_fields_are_padded_with_zeros():
    boxes, labels = rotated_gts(3)
    gt = InstanceData(bboxes=boxes, labels=labels, ignore_flags=torch.ones(3, dtype=torch.bool),
                      scores=torch.rand(3, 2))
    twice = pad_gt_instances(pad_gt_instances(gt, 4), 6)
    assert twice.valid.tolist() == [True] * 3 + [False] * 3
    assert twice.ignore_flags.tolist() == [True] * 3 + [False] * 3
    assert twice.scores.shape == (6, 2) and (twice.scores[3:] == 0).all()


def test_padding_errors_are_named():
    boxes, labels = rotated_gts(5)
    gt = InstanceData(bboxes=boxes, labels=labels)
    with pytest.raises(ValueError, match='capacity: 5 gts do not fit in capacity=4'):
        pad_gt_instances(gt, 4)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match='capacity: expected an int >= 0'):
            pad_gt_instances(gt, bad)
    with pytest.raises(ValueError, match=r'gt.bboxes: expected 4 .* or 5 .* got 8'):
        pad_gt_instances(InstanceData(bboxes=torch.zeros(2, 8)), 3)
    with pytest.raises(TypeError, match='gt.names: only tensor fields'):
        pad_gt_instances(InstanceData(bboxes=boxes, names=['a'] * 5), 6)


def test_padding_reads_no_value_back():
    gt = InstanceData(bboxes=RotatedBoxes(torch.empty(3, 5, device='meta')),
                      labels=torch.empty(3, dtype=torch.long, device='meta'))
    padded = pad_gt_instances(gt, 8)
    assert padded.bboxes.device.type == 'meta' and padded.valid.shape == (8, )


def test_padding_boxes_stay_finite_in_coders_and_ious():
    """The padding boxes meet every prior in the coders and IoUs (with zero weight): finite
    results, even against degenerate priors (0 * inf would be NaN)."""
    assert rbox2hbox(torch.tensor(PADDING_BOX_XYWHA)).tolist() == list(PADDING_BOX_XYXY)
    rgt, hgt = torch.tensor([PADDING_BOX_XYWHA] * 3), torch.tensor([PADDING_BOX_XYXY] * 3)
    hpriors = torch.tensor([[0., 0., 1e-3, 1e-3], [10., 20., 600., 30.], [-5., -5., 5., 5.]])
    rpriors = torch.tensor([[1., 1., 1e-3, 1e-3, 0.], [300., 20., 600., 30., 1.5],
                            [0., 0., 10., 10., -1.5]])
    encoded = [DeltaXYWHBBoxCoder().encode(hpriors, hgt),
               DeltaXYWHTHBBoxCoder(angle_version='le90').encode(hpriors, rgt),
               DeltaXYWHTRBBoxCoder(angle_version='le90').encode(rpriors, rgt),
               RBboxOverlaps2D()(rgt, rpriors), RBboxOverlaps2D()(rgt, rpriors, mode='iof')]
    assert all(torch.isfinite(t).all() for t in encoded)


# ---- RedetMaxIoUAssigner with gt_instances.valid ------------------------------------------------
def padded(gts: InstanceData, layout: str, g) -> InstanceData:
    """gts with padding rows: at the end (pad_gt_instances), or spread between the real gts
    (a mask of any layout must work alike)."""
    if layout == 'end':
        return pad_gt_instances(gts, len(gts) + 5)
    total = len(gts) + 6
    real = torch.zeros(total, dtype=torch.bool)
    real[torch.randperm(total, generator=g)[:len(gts)].sort().values] = True
    boxes = torch.tensor([PADDING_BOX_XYXY]).repeat(total, 1)
    boxes[real] = gts.bboxes
    labels = torch.zeros(total, dtype=torch.long)
    labels[real] = gts.labels
    return InstanceData(bboxes=boxes, labels=labels, valid=real)


def real_positions(valid: torch.Tensor, gt_inds: torch.Tensor) -> torch.Tensor:
    """mmdet's gt_inds on the real gts alone, as 1 + positions in the padded set."""
    positions = torch.cat([torch.zeros(1, dtype=torch.long), valid.nonzero()[:, 0] + 1])
    return torch.where(gt_inds > 0, positions[gt_inds.clamp(min=0)], gt_inds)


CFGS = [dict(match_low_quality=low, min_pos_iou=min_pos, gt_max_assign_all=all_)
        for low, min_pos, all_ in itertools.product((True, False), (0.0, 0.3), (True, False))]


@pytest.mark.parametrize('layout', ['end', 'spread'])
@pytest.mark.parametrize('cfg', CFGS, ids=lambda c: '-'.join(map(str, c.values())))
def test_padding_gts_change_no_assignment(cfg, layout):
    """Padded gts (with padded priors and ignored boxes too): mmdet's result for the real gts
    and the real priors alone, and ours unpadded, element for element; no real gt included."""
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, ignore_iof_thr=0.5, **cfg)
    differs = 0
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        num_gts = seed % 7  # 0 included
        priors = grid_boxes(70, g)
        prior_valid = torch.rand(70, generator=g) < 0.8 if seed % 3 else None
        gts = InstanceData(bboxes=grid_boxes(num_gts, g),
                           labels=torch.randint(0, 5, (num_gts, ), generator=g))
        ignore = InstanceData(bboxes=grid_boxes(2, g)) if seed % 2 else None
        pad = padded(gts, layout, g)
        pred = InstanceData(priors=priors)
        if prior_valid is not None:
            pred.valid = prior_valid
        members = prior_valid if prior_valid is not None else torch.ones(70, dtype=torch.bool)
        result = ours.assign(pred, pad, ignore)
        unpadded = ours.assign(pred, gts, ignore)
        expected = theirs.assign(InstanceData(priors=priors[members]), gts, ignore)
        assert torch.equal(result.gt_inds[members], real_positions(pad.valid, expected.gt_inds))
        assert torch.equal(result.labels[members], expected.labels)
        assert torch.equal(result.max_overlaps[members], expected.max_overlaps)
        if layout == 'end':  # the same positions: bit for bit ours unpadded, on every prior
            for field in ('gt_inds', 'labels'):
                assert torch.equal(getattr(result, field), getattr(unpadded, field))
        # the mask matters: read as real gts, the padding rows change the result
        del pad.valid
        as_real = ours.assign(pred, pad, ignore)
        differs += not torch.equal(as_real.gt_inds, result.gt_inds)
    assert differs > len(SEEDS) // 3


@pytest.mark.parametrize('min_pos_iou', [0.0, -5.0, 0.3])
def test_padding_gts_claim_no_low_quality_match(min_pos_iou):
    """With min_pos_iou 0 every real gt claims its best prior even at IoU 0 (with
    gt_max_assign_all, every prior tied at its maximum); a padding gt claims none."""
    priors = torch.tensor([[0., 0., 10., 10.], [50., 50., 60., 60.], [80., 0., 90., 10.]])
    gts = InstanceData(bboxes=torch.tensor([[0., 0., 10., 12.], PADDING_BOX_XYXY,
                                            PADDING_BOX_XYXY]),
                       labels=torch.tensor([4, 0, 0]), valid=torch.tensor([True, False, False]))
    for all_ in (True, False):
        ours, theirs = assigner_pair(pos_iou_thr=0.9, neg_iou_thr=0.3, min_pos_iou=min_pos_iou,
                                     gt_max_assign_all=all_)
        result = ours.assign(InstanceData(priors=priors), gts)
        expected = theirs.assign(InstanceData(priors=priors), gts[:1])
        assert result.gt_inds.tolist() == expected.gt_inds.tolist() == [1, 0, 0]
        if min_pos_iou <= 0:  # read as real gts, the padding rows claim prior 0 (IoU 0.16)
            as_real = gts.clone()
            as_real.valid = torch.ones(3, dtype=torch.bool)
            assert ours.assign(InstanceData(priors=priors), as_real).gt_inds.tolist()[0] > 1


@pytest.mark.parametrize('ignore_wrt_candidates', [True, False])
def test_no_real_gt_makes_every_prior_a_negative(ignore_wrt_candidates):
    """mmdet's no-gt branch: every prior a negative (ignored ones too), max_overlaps 0; with a
    prior mask, the non-members stay ignored."""
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, ignore_iof_thr=0.5,
                                 min_pos_iou=0.0, ignore_wrt_candidates=ignore_wrt_candidates)
    g = torch.Generator().manual_seed(0)
    priors, ignore = grid_boxes(40, g), InstanceData(bboxes=grid_boxes(3, g))
    empty = InstanceData(bboxes=torch.zeros(0, 4), labels=torch.zeros(0, dtype=torch.long))
    pad = pad_gt_instances(empty, 4)
    assert ours._ignored_priors(priors, ignore).any()
    result = ours.assign(InstanceData(priors=priors), pad, ignore)
    expected = theirs.assign(InstanceData(priors=priors), empty, ignore)
    for field in ('gt_inds', 'labels', 'max_overlaps'):
        assert torch.equal(getattr(result, field), getattr(expected, field)), field
    assert (result.gt_inds == 0).all()
    members = torch.rand(40, generator=g) < 0.5
    masked = ours.assign(InstanceData(priors=priors, valid=members), pad, ignore)
    assert torch.equal(masked.gt_inds, torch.where(members, 0, -1))


def test_padding_gts_with_the_rotated_iou():
    cfg = dict(pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.0, match_low_quality=True,
               iou_calculator=dict(type='RedetRBboxOverlaps2D'))
    ours, theirs = assigner_pair(**cfg)
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        boxes, labels = rotated_gts(seed % 5, g)
        priors = torch.cat([rotated_gts(30, g)[0], boxes + torch.randn(boxes.shape, generator=g)])
        gts = InstanceData(bboxes=boxes, labels=labels)
        pad = pad_gt_instances(InstanceData(bboxes=RotatedBoxes(boxes), labels=labels), 6)
        result = ours.assign(InstanceData(priors=priors), pad)
        expected = theirs.assign(InstanceData(priors=priors), gts)
        for field in ('gt_inds', 'labels', 'max_overlaps'):
            assert torch.equal(getattr(result, field), getattr(expected, field)), field


@pytest.mark.parametrize('ignore_wrt_candidates', [True, False])
def test_padding_ignore_boxes_ignore_nothing(ignore_wrt_candidates):
    ours, _ = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, ignore_iof_thr=0.5,
                            ignore_wrt_candidates=ignore_wrt_candidates)
    g = torch.Generator().manual_seed(1)
    gts = InstanceData(bboxes=grid_boxes(4, g), labels=torch.zeros(4, dtype=torch.long))
    priors = torch.cat([grid_boxes(30, g), torch.tensor([PADDING_BOX_XYXY] * 3)])
    for count in (0, 2):
        ignore = InstanceData(bboxes=grid_boxes(count, g), labels=torch.zeros(count).long())
        pad = pad_gt_instances(ignore, 5)
        result = ours.assign(InstanceData(priors=priors), gts, pad)
        expected = ours.assign(InstanceData(priors=priors), gts, ignore)
        assert torch.equal(result.gt_inds, expected.gt_inds)
        del pad.valid  # read as real, the padding boxes ignore the priors on them
        assert (ours.assign(InstanceData(priors=priors), gts, pad).gt_inds[-3:] == -1).all()


def test_bad_gt_valid_is_named():
    ours, _ = assigner_pair()
    gts = InstanceData(bboxes=grid_boxes(3, torch.Generator()), labels=torch.zeros(3).long(),
                       valid=torch.ones(3, dtype=torch.long))
    priors = InstanceData(priors=grid_boxes(5, torch.Generator()))
    with pytest.raises(TypeError, match=r'gt_instances.valid: expected a bool tensor of '
                                        r'shape \(3,\), got torch.int64'):
        ours.assign(priors, gts)
    gts.valid = torch.ones(3, dtype=torch.bool)
    ignore = InstanceData(bboxes=grid_boxes(2, torch.Generator()), valid=torch.ones(2))
    ours.ignore_iof_thr = 0.5
    with pytest.raises(TypeError, match='gt_instances_ignore.valid: expected a bool tensor'):
        ours.assign(priors, gts, ignore)
    ours.gpu_assign_thr = 2
    with pytest.raises(ValueError, match='gt_instances.valid: not supported with gpu_assign_thr'):
        ours.assign(priors, gts)


def test_assign_with_padded_gts_reads_no_value_back():
    ours, _ = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.0,
                            ignore_iof_thr=0.5)
    pred = InstanceData(priors=torch.empty(50, 4, device='meta'),
                        valid=torch.empty(50, dtype=torch.bool, device='meta'))
    gts = pad_gt_instances(InstanceData(bboxes=torch.empty(3, 4, device='meta'),
                                        labels=torch.empty(3, dtype=torch.long, device='meta')), 8)
    ignore = pad_gt_instances(InstanceData(bboxes=torch.empty(1, 4, device='meta')), 4)
    result = ours.assign(pred, gts, ignore)
    assert result.gt_inds.device.type == 'meta' and result.gt_inds.shape == (50, )
