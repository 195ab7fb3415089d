"""The sync-free replacements of mmdet parts equal mmdet's: the horizontal delta coder and IoU
calculator bit for bit, the smooth L1 loss, and the fixed-size random sampler in distribution
(mmdet's counts exactly, uniform draws). Meta tensors prove that none reads a value back."""
import pytest
import torch
from mmdet.models.losses import SmoothL1Loss as MMDetSmoothL1Loss
from mmdet.models.task_modules.assigners import BboxOverlaps2D as MMDetBboxOverlaps2D
from mmdet.models.task_modules.coders import DeltaXYWHBBoxCoder as MMDetDeltaXYWHBBoxCoder
from mmdet.models.task_modules.samplers import RandomSampler
from mmdet.registry import MODELS, TASK_UTILS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models.task_modules.samplers.fixed_size_sampler import check_random_sampler, sample_masks
from redet_plugin.testing import waits_for_nothing
from tests._helpers import peak_cpu_bytes


def random_boxes(n, g, scale=100.0):
    xy = torch.rand(n, 2, generator=g) * scale
    return torch.cat([xy, xy + 1 + torch.rand(n, 2, generator=g) * scale / 2], 1)


CODER_CFGS = [dict(), dict(target_means=[0.1, -0.2, 0.0, 0.05], target_stds=[0.1, 0.1, 0.2, 0.2]),
              dict(clip_border=False)]


@pytest.mark.parametrize('cfg', CODER_CFGS)
def test_delta_coder_equals_mmdets_bit_for_bit(cfg):
    ours = TASK_UTILS.build(dict(type='RedetDeltaXYWHBBoxCoder', **cfg))
    theirs = MMDetDeltaXYWHBBoxCoder(**cfg)
    g = torch.Generator().manual_seed(0)
    priors, gts = random_boxes(300, g), random_boxes(300, g)
    assert torch.equal(ours.encode(priors, gts), theirs.encode(priors, gts))
    for num_classes in (1, 3):
        deltas = torch.randn(300, 4 * num_classes, generator=g) * 2
        for max_shape in (None, (80, 120), (80, 120, 3)):
            assert torch.equal(ours.decode(priors, deltas, max_shape=max_shape),
                               theirs.decode(priors, deltas, max_shape=max_shape))
        assert torch.equal(ours.decode(priors, deltas, wh_ratio_clip=0.1),
                           theirs.decode(priors, deltas, wh_ratio_clip=0.1))
    empty = torch.zeros(0, 4)
    assert ours.decode(empty, empty).shape == theirs.decode(empty, empty).shape == (0, 4)


