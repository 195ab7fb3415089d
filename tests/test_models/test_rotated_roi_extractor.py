"""RotatedSingleRoIExtractor: level choice, roi_scale_factor, the per-level loop, the fused
multi-level path (same forward and gradients as the loop), gradients for unused levels (DDP)."""
import math

import pytest
import torch
from mmcv import ops as mmcv_ops
from torch import nn

from redet_plugin.models.roi_heads.roi_extractors import RotatedSingleRoIExtractor

STRIDES = [4, 8, 16, 32]


class RecordingLayer(nn.Module):
    """Stands in for a RoI layer: remembers the rois it got; output = per-image channel means
    times the RoI width, so that gradients reach the features."""

    def __init__(self, output_size, spatial_scale):
        super().__init__()
        self.output_size, self.spatial_scale = (output_size, output_size), spatial_scale
        self.calls = []

    def forward(self, feat, rois):
        self.calls.append(rois.detach().clone())
        means = feat.mean(dim=(2, 3))[rois[:, 0].long()] * rois[:, 3:4]
        return means[:, :, None, None].expand(-1, -1, *self.output_size)


def rotated_extractor(roi_layer, channels=4, strides=STRIDES, **kwargs):
    return RotatedSingleRoIExtractor(roi_layer=roi_layer, out_channels=channels,
                                     featmap_strides=strides, **kwargs)


def pyramid(channels, image=128, strides=STRIDES, batch=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, channels, image // s, image // s, generator=g, dtype=dtype)
            .requires_grad_(True) for s in strides]


