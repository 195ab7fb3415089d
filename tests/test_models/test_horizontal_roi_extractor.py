"""RedetHorizontalSingleRoIExtractor pools each RoI from its level exactly as mmdet's
SingleRoIExtractor does (forward and gradients, RoIPool and mmcv's RoIAlign), without listing
the RoIs of a level (meta tensors on the CPU, sync_debug_mode on a GPU). RoIPool takes its
multi-level kernel on every device; RoIAlign on the CPU lists the RoIs as mmdet does, so its
parked path (CUDA's) is tested through _pool."""
import pytest
import torch
from mmdet.models.roi_heads.roi_extractors import SingleRoIExtractor
from mmdet.registry import MODELS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from redet_plugin.testing import waits_for_nothing

LAYERS = [dict(type='RedetRoIPool', output_size=7),
          dict(type='RoIAlign', output_size=7, sampling_ratio=0)]
STRIDES = (4, 8, 16, 32)


def extractor(layer):
    return MODELS.build(dict(type='RedetHorizontalSingleRoIExtractor', roi_layer=layer,
                             out_channels=8, featmap_strides=list(STRIDES)))


def inputs(seed, num_rois=300, device='cpu'):
    g = torch.Generator().manual_seed(seed)
    feats = [torch.randn(2, 8, 256 // s, 256 // s, generator=g).to(device).requires_grad_()
             for s in STRIDES]
    xy = torch.rand(num_rois, 2, generator=g) * 200
    wh = torch.rand(num_rois, 2, generator=g) ** 2 * 250 * (1 + 2 * (seed % 2))
    rois = torch.cat([torch.randint(0, 2, (num_rois, 1), generator=g).float(), xy, xy + wh], 1)
    return feats, rois.to(device)


@pytest.mark.parametrize('layer', LAYERS, ids=lambda c: c['type'])
@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('roi_scale_factor', [None, 1.5])
def test_same_features_and_gradients_as_mmdet(layer, seed, roi_scale_factor):
    ours = extractor(layer)
    feats, rois = inputs(seed)
    rois = rois.type_as(feats[0])
    result = ours._pool(feats, rois, roi_scale_factor)  # the path CUDA takes
    expected = SingleRoIExtractor.forward(ours, feats, rois, roi_scale_factor)
    assert torch.equal(ours(feats, rois, roi_scale_factor), expected)  # the CPU path
    assert torch.equal(result, expected)
    grad = torch.randn(result.shape, generator=torch.Generator().manual_seed(9))
    ours_grads = torch.autograd.grad(result, feats, grad)
    mmdet_grads = torch.autograd.grad(expected, feats, grad)
    for a, b in zip(ours_grads, mmdet_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_our_roi_pool_takes_its_multi_level_kernel_and_others_do_not():
    assert extractor(LAYERS[0]).fused_kernel is not None
    assert extractor(LAYERS[1]).fused_kernel is None


def test_inputs_cover_every_level_and_an_empty_one():
    levels = extractor(LAYERS[0]).map_roi_levels(inputs(1)[1], 4)
    assert (levels.bincount(minlength=4) > 0).all()
    levels = extractor(LAYERS[0]).map_roi_levels(inputs(0)[1], 4)
    assert (levels.bincount(minlength=4) == 0).any()


def test_reads_no_value_back():
    ours = extractor(LAYERS[0])
    feats, rois = inputs(1)
    out = ours([f.detach().to('meta') for f in feats], rois.to('meta'))
    assert out.device.type == 'meta' and out.shape == (300, 8, 7, 7)
    with pytest.raises(Exception):  # mmdet's lists the RoIs of each level
        SingleRoIExtractor.forward(ours, [f.detach().to('meta') for f in feats], rois.to('meta'))


@pytest.mark.parametrize('layer', LAYERS, ids=lambda c: c['type'])
def test_channels_last_maps_give_the_nchw_features(layer):
    # (mmcv's RoIAlign reads any map as NCHW-contiguous: it gets a contiguous copy)
    ours = extractor(layer)
    feats, rois = inputs(2)
    channels_last = [f.detach().contiguous(memory_format=torch.channels_last) for f in feats]
    assert torch.equal(ours(channels_last, rois), ours([f.detach() for f in feats], rois))


@pytest.mark.cuda
def test_cuda_waits_for_nothing_and_matches_mmdet():
    ours = extractor(LAYERS[0]).cuda()
    feats, rois = inputs(1, device='cuda')
    ours(feats, rois).sum().backward()  # warm-up: first-call allocations
    with waits_for_nothing():
        result = ours(feats, rois)
        result.sum().backward()
    assert torch.equal(result, SingleRoIExtractor.forward(ours, feats, rois))
