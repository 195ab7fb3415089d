"""The ReDet detector end to end on tiny inputs: one training step, one prediction."""
import math

import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.testing import waits_for_nothing
from tests._helpers import make_samples, tiny_detector


@pytest.fixture(scope='module')
def model():
    return tiny_detector()


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


def test_padding_proposals_give_no_detection(model):
    """Fixed-size proposals (RedetRPNHead: `valid` marks the real ones) give the detections of
    the real proposals alone; the same rows read as real change them (the marks matter)."""
    model.eval()
    model.test_cfg.rcnn.score_thr = 0.0
    samples = make_samples()
    with torch.no_grad():
        x = model.extract_feat(torch.randn(2, 3, 128, 128))
        proposals = model.rpn_head.predict(x, samples, rescale=False)
        for res in proposals:
            res.valid = res.valid & (torch.arange(len(res)) % 3 > 0)  # more padding rows
        cut = [res[res.valid] for res in proposals]
        for res in cut:
            del res.valid
        unmarked = [res.clone() for res in proposals]
        for res in unmarked:
            del res.valid
        fixed = model.roi_head.predict(x, proposals, samples)
        expected = model.roi_head.predict(x, cut, samples)
        wrong = model.roi_head.predict(x, unmarked, samples)
    for ours, ref, bad in zip(fixed, expected, wrong):
        assert ours.bboxes.shape == ref.bboxes.shape and len(ref) > 0
        torch.testing.assert_close(ours.bboxes, ref.bboxes, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(ours.scores, ref.scores, rtol=1e-5, atol=1e-6)
        assert torch.equal(ours.labels, ref.labels)
        assert len(bad) != len(ref)


def _cuda_samples():
    return [sample.to('cuda') for sample in make_samples(num_boxes=(3, 5))]


@pytest.mark.cuda
@pytest.mark.parametrize('channels_last', [False, True], ids=['nchw', 'nhwc'])
def test_cuda_training_step_waits_for_nothing(channels_last):
    """Forward (losses) and backward of a training step: no host synchronisation at all once
    warm (the first steps build the anchors and capture the feature graphs)."""
    from redet_plugin.testing import record_host_syncs
    model = tiny_detector('cuda').train()
    model.channels_last = channels_last
    inputs = torch.randn(2, 3, 128, 128, device='cuda')

    def step():
        losses = model.loss(inputs, _cuda_samples())
        sum(v for k, v in losses.items() if 'loss' in k).backward()

    for _ in range(3):
        step()
    samples = _cuda_samples()  # their copy to the GPU is the data loader's, not the step's

    def warm_step():
        sum(v for k, v in model.loss(inputs, samples).items() if 'loss' in k).backward()

    syncs = record_host_syncs(warm_step)  # names the Python call sites, if any
    assert syncs == [], syncs
    with waits_for_nothing():
        warm_step()


@pytest.mark.cuda
def test_cuda_test_forward_waits_only_for_the_final_cut(monkeypatch):
    """A test forward waits once: the read-back of how many detections each image keeps."""
    from redet_plugin.structures import padded_results
    from redet_plugin.testing import record_host_syncs
    model = tiny_detector('cuda').eval()
    inputs = torch.randn(2, 3, 128, 128, device='cuda')
    samples = _cuda_samples()
    with torch.no_grad():
        for _ in range(3):
            model.predict(inputs, samples)
        syncs = record_host_syncs(lambda: model.predict(inputs, samples))
    assert [s['site'].split(':')[0] for s in syncs] == [
        'redet_plugin/structures/padded_results.py'], syncs
    assert syncs[0]['count'] == 1
    # and none inside compiled ops, whose waits warn outside Python's warning machinery
    monkeypatch.setattr(padded_results, 'cut_padding',
                        _forbid_sync_until_the_cut(padded_results.cut_padding))
    with torch.no_grad(), waits_for_nothing():
        model.predict(inputs, samples)


@pytest.mark.cuda
def test_cuda_test_forward_keeping_its_padding_waits_for_nothing():
    """As the validation and test loops run it (engine/one_behind_loops.py): the cut is theirs."""
    from redet_plugin.structures.padded_results import keep_padding
    model = tiny_detector('cuda').eval()
    inputs = torch.randn(2, 3, 128, 128, device='cuda')
    samples = _cuda_samples()
    with torch.no_grad(), keep_padding():
        for _ in range(3):
            model.predict(inputs, samples)
        with waits_for_nothing():
            results = model.predict(inputs, samples)
    assert all('valid' in sample.pred_instances for sample in results)


def _forbid_sync_until_the_cut(cut):
    def wrapped(*args, **kwargs):
        torch.cuda.set_sync_debug_mode('default')  # the cut's read-back is the one wait allowed
        try:
            return cut(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode('error')
    return wrapped


@pytest.fixture
def meta_rotated_iou(monkeypatch):
    """mmcv's box_iou_rotated has no meta kernel; on meta tensors a stand-in gives its output
    shape, (m, n), which does not depend on the boxes' values."""
    from redet_plugin.models.task_modules.iou_calculators.rbbox_overlaps import RBboxOverlaps2D
    real = RBboxOverlaps2D.__call__

    def call(self, bboxes1, bboxes2, mode='iou', is_aligned=False):
        if bboxes1.device.type != 'meta':
            return real(self, bboxes1, bboxes2, mode, is_aligned)
        rows = bboxes1.shape[0]
        return bboxes1.new_empty((rows, ) if is_aligned else (rows, bboxes2.shape[0]))

    monkeypatch.setattr(RBboxOverlaps2D, '__call__', call)


def _meta_inputs(gt_capacity=None):
    """Meta inputs; with gt_capacity, the gts padded to that count (gt_instances.valid)."""
    from redet_plugin.structures.gt_padding import pad_gt_instances
    inputs = torch.empty(2, 3, 128, 128, device='meta')
    samples = make_samples(num_boxes=(3, 5))
    if gt_capacity is not None:
        for sample in samples:
            sample.gt_instances = pad_gt_instances(sample.gt_instances, gt_capacity)
    return inputs, [sample.to('meta') for sample in samples]


@pytest.mark.parametrize('gt_capacity', [None, 8], ids=['gts', 'padded-gts'])
def test_training_step_reads_no_value_back(meta_rotated_iou, gt_capacity):
    """The whole model on meta tensors, which hold no values (any read-back raises): the
    losses of a training step and their backward (also with gts padded to a fixed count)."""
    model = tiny_detector().train().to('meta')
    inputs, samples = _meta_inputs(gt_capacity)
    assert gt_capacity is None or all('valid' in s.gt_instances for s in samples)
    losses = model.loss(inputs, samples)
    assert all(value.device.type == 'meta' for value in losses.values())
    sum(v.sum() for k, v in losses.items() if 'loss' in k).backward()
    trained = [p for p in model.backbone.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and p.grad.device.type == 'meta' for p in trained)


def test_test_forward_reads_no_value_before_its_final_cut(meta_rotated_iou):
    model = tiny_detector().eval().to('meta')
    inputs, samples = _meta_inputs()
    with torch.no_grad(), pytest.raises(NotImplementedError, match='meta tensor') as info:
        model.predict(inputs, samples)
    ours = [entry for entry in info.traceback if 'redet_plugin' in str(entry.path)]
    assert ours[-1].name == 'cut_padding'
    assert '.tolist()' in str(ours[-1].statement)


def test_test_forward_keeping_its_padding_reads_no_value(meta_rotated_iou):
    from redet_plugin.structures.padded_results import keep_padding
    model = tiny_detector().eval().to('meta')
    inputs, samples = _meta_inputs()
    with torch.no_grad(), keep_padding():
        results = model.predict(inputs, samples)
    preds = [sample.pred_instances for sample in results]
    assert all('valid' in pred and pred.bboxes.device.type == 'meta' for pred in preds)


@pytest.mark.parametrize('device, dtype', [
    ('cpu', torch.bfloat16),
    pytest.param('cuda', torch.float16, marks=pytest.mark.cuda)])
def test_train_step_and_predict_under_autocast(device, dtype):
    """Under autocast the RPN's decoded boxes come in float32 and its scores in half: the
    fixed-size NMS must take them together (it takes one dtype)."""
    model = tiny_detector(device).train()
    inputs = torch.randn(2, 3, 128, 128, device=device)
    samples = [sample.to(device) for sample in make_samples(num_boxes=(3, 5))]
    with torch.autocast(device, dtype=dtype):
        losses = model.loss(inputs, samples)
    total = sum(v for k, v in losses.items() if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()
    model.eval()
    model.test_cfg.rcnn.score_thr = 0.0
    with torch.no_grad(), torch.autocast(device, dtype=dtype):
        results = model.predict(inputs, samples)
    assert all(len(result.pred_instances) > 0 for result in results)


def _losses_gradients_and_detections(model, inputs, samples, test_samples):
    torch.manual_seed(1)  # the samplers' draws
    model.train()
    losses = model.loss(inputs, samples)
    sum(v.sum() for k, v in losses.items() if 'loss' in k).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.eval()
    with torch.no_grad():
        pred = model.predict(inputs, test_samples)
    return losses, grads, pred


def test_channels_last_gives_the_nchw_losses_gradients_and_detections():
    """channels_last=True converts the images once; every feature map stays channels-last, and
    the losses, gradients and detections are those of the NCHW model (float64)."""
    nchw = tiny_detector().double().train()
    nhwc = tiny_detector().double().train()
    nhwc.channels_last = True
    inputs = torch.randn(2, 3, 128, 128, dtype=torch.float64)
    samples = make_samples(num_boxes=(3, 5))
    for sample in samples:
        sample.gt_instances.bboxes = sample.gt_instances.bboxes.double()
    feats = nhwc.extract_feat(inputs)
    assert all(f.is_contiguous(memory_format=torch.channels_last) for f in feats)
    nchw.extract_feat(inputs)  # the same running-statistics update
    (losses, grads, pred), (losses_cl, grads_cl, pred_cl) = (
        _losses_gradients_and_detections(model, inputs, samples, make_samples())
        for model in (nchw, nhwc))
    assert losses.keys() == losses_cl.keys()
    for key in losses:
        torch.testing.assert_close(losses_cl[key], losses[key], rtol=1e-9, atol=1e-12)
    assert len(grads) == len(grads_cl) > 0
    for g, g_cl in zip(grads, grads_cl):
        torch.testing.assert_close(g_cl, g, rtol=1e-7, atol=1e-10)
    for a, b in zip(pred, pred_cl):
        torch.testing.assert_close(b.pred_instances.bboxes, a.pred_instances.bboxes)
        torch.testing.assert_close(b.pred_instances.scores, a.pred_instances.scores)


def test_a_channels_last_training_step_converts_only_the_images():
    """With channels_last=True the images are converted once; no other op of the training step,
    forward or backward, reads or writes feature maps of two layouts."""
    from redet_plugin.testing import record_layout_mixes
    model = tiny_detector().train()
    model.channels_last = True
    inputs, samples = torch.randn(2, 3, 128, 128), make_samples(num_boxes=(3, 5))

    def step():
        losses = model.loss(inputs, samples)
        sum(v.sum() for k, v in losses.items() if 'loss' in k).backward()
    mixes = record_layout_mixes(step, batch_size=2)
    images = [m for m in mixes if m['op'] == 'aten.clone.default'
              and m['site'].startswith('redet_plugin/models/detectors/redet.py:')
              and m['site'].endswith(' extract_feat')]
    assert [m['count'] for m in images] == [1]
    assert [m for m in mixes if m not in images] == []


@pytest.mark.cuda
def test_cuda_channels_last_gives_the_nchw_losses_and_gradients():
    """On the GPU in float32 (cuDNN keeps float64 in NCHW), TF32 off: cuDNN's NHWC kernels give
    the NCHW losses and gradients up to float rounding."""
    from tests._helpers import full_fp32
    with full_fp32():
        nchw, nhwc = tiny_detector('cuda'), tiny_detector('cuda')
        nhwc.channels_last = True
        inputs = torch.randn(2, 3, 128, 128, device='cuda')
        samples = [sample.to('cuda') for sample in make_samples(num_boxes=(3, 5))]
        feats = nhwc.train().extract_feat(inputs)
        assert all(f.is_contiguous(memory_format=torch.channels_last) for f in feats)
        nchw.train().extract_feat(inputs)
        test_samples = [sample.to('cuda') for sample in make_samples()]
        (losses, grads, _), (losses_cl, grads_cl, _) = (
            _losses_gradients_and_detections(model, inputs, samples, test_samples)
            for model in (nchw, nhwc))
    for key in losses:
        torch.testing.assert_close(losses_cl[key], losses[key], rtol=1e-4, atol=1e-5)
    assert len(grads) == len(grads_cl) > 0
    for g, g_cl in zip(grads, grads_cl):
        torch.testing.assert_close(g_cl, g, rtol=1e-3, atol=1e-4)


def test_channels_last_must_be_a_bool():
    from mmdet.registry import MODELS
    from tests._helpers import tiny_model_cfg
    with pytest.raises(TypeError, match='channels_last: expected True or False'):
        MODELS.build(dict(tiny_model_cfg(), channels_last='yes'))