def rois_with_sizes(sizes, batch=2, seed=0):
    """Rotated rois (batch_idx, cx, cy, w, h, theta), square-ish with sqrt(w*h) = size."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor(sizes, dtype=torch.float32)
    aspect = torch.rand(len(sizes), generator=g) + 0.5
    w, h = sizes * aspect.sqrt(), sizes / aspect.sqrt()
    centre = torch.rand(len(sizes), 2, generator=g) * 128
    theta = (torch.rand(len(sizes), generator=g) * 2 - 1) * math.pi
    batch_idx = torch.randint(0, batch, (len(sizes),), generator=g).float()
    return torch.stack([batch_idx, centre[:, 0], centre[:, 1], w, h, theta], dim=1)


def test_levels_follow_roi_scale_and_are_clamped():
    extractor = rotated_extractor(dict(type=RecordingLayer, output_size=7))
    # sqrt(w*h): < 112 -> 0, < 224 -> 1, < 448 -> 2, else 3 (clamped); w*h < 0 -> 0
    rois = torch.tensor([[0, 0, 0, 10, 10, 0], [0, 0, 0, 111, 111, 0], [0, 0, 0, 113, 113, 0],
                         [0, 0, 0, 300, 300, 1], [0, 0, 0, 500, 500, 0], [0, 0, 0, 5000, 500, 0],
                         [0, 0, 0, -20, 30, 0]], dtype=torch.float32)
    assert extractor.map_roi_levels(rois, 4).tolist() == [0, 0, 1, 2, 3, 3, 0]
    assert extractor.map_roi_levels(rois, 2).tolist() == [0, 0, 1, 1, 1, 1, 0]
    assert extractor.map_roi_levels(rois.half(), 4).tolist() == [0, 0, 1, 2, 3, 3, 0]  # no overflow
    at_boundaries = torch.tensor([[0, 0, 0, 112, 112, 0], [0, 0, 0, 224, 224, 0.0]])
    assert extractor.map_roi_levels(at_boundaries, 4).tolist() == [1, 2]


def test_levels_equal_mmrotates_formula():
    extractor = rotated_extractor(dict(type=RecordingLayer, output_size=7),
                                  strides=[4, 8, 16, 32, 64])
    g = torch.Generator().manual_seed(0)
    rois = torch.zeros(2000, 6, dtype=torch.float64)
    rois[:, 3:5] = torch.exp(torch.empty(2000, 2, dtype=torch.float64).uniform_(0, 8, generator=g))
    scale = torch.sqrt(rois[:, 3] * rois[:, 4])
    mmrotate = torch.floor(torch.log2(scale / 56 + 1e-6)).clamp(min=0, max=4).long()
    assert torch.equal(extractor.map_roi_levels(rois, 5), mmrotate)
    assert set(mmrotate.tolist()) == {0, 1, 2, 3, 4}


def test_roi_scale_factor_scales_w_and_h_after_the_level_is_chosen():
    extractor = rotated_extractor(dict(type=RecordingLayer, output_size=3))
    rois = rois_with_sizes([100.0])  # level 0; scaled by 2 it would be level 1
    extractor(pyramid(4), rois, roi_scale_factor=(1.5, 2.0))  # (h_scale, w_scale) as mmrotate
    [calls] = [layer.calls for layer in extractor.roi_layers if layer.calls]
    assert extractor.roi_layers[0].calls, "the RoI must stay on the level of its unscaled size"
    expected = rois.clone()
    expected[:, 3] *= 2.0
    expected[:, 4] *= 1.5
    torch.testing.assert_close(calls[0], expected)


def test_per_level_loop_pools_each_roi_from_its_level_with_mmcv_layer():
    layer_cfg = dict(type="RoIAlignRotated", output_size=5, sampling_ratio=2, clockwise=True)
    extractor = rotated_extractor(layer_cfg)
    feats = pyramid(4)
    rois = rois_with_sizes([20, 60, 130, 150, 300, 600, 40])
    levels = extractor.map_roi_levels(rois, 4)
    out = extractor(feats, rois)
    for k in range(len(rois)):
        level = int(levels[k])
        layer = mmcv_ops.RoIAlignRotated(5, 1 / STRIDES[level], 2, clockwise=True)
        torch.testing.assert_close(out[k:k + 1], layer(feats[level], rois[k:k + 1]))


@pytest.mark.parametrize("layer_cfg", [
    dict(type="RoIAlignRotated", output_size=5, sampling_ratio=2, clockwise=True),
    dict(type="RedetRiRoIAlignRotated", output_size=5, num_samples=2, num_orientations=4,
         clockwise=True)], ids=lambda c: c["type"])
def test_channels_last_maps_give_the_nchw_features(layer_cfg):
    # mmcv's RoIAlignRotated reads any map as NCHW-contiguous (on a channels-last one it pools
    # wrong values, no error): it gets a contiguous copy; ours reads either layout
    import redet_plugin.mm  # noqa: F401  (registers RedetRiRoIAlignRotated)
    extractor = rotated_extractor(layer_cfg, channels=8)
    feats = [f.detach() for f in pyramid(8)]
    rois = rois_with_sizes([20, 60, 130, 150, 300, 600, 40])
    channels_last = [f.contiguous(memory_format=torch.channels_last) for f in feats]
    torch.testing.assert_close(extractor(channels_last, rois), extractor(feats, rois),
                               rtol=0, atol=1e-6)


class PerLevelConvs(nn.Module):
    """Parameters upstream of each level, as an FPN has: DDP needs a gradient for each of them."""

    def __init__(self, channels, levels):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(channels, channels, 1) for _ in range(levels))

    def forward(self, feats):
        return [conv(feat) for conv, feat in zip(self.convs, feats)]


def assert_every_parameter_gets_a_gradient(extractor, rois, channels):
    upstream = PerLevelConvs(channels, len(STRIDES))
    feats = upstream([f.detach() for f in pyramid(channels)])
    extractor(feats, rois).square().sum().backward()
    missing = [name for name, p in upstream.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}: DDP would hang or fail"


@pytest.mark.parametrize("num_rois", [0, 3])
def test_unused_levels_still_get_gradients_in_the_per_level_loop(num_rois):
    layer_cfg = dict(type="RoIAlignRotated", output_size=3, sampling_ratio=1)
    rois = rois_with_sizes([30.0] * num_rois)  # all on level 0, or none at all
    assert_every_parameter_gets_a_gradient(rotated_extractor(layer_cfg), rois, channels=4)


RIROI = dict(type="RedetRiRoIAlignRotated", output_size=7, num_samples=2, num_orientations=4,
             clockwise=True)


@pytest.mark.parametrize("num_rois", [0, 3])
def test_unused_levels_still_get_gradients_in_the_fused_path(num_rois):
    extractor = rotated_extractor(RIROI, channels=8, fused=True)
    rois = rois_with_sizes([30.0] * num_rois)
    assert_every_parameter_gets_a_gradient(extractor, rois, channels=8)


@pytest.mark.parametrize("layer_options", [dict(), dict(num_samples=0, clockwise=False),
                                           dict(legacy_orientation=True)])
def test_fused_path_equals_per_level_loop_forward_and_gradients(layer_options):
    layer_cfg = dict(RIROI, **layer_options)
    fused, loop = (rotated_extractor(layer_cfg, channels=8, fused=f) for f in (True, False))
    assert fused.fused and not loop.fused
    rois = rois_with_sizes([20, 60, 130, 150, 300, 600, 40, 90, 250, 1000], seed=3)
    rois[0, 1:3] = torch.tensor([-30.0, 200.0])  # off the map
    grad_out = torch.randn(len(rois), 8, 7, 7, dtype=torch.float64)
    results = []
    for extractor in (fused, loop):
        feats = pyramid(8, dtype=torch.float64, seed=5)
        out = extractor(feats, rois.double())
        out.backward(grad_out)
        results.append((out.detach(), [f.grad for f in feats]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for grad_fused, grad_loop in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(grad_fused, grad_loop)


def test_fused_is_the_default_for_our_riroi_layer():
    assert rotated_extractor(RIROI, channels=8).fused
    assert not rotated_extractor(RIROI, channels=8, fused=False).fused


def test_bad_arguments_are_named():
    layer_cfg = dict(type="RoIAlignRotated", output_size=3, sampling_ratio=1)
    with pytest.raises(ValueError, match="fused=True: RoIAlignRotated has no multi-level kernel"):
        rotated_extractor(layer_cfg, fused=True)
    with pytest.raises(ValueError, match="finest_scale: expected a positive number, got 0"):
        rotated_extractor(layer_cfg, finest_scale=0)
    with pytest.raises(ValueError, match=r"featmap_strides: expected a non-empty list"):
        rotated_extractor(layer_cfg, strides=[])
    with pytest.raises(TypeError, match="roi_layer: expected a dict with a 'type' key"):
        rotated_extractor(dict(output_size=3))
    with pytest.raises(KeyError, match="'Nope' is neither a module registered"):
        rotated_extractor(dict(type="Nope"))
    extractor = rotated_extractor(layer_cfg)
    feats = pyramid(4)
    with pytest.raises(ValueError, match=r"rois: expected a \(K, 6\) tensor .* got \(3, 5\)"):
        extractor(feats, torch.zeros(3, 5))
    with pytest.raises(ValueError, match=r"feats\[1\]: expected \(N, out_channels=4, H, W\), got "
                                         r"\(2, 3, 16, 16\)"):
        extractor([feats[0], torch.zeros(2, 3, 16, 16)], rois_with_sizes([30.0]))
    with pytest.raises(ValueError, match="feats: expected 1 to 4 feature levels .* got 5"):
        extractor(feats + feats[:1], rois_with_sizes([30.0]))
    with pytest.raises(ValueError, match=r"roi_scale_factor: expected a number or \(h_scale, "):
        extractor(feats, rois_with_sizes([30.0]), roi_scale_factor=(1, 2, 3))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_path_on_cuda_equals_the_loop_and_the_cpu(dtype):
    rois = rois_with_sizes([20, 60, 130, 150, 300, 600, 40, 90, 250, 1000], seed=3)
    grad_out = torch.randn(len(rois), 8, 7, 7)
    results = {}
    runs = [("cuda", True), ("cuda", False)] + ([("cpu", True)] if dtype == torch.float32 else [])
    for device, fused in runs:
        extractor = rotated_extractor(RIROI, channels=8, fused=fused).to(device)
        feats = [f.detach().to(device, dtype).requires_grad_(True) for f in pyramid(8, seed=5)]
        out = extractor(feats, rois.to(device))
        grads = torch.autograd.grad(out, feats, grad_out.to(device, dtype))
        results[device, fused] = [t.float().cpu() for t in (out, *grads)]
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    for got, want in zip(results["cuda", True], results["cuda", False]):
        torch.testing.assert_close(got, want, **tol)
    if dtype == torch.float32:
        for got, want in zip(results["cuda", True], results["cpu", True]):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
def test_fused_backward_on_cuda_is_repeatable_in_deterministic_mode():
    extractor = rotated_extractor(RIROI, channels=8).cuda()
    feats = [f.detach().cuda().requires_grad_(True) for f in pyramid(8)]
    rois = rois_with_sizes([20, 60, 130, 300, 600] * 20).cuda()
    torch.use_deterministic_algorithms(True)
    try:
        out = extractor(feats, rois)
        first, second = (torch.autograd.grad(out, feats, torch.ones_like(out), retain_graph=True)
                         for _ in range(2))
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
