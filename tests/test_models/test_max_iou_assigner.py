"""RedetMaxIoUAssigner gives mmdet's MaxIoUAssigner result element for element (ties, the
"later gt overwrites" order of low-quality matching, ignored boxes, empty inputs), without
waiting for the device."""
import glob
import itertools
import os.path as osp

import pytest
import torch
from mmdet.models.task_modules.assigners import MaxIoUAssigner as MMDetMaxIoUAssigner
from mmdet.registry import TASK_UTILS
from mmengine.config import Config
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models.task_modules import MaxIoUAssigner
from redet_plugin.testing import waits_for_nothing

from tests._helpers import REPO

SEEDS = range(40)


def assigner_pair(**cfg):
    cfg = dict(dict(pos_iou_thr=0.7, neg_iou_thr=0.3), **cfg)
    ours = TASK_UTILS.build(dict(type='RedetMaxIoUAssigner', **cfg))
    assert type(ours) is MaxIoUAssigner
    return ours, MMDetMaxIoUAssigner(**cfg)


def assert_same_result(ours, theirs):
    assert ours.num_gts == theirs.num_gts
    for field in ('gt_inds', 'max_overlaps', 'labels'):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, field
        assert torch.equal(a, b), (field, a, b)


def tied_overlaps(seed, dtype):
    """Overlaps in steps of 1/8 (exact in both dtypes) so that maxima tie all over: per gt
    several boxes share its maximum, several gts share one best box, some gts stay below any
    min_pos_iou, some rows are all zero, some boxes are ignored (-1 in every row)."""
    g = torch.Generator().manual_seed(seed)
    num_gts = int(torch.randint(1, 30, (1, ), generator=g))
    num_bboxes = int(torch.randint(1, 90, (1, ), generator=g))
    overlaps = torch.randint(0, 9, (num_gts, num_bboxes), generator=g).to(dtype) / 8
    rows = torch.rand(num_gts, generator=g)
    overlaps[rows < 0.2] *= 0.25  # maxima at most 0.25
    overlaps[(rows >= 0.2) & (rows < 0.3)] = 0
    shared = int(torch.randint(0, num_bboxes, (1, ), generator=g))
    claimants = torch.rand(num_gts, generator=g) < 0.3
    overlaps[claimants, shared] = 1.0  # several gts with the same best box
    overlaps[:, torch.rand(num_bboxes, generator=g) < 0.1] = -1  # ignored boxes
    labels = torch.randint(0, 15, (num_gts, ), generator=g)
    return overlaps, labels


CONFIGS = [dict(gt_max_assign_all=all_, match_low_quality=low, min_pos_iou=min_pos,
                neg_iou_thr=neg, pos_iou_thr=pos)
           for all_, low, min_pos, neg, pos in itertools.product(
               (True, False), (True, False), (0.0, 0.3, 0.5), (0.3, (0.1, 0.4), 0), (0.5, 0.7))]


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('cfg', CONFIGS, ids=lambda c: '-'.join(map(str, c.values())))
def test_same_result_as_mmdet_on_tied_overlaps(cfg, dtype):
    ours, theirs = assigner_pair(**cfg)
    for seed in SEEDS:
        overlaps, labels = tied_overlaps(seed, dtype)
        assert_same_result(ours.assign_wrt_overlaps(overlaps.clone(), labels),
                           theirs.assign_wrt_overlaps(overlaps.clone(), labels))


def test_tied_overlaps_exercise_the_orders_that_matter():
    """The random cases above contain what a wrong vectorisation would get wrong: a box claimed
    by several gts in step 4 (where the first instead of the last winner differs), and step 4
    overwriting step 3."""
    first_wins = overwrites = 0
    ours, _ = assigner_pair(min_pos_iou=0.3)
    for seed in SEEDS:
        overlaps, labels = tied_overlaps(seed, torch.float32)
        gt_max = overlaps.max(dim=1).values
        claimed = (overlaps == gt_max[:, None]) & (gt_max >= 0.3)[:, None]
        first = torch.where(claimed.any(0), claimed.to(torch.uint8).argmax(0) + 1, 0)
        last = ours._low_quality_gt_inds(overlaps, gt_max, overlaps.max(dim=1).indices)
        first_wins += int((first != last).sum())
        step3 = torch.where(overlaps.max(0).values >= 0.7, overlaps.max(0).indices + 1, 0)
        overwrites += int(((step3 > 0) & (last > 0) & (step3 != last)).sum())
    assert first_wins > 20 and overwrites > 20


