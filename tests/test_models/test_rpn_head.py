"""RedetRPNHead against mmdet's RPNHead with the same weights: the same losses for the same draw
(mmdet's per-level losses summed), the same proposals (the valid rows), and no value read back
(meta tensors on the CPU, sync_debug_mode on a GPU)."""
import copy

import pytest
import torch
from mmdet.models.dense_heads import RPNHead as MMDetRPNHead
from mmdet.models.task_modules.samplers import RandomSampler
from mmdet.registry import MODELS
from mmengine.config import ConfigDict
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.testing import waits_for_nothing

STRIDES = [4, 8, 16, 32, 64]
PAD = 128


def head_cfg(ours=True, num=256, **train):
    train_cfg = dict(
        assigner=dict(type='RedetMaxIoUAssigner' if ours else 'MaxIoUAssigner', pos_iou_thr=0.7,
                      neg_iou_thr=0.3, min_pos_iou=0.3, match_low_quality=True,
                      ignore_iof_thr=-1),
        sampler=dict(type='RandomSampler', num=num, pos_fraction=0.5, neg_pos_ub=-1,
                     add_gt_as_proposals=False),
        allowed_border=0, pos_weight=-1, debug=False)
    train_cfg.update(train)
    return dict(
        type='RedetRPNHead' if ours else 'RPNHead', in_channels=8, feat_channels=8,
        anchor_generator=dict(type='AnchorGenerator', scales=[2], ratios=[0.5, 1.0, 2.0],
                              strides=STRIDES),
        bbox_coder=dict(type='RedetDeltaXYWHBBoxCoder' if ours else 'DeltaXYWHBBoxCoder',
                        target_means=[.0] * 4, target_stds=[1.0] * 4),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0),
        loss_bbox=dict(type='RedetSmoothL1Loss' if ours else 'SmoothL1Loss', beta=1.0 / 9.0,
                       loss_weight=1.0),
        train_cfg=ConfigDict(train_cfg), test_cfg=ConfigDict(proposal_cfg()))


def proposal_cfg(nms_pre=60, max_per_img=40, min_bbox_size=0):
    return ConfigDict(nms_pre=nms_pre, max_per_img=max_per_img,
                      nms=dict(type='nms', iou_threshold=0.7), min_bbox_size=min_bbox_size)


