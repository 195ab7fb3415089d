"""RedetDetDataPreprocessor: mmdet's DetDataPreprocessor with a channel swap that reads nothing
from the host (a flip instead of a list index)."""
import pytest
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor as MMDetDetDataPreprocessor

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.models.data_preprocessors import DetDataPreprocessor
from tests._helpers import make_samples

ARGS = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], pad_size_divisor=32,
            boxtype2tensor=False)


def _data(stacked=False, channels=3):
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (channels, 100, 90 + 10 * i), generator=g, dtype=torch.uint8)
              for i in range(2)]
    if stacked:
        images = torch.stack([images[0], images[0]])
    return dict(inputs=images, data_samples=make_samples())


@pytest.mark.parametrize('training', [True, False])
@pytest.mark.parametrize('other', [{}, dict(pad_value=7.5), dict(mean=None, std=None),
                                   dict(pad_size_divisor=1)])
@pytest.mark.parametrize('stacked', [False, True])
@pytest.mark.parametrize('swap', [dict(bgr_to_rgb=True), dict(rgb_to_bgr=True), {}])
def test_same_batch_as_mmdet(stacked, swap, other, training):
    """The same images, padding and metainfo as mmdet's (its normalisation, padding and
    stacking done here with the shapes as Python numbers)."""
    args = dict(ARGS, **other)
    ours = DetDataPreprocessor(**args, **swap)(_data(stacked), training)
    theirs = MMDetDetDataPreprocessor(**args, **swap)(_data(stacked), training)
    assert ours['inputs'].dtype == theirs['inputs'].dtype == torch.float32
    assert torch.equal(ours['inputs'], theirs['inputs'])
    for a, b in zip(ours['data_samples'], theirs['data_samples']):
        assert a.metainfo == b.metainfo
    # the swap matters (the comparison can fail)
    if swap:
        unswapped = MMDetDetDataPreprocessor(**args)(_data(stacked), True)
        assert not torch.equal(ours['inputs'], unswapped['inputs'])


def test_other_channel_counts_are_refused_by_name():
    with pytest.raises(ValueError, match='inputs: bgr_to_rgb/rgb_to_bgr swaps 3 channels, got 4'):
        DetDataPreprocessor(**dict(ARGS, mean=[0], std=[1]), bgr_to_rgb=True)(
            _data(channels=4), True)


def _on(sample):
    boxes = sample.gt_instances.bboxes
    return {t.device.type for t in (sample.gt_instances.labels, getattr(boxes, 'tensor', boxes))}


@pytest.mark.parametrize('training', [True, False])
def test_test_batches_leave_the_ground_truth_on_the_host(training):
    """A training batch goes to the device whole; a test batch sends its images and keeps its
    data samples (metainfo, ground truth) on the host, with mmdet's metainfo. On the meta device:
    a tensor moved there cannot be read back."""
    preprocessor = DetDataPreprocessor(**ARGS, bgr_to_rgb=True)
    preprocessor.to('meta')
    out = preprocessor(_data(), training)
    theirs = MMDetDetDataPreprocessor(**ARGS, bgr_to_rgb=True)(_data(), training)
    assert out['inputs'].device.type == 'meta'
    for sample, reference in zip(out['data_samples'], theirs['data_samples']):
        assert sample.metainfo == reference.metainfo
        assert _on(sample) == {'meta' if training else 'cpu'}
        if not training:
            assert torch.equal(sample.gt_instances.labels, reference.gt_instances.labels)
    assert preprocessor._samples_to_device  # (the next call, e.g. a train_step, copies them)


def test_test_samples_with_proposals_go_to_the_device():
    from mmengine.structures import InstanceData
    preprocessor = DetDataPreprocessor(**ARGS)
    preprocessor.to('meta')
    data = _data()
    data['data_samples'][0].proposals = InstanceData(bboxes=torch.zeros(3, 4))
    out = preprocessor(data, False)
    first, second = out['data_samples']
    assert first.proposals.bboxes.device.type == 'meta'
    assert _on(first) == {'meta'} and _on(second) == {'cpu'}


def test_images_of_a_batch_must_match_the_mean():
    data = _data()
    data['inputs'] = [x[:2] for x in data['inputs']]
    with pytest.raises(ValueError, match='inputs: mean and std have 3 values'):
        DetDataPreprocessor(**ARGS)(data, False)


@pytest.mark.parametrize('stacked', [False, True])
def test_a_float64_preprocessor_gives_mmdets_float64_batch(stacked):
    """model.double() (the float64 references of the tests): mmengine converts the images to
    float32 and normalises them with the float64 mean and std, so the batch is float64."""
    ours = DetDataPreprocessor(**ARGS, bgr_to_rgb=True).double()(_data(stacked), False)
    theirs = MMDetDetDataPreprocessor(**ARGS, bgr_to_rgb=True).double()(_data(stacked), False)
    assert ours['inputs'].dtype == theirs['inputs'].dtype == torch.float64
    assert torch.equal(ours['inputs'], theirs['inputs'])