@pytest.mark.parametrize('gt_max_assign_all', [True, False])
def test_later_gt_overwrites_earlier_hand_case(gt_max_assign_all):
    # box 0 is the best box of gts 0 and 2, box 2 of gts 1 and 3; step 3 gives box 2 to gt 1
    # (0.8 >= 0.7), step 4 hands it to gt 3. With gt_max_assign_all gt 2 also takes box 1 (a tie
    # with box 0); without it, gt 2's row has a single maximum (argmax ties are not pinned).
    overlaps = torch.tensor([[0.5, 0.1, 0.0],
                             [0.2, 0.4, 0.8],
                             [0.5, 0.5 if gt_max_assign_all else 0.45, 0.1],
                             [0.1, 0.3, 0.75]])
    labels = torch.tensor([7, 8, 9, 10])
    ours, theirs = assigner_pair(pos_iou_thr=0.7, neg_iou_thr=0.3, min_pos_iou=0.3,
                                 gt_max_assign_all=gt_max_assign_all)
    result = ours.assign_wrt_overlaps(overlaps, labels)
    assert result.gt_inds.tolist() == ([3, 3, 4] if gt_max_assign_all else [3, -1, 4])
    assert result.labels.tolist() == ([9, 9, 10] if gt_max_assign_all else [9, -1, 10])
    assert_same_result(result, theirs.assign_wrt_overlaps(overlaps, labels))


def test_more_gts_than_a_small_index_type_holds():
    """Past 2**15 gts the step-4 winner needs a wider index type than below it."""
    g = torch.Generator().manual_seed(0)
    overlaps = torch.randint(0, 5, (2**15 + 40, 6), generator=g).float() / 4
    labels = torch.randint(0, 15, (overlaps.size(0), ), generator=g)
    ours, theirs = assigner_pair(min_pos_iou=0.3)
    result = ours.assign_wrt_overlaps(overlaps, labels)
    assert result.gt_inds.max() > 2**15
    assert_same_result(result, theirs.assign_wrt_overlaps(overlaps, labels))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('shape', [(0, 5), (3, 0), (0, 0)])
@pytest.mark.parametrize('low_quality', [True, False])
def test_empty_gts_or_boxes(shape, dtype, low_quality):
    ours, theirs = assigner_pair(match_low_quality=low_quality)
    overlaps = torch.rand(shape, dtype=dtype)
    labels = torch.zeros(shape[0], dtype=torch.long)
    assert_same_result(ours.assign_wrt_overlaps(overlaps, labels),
                       theirs.assign_wrt_overlaps(overlaps, labels))


def test_bad_labels_are_named():
    ours, _ = assigner_pair()
    overlaps = torch.rand(3, 4)
    with pytest.raises(ValueError, match=r'gt_labels: expected shape \(3,\).*got \(2,\)'):
        ours.assign_wrt_overlaps(overlaps, torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match='gt_labels: expected an integer tensor'):
        ours.assign_wrt_overlaps(overlaps, torch.zeros(3))
    with pytest.raises(TypeError, match='gt_labels: expected an integer tensor.*NoneType'):
        ours.assign_wrt_overlaps(overlaps, None)


@pytest.mark.parametrize('label_dtype', [torch.int32, torch.uint8])
def test_narrow_integer_labels(label_dtype):
    # mmdet's index_put needs long labels; ours takes any integer type, with the same result
    ours, theirs = assigner_pair(min_pos_iou=0.3)
    for seed in SEEDS[:10]:
        overlaps, labels = tied_overlaps(seed, torch.float32)
        assert_same_result(ours.assign_wrt_overlaps(overlaps, labels.to(label_dtype)),
                           theirs.assign_wrt_overlaps(overlaps, labels))


