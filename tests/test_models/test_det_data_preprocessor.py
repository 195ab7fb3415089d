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


@pytest.mark.parametrize('stacked', [False, True])
@pytest.mark.parametrize('swap', [dict(bgr_to_rgb=True), dict(rgb_to_bgr=True), {}])
def test_same_batch_as_mmdet(stacked, swap):
    ours = DetDataPreprocessor(**ARGS, **swap)(_data(stacked), True)
    theirs = MMDetDetDataPreprocessor(**ARGS, **swap)(_data(stacked), True)
    assert torch.equal(ours['inputs'], theirs['inputs'])
    for a, b in zip(ours['data_samples'], theirs['data_samples']):
        assert a.metainfo == b.metainfo
    # the swap matters (the comparison can fail)
    if swap:
        unswapped = MMDetDetDataPreprocessor(**ARGS)(_data(stacked), True)
        assert not torch.equal(ours['inputs'], unswapped['inputs'])


def test_other_channel_counts_are_refused_by_name():
    with pytest.raises(ValueError, match='inputs: bgr_to_rgb/rgb_to_bgr swaps 3 channels, got 4'):
        DetDataPreprocessor(**dict(ARGS, mean=[0], std=[1]), bgr_to_rgb=True)(
            _data(channels=4), True)