def test_delta_coder_names_bad_shapes():
    ours = TASK_UTILS.build(dict(type='RedetDeltaXYWHBBoxCoder'))
    with pytest.raises(ValueError, match=r'encode: expected bboxes and gt_bboxes of one shape'):
        ours.encode(torch.zeros(3, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r'decode: expected one row of deltas per box \(3\)'):
        ours.decode(torch.zeros(3, 4), torch.zeros(2, 4))


@pytest.mark.parametrize('mode', ['iou', 'iof'])
@pytest.mark.parametrize('is_aligned', [False, True])
def test_bbox_overlaps_equal_mmdets_bit_for_bit(mode, is_aligned):
    ours, theirs = TASK_UTILS.build(dict(type='RedetBboxOverlaps2D')), MMDetBboxOverlaps2D()
    g = torch.Generator().manual_seed(1)
    for rows, cols in ((40, 40), (0, 7), (7, 0), (1, 1)):
        if is_aligned and rows != cols:
            continue
        a, b = random_boxes(rows, g), random_boxes(cols, g)
        b[: cols // 2] = a[: cols // 2] if rows >= cols // 2 else b[: cols // 2]  # exact repeats
        expected = theirs(a, b, mode=mode, is_aligned=is_aligned)
        result = ours(a, b, mode=mode, is_aligned=is_aligned)
        assert result.shape == expected.shape and torch.equal(result, expected)
    scored = torch.cat([random_boxes(5, g), torch.rand(5, 1, generator=g)], 1)  # (n, 5): score
    assert torch.equal(ours(scored, scored), theirs(scored, scored))


@pytest.mark.parametrize('mode', ['iou', 'iof'])
def test_bbox_overlaps_hold_at_most_three_matrices_at_once(mode):
    # the RPN assigner's (gts, anchors) matrix is a training step's largest tensor; mmdet's
    # formula holds ten of its size at once
    g = torch.Generator().manual_seed(5)
    gts, anchors = random_boxes(64, g), random_boxes(20000, g, scale=1000.0)
    matrix_bytes = 64 * 20000 * 4
    peak, iou = peak_cpu_bytes(lambda: TASK_UTILS.build(dict(type='RedetBboxOverlaps2D'))(
        gts, anchors, mode=mode))
    assert torch.equal(iou, MMDetBboxOverlaps2D()(gts, anchors, mode=mode))
    assert matrix_bytes <= peak <= 3.05 * matrix_bytes
    theirs_peak, _ = peak_cpu_bytes(lambda: MMDetBboxOverlaps2D()(gts, anchors, mode=mode))
    assert theirs_peak > 6 * matrix_bytes  # the measure sees temporaries


@pytest.mark.parametrize('reduction', ['mean', 'sum', 'none'])
def test_smooth_l1_loss_equals_mmdets(reduction):
    cfg = dict(beta=1.0 / 9.0, loss_weight=2.0, reduction=reduction)
    ours, theirs = MODELS.build(dict(type='RedetSmoothL1Loss', **cfg)), MMDetSmoothL1Loss(**cfg)
    g = torch.Generator().manual_seed(2)
    pred, target = torch.randn(50, 4, generator=g), torch.randn(50, 4, generator=g)
    weight = (torch.rand(50, 4, generator=g) < 0.3).float()
    factor = None if reduction != 'mean' else torch.tensor(17.0)
    torch.testing.assert_close(ours(pred, target, weight, avg_factor=factor),
                               theirs(pred, target, weight, avg_factor=factor))
    # no positive weight: mmdet returns early with (pred * weight).sum(); ours computes the same 0
    zero = torch.zeros(50, 4)
    assert float(ours(pred, target, zero, avg_factor=factor).sum()) == 0.0
    with pytest.raises(ValueError, match='reduction_override'):
        ours(pred, target, reduction_override='max')


def gt_inds_with(num_pos, num_neg, num_ignored, g):
    gt_inds = torch.cat([torch.randint(1, 5, (num_pos, ), generator=g),
                         torch.zeros(num_neg, dtype=torch.long),
                         torch.full((num_ignored, ), -1, dtype=torch.long)])
    return gt_inds[torch.randperm(gt_inds.numel(), generator=g)]


def mmdet_counts(sampler, gt_inds):
    from mmdet.models.task_modules.assigners import AssignResult
    from mmengine.structures import InstanceData
    assign = AssignResult(4, gt_inds, torch.zeros(gt_inds.shape), labels=gt_inds.clamp(min=0))
    result = sampler.sample(assign, InstanceData(priors=torch.zeros(gt_inds.numel(), 4)),
                            InstanceData(bboxes=torch.zeros(4, 4), labels=torch.zeros(4).long()))
    return result.pos_inds.numel(), result.neg_inds.numel()


@pytest.mark.parametrize('neg_pos_ub', [-1, 0, 1.5, 3])
@pytest.mark.parametrize('counts', [(0, 0, 10), (3, 500, 5), (300, 1000, 20), (400, 50, 0),
                                    (0, 900, 0), (5, 3, 0)])
def test_sampler_draws_mmdets_counts_from_the_right_sets(counts, neg_pos_ub):
    sampler = RandomSampler(num=256, pos_fraction=0.25, neg_pos_ub=neg_pos_ub,
                            add_gt_as_proposals=False)
    g = torch.Generator().manual_seed(sum(counts))
    gt_inds = gt_inds_with(*counts, g)
    drawn = sample_masks(gt_inds, sampler, generator=g)
    assert (gt_inds[drawn.pos] > 0).all() and (gt_inds[drawn.neg] == 0).all()
    assert (int(drawn.pos.sum()), int(drawn.neg.sum())) == mmdet_counts(sampler, gt_inds)


def test_sampler_draws_uniformly():
    """Each positive is drawn with probability k / n; the frequencies over 4000 draws stay
    within 5 standard deviations, and an order-biased draw (the first k) fails by far."""
    sampler = RandomSampler(num=40, pos_fraction=0.5, neg_pos_ub=-1)
    g = torch.Generator().manual_seed(3)
    gt_inds = gt_inds_with(60, 100, 10, g)
    draws = 4000
    pos_freq, neg_freq = torch.zeros(gt_inds.shape), torch.zeros(gt_inds.shape)
    for _ in range(draws):
        drawn = sample_masks(gt_inds, sampler, generator=g)
        pos_freq += drawn.pos
        neg_freq += drawn.neg
    for freq, members, k in ((pos_freq, gt_inds > 0, 20), (neg_freq, gt_inds == 0, 20)):
        p = k / int(members.sum())
        sigma = (p * (1 - p) / draws) ** 0.5
        assert ((freq[members] / draws - p).abs() < 5 * sigma).all()
        assert (freq[~members] == 0).all()


def test_sampler_reads_no_value_back():
    sampler = RandomSampler(num=256, pos_fraction=0.5, neg_pos_ub=2)
    drawn = sample_masks(torch.empty(5000, dtype=torch.long, device='meta'), sampler)
    assert drawn.pos.device.type == 'meta' and drawn.pos.shape == (5000, )


def test_only_mmdets_random_sampler_or_one_with_its_own_keys_is_accepted():
    from mmdet.models.task_modules.samplers import InstanceBalancedPosSampler, PseudoSampler
    check_random_sampler(RandomSampler(num=4, pos_fraction=0.5), 'x')
    with pytest.raises(TypeError, match=r"train_cfg.rpn.sampler: expected a sampler of type "
                                        r"'RandomSampler'.*got PseudoSampler"):
        check_random_sampler(PseudoSampler(), 'train_cfg.rpn.sampler')
    # a subclass that changes mmdet's rule is refused; one that only supplies keys is drawn
    with pytest.raises(TypeError, match='got InstanceBalancedPosSampler'):
        check_random_sampler(InstanceBalancedPosSampler(num=4, pos_fraction=0.5), 'x')

    class ReversedKeys(RandomSampler):
        def draw_keys(self, gt_inds):
            return 1 - torch.arange(1, gt_inds.numel() + 1) / (gt_inds.numel() + 1)

    sampler = ReversedKeys(num=4, pos_fraction=0.5)
    check_random_sampler(sampler, 'x')
    drawn = sample_masks(torch.tensor([1, 1, 1, 0, 0, 0, 0]), sampler)
    assert drawn.pos.tolist() == [False, True, True, False, False, False, False]
    assert drawn.neg.tolist() == [False, False, False, False, False, True, True]


@pytest.mark.cuda
def test_cuda_coder_overlaps_and_sampler_wait_for_nothing():
    coder = TASK_UTILS.build(dict(type='RedetDeltaXYWHBBoxCoder', **CODER_CFGS[1]))
    overlaps = TASK_UTILS.build(dict(type='RedetBboxOverlaps2D'))
    g = torch.Generator().manual_seed(4)
    a, b = random_boxes(100, g).cuda(), random_boxes(100, g).cuda()
    gt_inds = gt_inds_with(50, 300, 10, g).cuda()
    sampler = RandomSampler(num=64, pos_fraction=0.25, neg_pos_ub=3)
    with waits_for_nothing():
        deltas = coder.encode(a, b)
        decoded = coder.decode(a, deltas, max_shape=(90, 90))
        iou = overlaps(a, b)
        drawn = sample_masks(gt_inds, sampler)
    theirs = MMDetDeltaXYWHBBoxCoder(**CODER_CFGS[1])
    assert torch.equal(deltas, theirs.encode(a, b))
    assert torch.equal(decoded, theirs.decode(a, theirs.encode(a, b), max_shape=(90, 90)))
    assert torch.equal(iou, MMDetBboxOverlaps2D()(a, b))
    assert (int(drawn.pos.sum()), int(drawn.neg.sum())) == mmdet_counts(sampler, gt_inds.cpu())