def grid_boxes(n, g):
    """Horizontal boxes on a coarse grid: duplicates and equal IoUs are common."""
    xy = torch.randint(0, 6, (n, 2), generator=g).float() * 4
    wh = torch.randint(1, 4, (n, 2), generator=g).float() * 4
    return torch.cat([xy, xy + wh], 1)


@pytest.mark.parametrize('gt_max_assign_all', [True, False])
@pytest.mark.parametrize('ignore_wrt_candidates', [True, False])
def test_assign_with_instance_data(gt_max_assign_all, ignore_wrt_candidates):
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.1,
                                 gt_max_assign_all=gt_max_assign_all, ignore_iof_thr=0.5,
                                 ignore_wrt_candidates=ignore_wrt_candidates)
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        num_gts = seed % 12  # includes no gts
        pred = InstanceData(priors=grid_boxes(60 if seed % 7 else 0, g))
        gts = InstanceData(bboxes=grid_boxes(num_gts, g),
                           labels=torch.randint(0, 5, (num_gts, ), generator=g))
        ignore = InstanceData(bboxes=grid_boxes(seed % 3, g)) if seed % 2 else None
        assert_same_result(ours.assign(pred, gts, ignore), theirs.assign(pred, gts, ignore))


def test_assign_with_rotated_iou():
    cfg = dict(pos_iou_thr=0.5, neg_iou_thr=0.5, min_pos_iou=0.5, match_low_quality=False,
               iou_calculator=dict(type='RedetRBboxOverlaps2D'))
    ours, theirs = assigner_pair(**cfg)
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        gts = torch.cat([torch.rand(8, 2, generator=g) * 60, 8 + torch.rand(8, 2, generator=g) * 20,
                         torch.rand(8, 1, generator=g) - 0.5], 1)
        priors = torch.cat([gts + torch.randn(8, 5, generator=g), gts[:4], gts[:4]])  # ties
        pred = InstanceData(priors=priors)
        gt = InstanceData(bboxes=gts, labels=torch.randint(0, 5, (8, ), generator=g))
        assert_same_result(ours.assign(pred, gt), theirs.assign(pred, gt))


def test_our_configs_use_it_with_their_iou_calculators():
    """Every assigner in configs/redet is ours; stage 2 keeps the rotated IoU."""
    for path in sorted(glob.glob(osp.join(REPO, 'configs/redet/*.py'))):
        train_cfg = Config.fromfile(path).model.train_cfg
        assigners = [train_cfg.rpn.assigner] + [stage.assigner for stage in train_cfg.rcnn]
        assert [a.type for a in assigners] == ['RedetMaxIoUAssigner'] * 3, path
        assert train_cfg.rcnn[1].assigner.iou_calculator.type == 'RedetRBboxOverlaps2D', path


@pytest.mark.cuda
@pytest.mark.parametrize('gt_max_assign_all', [True, False])
def test_cuda_same_result_and_no_host_sync(gt_max_assign_all):
    ours, theirs = assigner_pair(min_pos_iou=0.3, gt_max_assign_all=gt_max_assign_all)
    for seed in SEEDS:
        overlaps, labels = tied_overlaps(seed, torch.float32)
        overlaps, labels = overlaps.cuda(), labels.cuda()
        expected = theirs.assign_wrt_overlaps(overlaps.clone(), labels)
        with waits_for_nothing():
            result = ours.assign_wrt_overlaps(overlaps.clone(), labels)
        assert_same_result(result, expected)
        cpu = ours.assign_wrt_overlaps(overlaps.cpu(), labels.cpu())
        assert torch.equal(result.gt_inds.cpu(), cpu.gt_inds)
        assert torch.equal(result.labels.cpu(), cpu.labels)