def head_pair(**kwargs):
    torch.manual_seed(0)
    ours = MODELS.build(head_cfg(True, **kwargs))
    theirs = MODELS.build(head_cfg(False, **kwargs))
    assert type(theirs) is MMDetRPNHead
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def head_outputs(seed, num_imgs=2):
    g = torch.Generator().manual_seed(seed)
    cls_scores = [torch.randn(num_imgs, 3, PAD // s, PAD // s, generator=g) * 2 for s in STRIDES]
    bbox_preds = [torch.randn(num_imgs, 12, PAD // s, PAD // s, generator=g) * 0.3
                  for s in STRIDES]
    return cls_scores, bbox_preds


def image_metas(num_imgs=2):
    shapes = [(PAD, PAD), (100, 117), (128, 90)][:num_imgs]
    return [dict(img_shape=shape, pad_shape=(PAD, PAD), scale_factor=(0.5, 0.8),
                 batch_input_shape=(PAD, PAD)) for shape in shapes]


def ground_truth(seed, counts=(7, 0)):
    g = torch.Generator().manual_seed(100 + seed)
    gts = []
    for n in counts:
        xy = torch.rand(n, 2, generator=g) * 90
        boxes = torch.cat([xy, xy + 4 + torch.rand(n, 2, generator=g) * 30], 1)
        gts.append(InstanceData(bboxes=boxes, labels=torch.zeros(n, dtype=torch.long)))
    return gts


def total(loss):
    return sum(loss) if isinstance(loss, (list, tuple)) else loss


@pytest.mark.parametrize('seed', range(4))
def test_losses_equal_mmdets_when_all_are_drawn(seed):
    # a sampler num above the anchor count draws every positive and negative: no randomness
    ours, theirs = head_pair(num=10**6)
    outs, metas = head_outputs(seed), image_metas()
    counts = [(7, 0), (3, 12), (0, 0), (20, 1)][seed]
    gts = ground_truth(seed, counts)
    result = ours.loss_by_feat(*outs, gts, metas)
    expected = theirs.loss_by_feat(*outs, copy.deepcopy(gts), metas)
    for key in ('loss_rpn_cls', 'loss_rpn_bbox'):
        torch.testing.assert_close(result[key], total(expected[key]), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('pos_weight', [-1, 2.0])
def test_losses_equal_mmdets_for_the_same_draw(seed, pos_weight, monkeypatch):
    """num=256 as configured: with increasing keys our draw is the first members by index, and
    mmdet's random_choice patched to take the first of its gallery draws the same anchors."""
    ours, theirs = head_pair(pos_weight=pos_weight)
    outs, metas = head_outputs(seed), image_metas()
    gts = ground_truth(seed, [(40, 2), (9, 25), (60, 60)][seed])
    real_rand = torch.rand
    monkeypatch.setattr(torch, 'rand', lambda shape, **kw: torch.linspace(
        0, 0.99, shape[0] if isinstance(shape, torch.Size) else shape,
        device=kw.get('device')) if kw.get('generator') is None else real_rand(shape, **kw))
    monkeypatch.setattr(RandomSampler, 'random_choice', lambda self, gallery, num: gallery[:num])
    result = ours.loss_by_feat(*outs, gts, metas)
    expected = theirs.loss_by_feat(*outs, copy.deepcopy(gts), metas)
    for key in ('loss_rpn_cls', 'loss_rpn_bbox'):
        torch.testing.assert_close(result[key], total(expected[key]), rtol=1e-5, atol=1e-7)


def test_the_same_draw_test_can_fail(monkeypatch):
    # a different draw (mmdet's last members instead of its first) changes the losses
    ours, theirs = head_pair()
    outs, metas, gts = head_outputs(0), image_metas(), ground_truth(0, (60, 60))
    monkeypatch.setattr(torch, 'rand', lambda shape, **kw: torch.linspace(0, 0.99, shape[0]))
    monkeypatch.setattr(RandomSampler, 'random_choice', lambda self, gallery, num: gallery[-num:])
    result = ours.loss_by_feat(*outs, gts, metas)
    expected = theirs.loss_by_feat(*outs, copy.deepcopy(gts), metas)
    assert not torch.allclose(result['loss_rpn_cls'], total(expected['loss_rpn_cls']))


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('cfg', [proposal_cfg(), proposal_cfg(nms_pre=-1, max_per_img=1000),
                                 proposal_cfg(nms_pre=30, max_per_img=5, min_bbox_size=6)],
                         ids=['nms_pre60-max40', 'all', 'min_size6'])
@pytest.mark.parametrize('rescale', [False, True])
def test_proposals_are_mmdets(seed, cfg, rescale):
    ours, theirs = head_pair()
    outs, metas = head_outputs(seed, 3), image_metas(3)
    result = ours.predict_by_feat(*outs, batch_img_metas=metas, cfg=cfg, rescale=rescale)
    expected = theirs.predict_by_feat(*outs, batch_img_metas=metas, cfg=copy.deepcopy(cfg),
                                      rescale=rescale)
    for res, exp in zip(result, expected):
        assert res.bboxes.shape[0] == min(cfg.max_per_img, res.valid.numel())
        valid = res.valid
        assert not valid[valid.cumsum(0) < torch.arange(1, valid.numel() + 1)].any()  # valid first
        torch.testing.assert_close(res.bboxes[valid], exp.bboxes, rtol=0, atol=1e-4)
        torch.testing.assert_close(res.scores[valid], exp.scores, rtol=0, atol=0)
        assert (res.labels == 0).all()


def test_bad_train_cfg_is_named():
    cfg = head_cfg()
    cfg['train_cfg'].assigner.type = 'MaxIoUAssigner'
    with pytest.raises(TypeError, match="train_cfg.rpn.assigner: RedetRPNHead needs type "
                                        "'RedetMaxIoUAssigner', got MaxIoUAssigner"):
        MODELS.build(cfg)
    cfg = head_cfg()
    cfg['train_cfg'].sampler = dict(type='PseudoSampler')
    with pytest.raises(TypeError, match="train_cfg.rpn.sampler: expected a sampler of type"):
        MODELS.build(cfg)
    ours, _ = head_pair()
    with pytest.raises(ValueError, match='rpn nms config: keys'):
        ours.predict_by_feat(*head_outputs(0), batch_img_metas=image_metas(),
                             cfg=ConfigDict(proposal_cfg(), nms=dict(iou_threshold=0.7, x=1)))


def meta_inputs(num_imgs=2):
    cls_scores, bbox_preds = head_outputs(0, num_imgs)
    to_meta = lambda ts: [t.to('meta') for t in ts]  # noqa: E731
    gts = [InstanceData(bboxes=torch.empty(n, 4, device='meta'),
                        labels=torch.empty(n, dtype=torch.long, device='meta')) for n in (5, 0)]
    return to_meta(cls_scores), to_meta(bbox_preds), gts


def test_loss_and_proposals_read_no_value_back():
    """Meta tensors hold no values: any read-back (.item(), nonzero, a boolean index) raises."""
    ours, theirs = head_pair()
    ours.to('meta')
    cls_scores, bbox_preds, gts = meta_inputs()
    losses = ours.loss_by_feat(cls_scores, bbox_preds, gts, image_metas())
    assert all(v.device.type == 'meta' for v in losses.values())
    proposals = ours.predict_by_feat(cls_scores, bbox_preds, batch_img_metas=image_metas(),
                                     cfg=proposal_cfg())
    assert proposals[0].bboxes.device.type == 'meta' and proposals[0].bboxes.shape == (40, 4)
    theirs.to('meta')
    with pytest.raises(Exception):
        theirs.loss_by_feat(cls_scores, bbox_preds, gts, image_metas())
    with pytest.raises(Exception):
        theirs.predict_by_feat(cls_scores, bbox_preds, batch_img_metas=image_metas(),
                               cfg=proposal_cfg())


def test_channels_last_maps_get_channels_last_gradients():
    """On channels-last features no op of the head's loss step, forward or backward, mixes
    layouts: the loss's level flattening gives each score and delta map a channels-last
    gradient, which the convolutions' backward takes as it is."""
    from redet_plugin.testing import record_layout_mixes
    ours, _ = head_pair()
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(2, 8, PAD // s, PAD // s, generator=g)
             .contiguous(memory_format=torch.channels_last).requires_grad_() for s in STRIDES]
    gts, metas = ground_truth(0, (9, 3)), image_metas()

    def step():
        losses = ours.loss_by_feat(*ours(feats), gts, metas)
        sum(losses.values()).backward()
    assert record_layout_mixes(step, batch_size=2) == []
    assert all(f.grad.is_contiguous(memory_format=torch.channels_last) for f in feats)


@pytest.mark.cuda
def test_cuda_loss_and_proposals_wait_for_nothing_and_match_the_cpu():
    ours, _ = head_pair()
    outs, metas, gts = head_outputs(1), image_metas(), ground_truth(1, (9, 3))
    cuda_outs = [[t.cuda() for t in ts] for ts in outs]
    cuda_gts = [gt.to('cuda') for gt in gts]
    ours.cuda()
    # the first call builds the anchors (a copy from the host) and kept afterwards
    ours.loss_by_feat(*cuda_outs, cuda_gts, metas)
    with waits_for_nothing():
        losses = ours.loss_by_feat(*cuda_outs, cuda_gts, metas)
        proposals = ours.predict_by_feat(*cuda_outs, batch_img_metas=metas, cfg=proposal_cfg())
    assert all(torch.isfinite(v) for v in losses.values())
    expected = ours.cpu().predict_by_feat(*outs, batch_img_metas=metas, cfg=proposal_cfg())
    for res, exp in zip(proposals, expected):
        assert torch.equal(res.valid.cpu(), exp.valid)
        torch.testing.assert_close(res.bboxes.cpu()[exp.valid], exp.bboxes[exp.valid],
                                   rtol=0, atol=1e-4)


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=pytest.mark.cuda)])
@pytest.mark.parametrize('grad', [False, True])
def test_forward_equals_mmdets(device, grad, monkeypatch):
    """On a GPU without autograd the shared convolution and its ReLU are one cuDNN call."""
    ours, theirs = (head.to(device) for head in head_pair())
    fused_calls = []
    original = torch.cudnn_convolution_relu
    monkeypatch.setattr(torch, 'cudnn_convolution_relu',
                        lambda *a: fused_calls.append(1) or original(*a))
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(2, 8, PAD // s, PAD // s, generator=g).to(device) for s in STRIDES]
    with torch.set_grad_enabled(grad):
        got, expected = ours(feats), theirs(feats)
    for ours_level, theirs_level in zip(sum(got, []), sum(expected, [])):
        torch.testing.assert_close(ours_level, theirs_level, rtol=1e-4, atol=1e-4)
    assert len(fused_calls) == (len(STRIDES) if device == 'cuda' and not grad else 0)
