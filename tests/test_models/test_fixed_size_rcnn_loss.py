"""The RoI Transformer's fixed-size R-CNN losses equal mmdet's CascadeRoIHead path (mmdet's
MaxIoUAssigner, RandomSampler, SamplingResult, BBoxHead.loss_and_target and refine_bboxes on the
real proposals only) for the same draw, stage by stage; and they read no value back."""
import copy

import pytest
import torch
from mmdet.models.roi_heads import CascadeRoIHead
from mmdet.models.task_modules.assigners import MaxIoUAssigner as MMDetMaxIoUAssigner
from mmdet.models.task_modules.samplers import RandomSampler
from mmdet.models.utils import unpack_gt_instances
from mmdet.registry import MODELS
from mmdet.structures.bbox import get_box_tensor

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from tests._helpers import make_samples, tiny_detector, tiny_model_cfg


@pytest.fixture(scope='module')
def model():
    return tiny_detector().train()


def mmdet_assigner(cfg):
    cfg = dict(cfg)
    cfg.pop('type')
    return MMDetMaxIoUAssigner(**cfg)


def reference_losses(head, x, rpn_results_list, samples):
    """mmdet's CascadeRoIHead.loss with the RoI Transformer's matching, on the valid proposals."""
    batch_gt, batch_gt_ignore, metas = unpack_gt_instances(samples)
    results_list = []
    for res in rpn_results_list:
        res = res[res.valid] if 'valid' in res else res.clone()
        results_list.append(res)
    losses = {}
    for stage in range(head.num_stages):
        assigner = mmdet_assigner(head.train_cfg[stage].assigner)
        sampling_results = []
        for res, gt, ignore in zip(results_list, batch_gt, batch_gt_ignore):
            res = res.new(priors=get_box_tensor(res.bboxes))
            match_gt, match_ignore = head._matching_gts(res.priors, gt, ignore)
            assign = assigner.assign(res, match_gt, match_ignore)
            sampling = head.bbox_sampler[stage].sample(assign, res, match_gt)
            if res.priors.size(-1) == 4:  # regress towards the rotated gts
                sampling.pos_gt_bboxes = gt.bboxes[sampling.pos_assigned_gt_inds.long()]
            sampling_results.append(sampling)
        bbox_results = CascadeRoIHead.bbox_loss(head, stage, x, sampling_results)
        for name, value in bbox_results['loss_bbox'].items():
            weight = head.stage_loss_weights[stage] if 'loss' in name else 1
            losses[f's{stage}.{name}'] = value * weight
        if stage < head.num_stages - 1:
            with torch.no_grad():
                results_list = head.bbox_head[stage].refine_bboxes(sampling_results, bbox_results,
                                                                   metas)
    return losses


def first_members_draw(monkeypatch):
    """Our draw with increasing keys takes the first members by index; mmdet's random_choice
    patched to take the first of its (sorted) gallery takes the same."""
    real_rand = torch.rand
    monkeypatch.setattr(torch, 'rand', lambda shape, **kw: torch.linspace(
        0, 0.99, shape[0], device=kw.get('device')) if kw.get('generator') is None
        else real_rand(shape, **kw))
    monkeypatch.setattr(RandomSampler, 'random_choice', lambda self, gallery, num: gallery[:num])


def set_sampler_num(head, num):
    for stage_cfg, sampler in zip(head.train_cfg, head.bbox_sampler):
        stage_cfg.sampler.num = sampler.num = num


def features_and_proposals(model, num_boxes):
    """Samples with num_boxes gts per image, the features of a random batch (seeded by the
    counts) and the RPN's fixed-size proposals for them."""
    samples = make_samples(num_boxes=num_boxes)
    with torch.no_grad():
        x = model.extract_feat(torch.randn(2, 3, 128, 128, generator=torch.Generator()
                                           .manual_seed(sum(num_boxes))))
        proposals = model.rpn_head.predict(x, samples, rescale=False)
    return samples, x, proposals


@pytest.mark.parametrize('num_boxes', [(3, 0), (6, 2), (0, 0)])
@pytest.mark.parametrize('sampler_num', [64, 4096])
def test_losses_equal_mmdets_for_the_same_draw(model, num_boxes, sampler_num, monkeypatch):
    head = model.roi_head
    set_sampler_num(head, sampler_num)
    samples, x, proposals = features_and_proposals(model, num_boxes)
    for res in proposals:  # more padding rows, spread through the set
        res.valid = res.valid & (torch.arange(len(res)) % 4 > 0)
    gt_samples = copy.deepcopy(samples)
    for sample in gt_samples:  # ReDet.loss gives the RoI head rotated gts as tensors
        sample.gt_instances.bboxes = get_box_tensor(sample.gt_instances.bboxes)
    first_members_draw(monkeypatch)
    result = head.loss(x, proposals, gt_samples)
    expected = reference_losses(head, x, proposals, copy.deepcopy(gt_samples))
    assert set(result) == set(expected)
    for key in expected:
        torch.testing.assert_close(result[key].reshape(-1), expected[key].reshape(-1).float(),
                                   rtol=1e-5, atol=1e-6, msg=key)
    if sum(num_boxes):
        assert float(result['s1.loss_bbox']) > 0  # positives reached the second stage


def test_the_same_draw_test_can_fail(model, monkeypatch):
    head = model.roi_head
    set_sampler_num(head, 64)
    samples = make_samples(num_boxes=(6, 2))
    with torch.no_grad():
        x = model.extract_feat(torch.randn(2, 3, 128, 128))
        proposals = model.rpn_head.predict(x, samples, rescale=False)
    first_members_draw(monkeypatch)
    monkeypatch.setattr(RandomSampler, 'random_choice', lambda self, gallery, num: gallery[-num:])
    result = head.loss(x, proposals, samples)
    expected = reference_losses(head, x, proposals, samples)
    assert any(not torch.allclose(result[key].reshape(-1), expected[key].reshape(-1).float(),
                                  rtol=1e-5, atol=1e-6) for key in expected)


def test_rcnn_sampler_must_be_random_sampler():
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    cfg = tiny_model_cfg()
    cfg.train_cfg.rcnn[1].sampler = dict(type='PseudoSampler')
    with pytest.raises(TypeError, match=r"train_cfg.rcnn\[1\].sampler: expected a sampler of "
                                        r"type 'RandomSampler'"):
        MODELS.build(cfg)