@pytest.mark.parametrize('num_gts', [0, 1, 9])
@pytest.mark.parametrize('match_low_quality', [True, False])
def test_valid_priors_get_mmdets_assignment_of_the_members_alone(num_gts, match_low_quality):
    """A fixed-size prior set: the members (valid) get exactly what mmdet gives the members
    alone; the others are ignored and are no gt's best match."""
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.1,
                                 match_low_quality=match_low_quality, ignore_iof_thr=0.5)
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        priors = grid_boxes(80, g)
        valid = torch.rand(80, generator=g) < 0.6
        gts = InstanceData(bboxes=grid_boxes(num_gts, g),
                           labels=torch.randint(0, 5, (num_gts, ), generator=g))
        ignore = InstanceData(bboxes=grid_boxes(2, g)) if seed % 2 else None
        result = ours.assign(InstanceData(priors=priors, valid=valid), gts, ignore)
        members = theirs.assign(InstanceData(priors=priors[valid]), gts, ignore)
        assert torch.equal(result.gt_inds[valid], members.gt_inds)
        assert torch.equal(result.labels[valid], members.labels)
        assert torch.equal(result.max_overlaps[valid], members.max_overlaps)
        assert (result.gt_inds[~valid] == -1).all() and (result.labels[~valid] == -1).all()


def test_valid_members_change_the_low_quality_matches():
    # the case the valid mask exists for: a gt whose best prior is not a member takes its best
    # member instead (mmdet on the members); reading valid as a mere filter afterwards fails
    priors = torch.tensor([[0., 0., 10., 10.], [0., 0., 10., 14.]])
    gts = InstanceData(bboxes=torch.tensor([[0., 0., 10., 10.]]), labels=torch.tensor([3]))
    ours, _ = assigner_pair(pos_iou_thr=0.9, neg_iou_thr=0.3, min_pos_iou=0.3)
    result = ours.assign(InstanceData(priors=priors, valid=torch.tensor([False, True])), gts)
    assert result.gt_inds.tolist() == [-1, 1]


def test_bad_valid_mask_is_named():
    ours, _ = assigner_pair()
    gts = InstanceData(bboxes=grid_boxes(3, torch.Generator()), labels=torch.zeros(3).long())
    priors = grid_boxes(5, torch.Generator())
    with pytest.raises(TypeError, match=r'pred_instances.valid: expected a bool tensor of '
                                        r'shape \(5,\)'):
        ours.assign(InstanceData(priors=priors, valid=torch.ones(5)), gts)


def test_assign_reads_no_value_back():
    """Meta tensors hold no values: any read-back (.item(), a boolean index) raises."""
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.1,
                                 ignore_iof_thr=0.5)
    pred = InstanceData(priors=torch.empty(50, 4, device='meta'),
                        valid=torch.empty(50, dtype=torch.bool, device='meta'))
    gts = InstanceData(bboxes=torch.empty(7, 4, device='meta'),
                       labels=torch.empty(7, dtype=torch.long, device='meta'))
    ignore = InstanceData(bboxes=torch.empty(2, 4, device='meta'))
    result = ours.assign(pred, gts, ignore)
    assert result.gt_inds.device.type == 'meta' and result.gt_inds.shape == (50, )
    with pytest.raises(Exception):  # mmdet's reads values back
        theirs.assign(InstanceData(priors=pred.priors), gts, ignore)


@pytest.mark.cuda
def test_cuda_assign_with_ignore_and_valid_waits_for_nothing():
    ours, theirs = assigner_pair(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.1,
                                 ignore_iof_thr=0.5)
    g = torch.Generator().manual_seed(3)
    priors, valid = grid_boxes(200, g).cuda(), (torch.rand(200, generator=g) < 0.7).cuda()
    gts = InstanceData(bboxes=grid_boxes(9, g).cuda(),
                       labels=torch.randint(0, 5, (9, ), generator=g).cuda())
    ignore = InstanceData(bboxes=grid_boxes(2, g).cuda())
    ours.assign(InstanceData(priors=priors, valid=valid), gts, ignore)  # warm-up
    with waits_for_nothing():
        result = ours.assign(InstanceData(priors=priors, valid=valid), gts, ignore)
    members = theirs.assign(InstanceData(priors=priors[valid]), gts, ignore)
    assert torch.equal(result.gt_inds[valid], members.gt_inds)
