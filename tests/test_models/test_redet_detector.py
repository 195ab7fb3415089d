"""The ReDet detector end to end on tiny inputs: one training step, one prediction."""
import math
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.config import Config
from mmengine.structures import InstanceData

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from mmdet.utils import register_all_modules


register_all_modules(init_default_scope=True)
CONFIG = osp.join(osp.dirname(__file__), '../../configs/_base_/models/redet-le90_re50_refpn.py')


def tiny_model_cfg(num_classes=3):
    cfg = Config.fromfile(CONFIG).model
    cfg.backbone.update(depth=18, base_channels=16)
    cfg.neck.update(in_channels=[16, 32, 64, 128], out_channels=32)
    cfg.rpn_head.update(in_channels=32, feat_channels=32)
    for extractor in cfg.roi_head.bbox_roi_extractor:
        extractor.out_channels = 32
    for head in cfg.roi_head.bbox_head:
        head.update(in_channels=32, fc_out_channels=64, num_classes=num_classes)
    cfg.train_cfg.rcnn[0].sampler.num = cfg.train_cfg.rcnn[1].sampler.num = 64
    cfg.test_cfg.rpn.update(nms_pre=200, max_per_img=100)
    cfg.train_cfg.rpn_proposal.update(nms_pre=200, max_per_img=100)
    return cfg


def make_samples(num_images=2, size=128, num_boxes=(3, 0)):
    samples = []
    for i in range(num_images):
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size),
                                             pad_shape=(size, size), scale_factor=(1.0, 1.0),
                                             batch_input_shape=(size, size)))
        k = num_boxes[i % len(num_boxes)]
        g = torch.Generator().manual_seed(i)
        centres = 30 + torch.rand(k, 2, generator=g) * (size - 60)
        sizes = 12 + torch.rand(k, 2, generator=g) * 30
        angles = (torch.rand(k, 1, generator=g) - 0.5) * math.pi
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([centres, sizes.max(1, keepdim=True)[0],
                              sizes.min(1, keepdim=True)[0], angles], 1),
            labels=torch.randint(0, 3, (k,), generator=g))
        samples.append(sample)
    return samples


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    detector = MODELS.build(tiny_model_cfg())
    detector.init_weights()
    return detector


def test_train_step_gives_finite_losses_and_gradients(model):
    model.train()
    inputs = torch.randn(2, 3, 128, 128)
    losses = model.loss(inputs, make_samples())  # second image has no objects
    expected = {'loss_rpn_cls', 'loss_rpn_bbox', 's0.loss_cls', 's0.loss_bbox',
                's1.loss_cls', 's1.loss_bbox'}
    assert expected <= set(losses)
    total = sum(v.sum() if isinstance(v, torch.Tensor) else sum(v) for k, v in losses.items()
                if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    head_grad = model.roi_head.bbox_head[1].fc_reg.weight.grad
    assert head_grad is not None and head_grad.abs().sum() > 0


def test_predict_returns_rotated_boxes(model):
    model.eval()
    model.test_cfg.rcnn.score_thr = 0.0
    with torch.no_grad():
        results = model.predict(torch.randn(2, 3, 128, 128), make_samples())
    for result in results:
        pred = result.pred_instances
        assert pred.bboxes.shape[-1] == 5 and pred.bboxes.shape[0] > 0
        assert pred.scores.shape == pred.labels.shape == pred.bboxes.shape[:1]
        assert (pred.bboxes[:, 2] >= pred.bboxes[:, 3]).all()  # le90: w >= h
        assert (pred.bboxes[:, 4] >= -math.pi / 2).all() and (pred.bboxes[:, 4] < math.pi / 2).all()


def test_loss_rejects_horizontal_ground_truth(model):
    model.train()
    samples = make_samples()
    samples[0].gt_instances.bboxes = samples[0].gt_instances.bboxes[:, :4]
    with pytest.raises(ValueError, match=r'gt_instances.bboxes: expected rotated boxes \(N, 5\)'):
        model.loss(torch.randn(2, 3, 128, 128), samples)
