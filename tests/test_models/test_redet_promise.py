"""The detector's promise (ReDet): rotation-invariant RoI features from equivariant features.

An image rotated by 90 degrees, its ReResNet + ReFPN features pooled by RiRoIAlign (clockwise=True,
le90 angles) with the correspondingly rotated RoIs, gives (nearly) the features of the original.
This pins down that e2cnn's orientation-channel direction and RiRoIAlign's angle convention agree.

Set-up. torch.rot90(image, 1, (2, 3)) turns the image counter-clockwise on screen about its centre
c = (S - 1) / 2: pixel (x, y) goes to (y, S - 1 - x), a box's x axis (cos t, sin t) to
(sin t, -cos t), so a RoI (cx, cy, w, h, t) becomes (cy, S - 1 - cx, w, h, t - pi/2). Rotating about
the image centre is rotating about a RoI's centre followed by a translation; with S = 2**k + 1 every
stride-2 layer samples a grid symmetric about the centre, so the backbone is exactly equivariant
and the only inexact step is the FPN's nearest upsampling between odd sizes (P2-P4; P5, P6 exact).
A plain ResNet + FPN of the same sizes is the yardstick.
"""
import math

import pytest
import torch
from mmdet.models.backbones import ResNet
from mmdet.models.necks import FPN

import redet_plugin.ops
from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.necks import ReFPN

SIZE = 129  # 2**7 + 1: symmetric strided grids down to stride 64
IN_CHANNELS = [16, 32, 64, 128]
OUT_CHANNELS = 32  # 4 fields x 8 orientations
STRIDES = [4, 8, 16, 32, 64]


def riroi_align_reference(features, rois, out_size, spatial_scale, num_samples, num_orientations,
                          clockwise):
    """Plain-PyTorch RiRoIAlignRotated (continuous orientation interpolation, mmcv border rules)."""
    n_o = num_orientations
    pooled = []
    for roi in rois.double():
        b, cx, cy, w, h, theta = roi.tolist()
        fmap = features[int(b)].double()
        cx, cy = cx * spatial_scale, cy * spatial_scale
        w, h = max(w * spatial_scale, 1.0), max(h * spatial_scale, 1.0)
        gh = num_samples or math.ceil(h / out_size)
        gw = num_samples or math.ceil(w / out_size)
        ys = -h / 2 + (torch.arange(out_size * gh, dtype=torch.float64) + 0.5) * h / (out_size * gh)
        xs = -w / 2 + (torch.arange(out_size * gw, dtype=torch.float64) + 0.5) * w / (out_size * gw)
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        t = -theta if clockwise else theta
        y = yy * math.cos(t) - xx * math.sin(t) + cy
        x = yy * math.sin(t) + xx * math.cos(t) + cx
        values = _bilinear(fmap, y, x).view(-1, out_size, gh, out_size, gw).mean(dim=(2, 4))
        a = theta * n_o / (2 * math.pi)
        shift, frac = math.floor(a), a - math.floor(a)
        values = values.view(-1, n_o, out_size, out_size)
        o = torch.arange(n_o)
        main, neighbour = values[:, (o - shift) % n_o], values[:, (o - shift - 1) % n_o]
        pooled.append(((1 - frac) * main + frac * neighbour).reshape(-1, out_size, out_size))
    return torch.stack(pooled).to(features.dtype)


def _bilinear(fmap, y, x):
    """mmcv's bilinear read: 0 beyond one pixel outside the map, clamped onto the border within it."""
    height, width = fmap.shape[-2:]
    inside = (y >= -1) & (y <= height) & (x >= -1) & (x <= width)
    y, x = y.clamp(0, height - 1), x.clamp(0, width - 1)
    y0, x0 = y.floor().long(), x.floor().long()
    y1, x1 = (y0 + 1).clamp(max=height - 1), (x0 + 1).clamp(max=width - 1)
    ly, lx = y - y0, x - x0
    value = (fmap[:, y0, x0] * (1 - ly) * (1 - lx) + fmap[:, y0, x1] * (1 - ly) * lx
             + fmap[:, y1, x0] * ly * (1 - lx) + fmap[:, y1, x1] * ly * lx)
    return value * inside


def _riroi_op(features, rois, out_size, spatial_scale):
    return redet_plugin.ops.riroi_align_rotated(features, rois, out_size, spatial_scale=spatial_scale,
                                                num_samples=2, num_orientations=8, clockwise=True)


def _riroi_reference(features, rois, out_size, spatial_scale, clockwise=True):
    return riroi_align_reference(features, rois, out_size, spatial_scale, num_samples=2,
                                 num_orientations=8, clockwise=clockwise)


def rotate_rois(rois, size):
    """The RoIs of the image turned by torch.rot90(k=1): (cy, S-1-cx, w, h, theta - pi/2)."""
    b, cx, cy, w, h, theta = rois.unbind(1)
    return torch.stack([b, cy, size - 1 - cx, w, h, theta - math.pi / 2], dim=1)


def level_rois(stride, size, generator):
    """RoIs a few feature pixels big, some centred on the image centre, some off it, random angles."""
    c = (size - 1) / 2
    k = 6
    centres = torch.tensor([[c, c]]) + (torch.rand(k, 2, generator=generator) - 0.5) * stride * 2
    centres[0] = c
    sizes = stride * (1.0 + 2.0 * torch.rand(k, 2, generator=generator))
    theta = (torch.rand(k, 1, generator=generator) * 2 - 1) * math.pi
    return torch.cat([torch.zeros(k, 1), centres, sizes, theta], dim=1)


def pooled_errors(backbone, neck, pool, image, generator):
    """Relative error between pooled features of the original and of the rotated image, per level."""
    with torch.no_grad():
        feats = neck(backbone(image))
        feats_rot = neck(backbone(torch.rot90(image, 1, (2, 3))))
    errors = []
    for stride, f, f_rot in zip(STRIDES, feats, feats_rot):
        size = image.shape[-1]
        rois = level_rois(stride, size, generator)
        a = pool(f, rois, 3, 1.0 / stride)
        b = pool(f_rot, rotate_rois(rois, size), 3, 1.0 / stride)
        errors.append(((b - a).norm() / a.norm()).item())
    return errors


@pytest.fixture(scope="module")
def networks():
    torch.manual_seed(0)
    equivariant = (ReResNet(depth=18, base_channels=16).eval(),
                   ReFPN(IN_CHANNELS, OUT_CHANNELS, num_outs=5).eval())
    plain = (ResNet(depth=18, base_channels=16), FPN(IN_CHANNELS, OUT_CHANNELS, num_outs=5))
    for m in plain:
        m.eval()  # mmdet's ResNet.train returns None, so no chaining
    image = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    return equivariant, plain, image


def _check_promise(networks, pool):
    equivariant, plain, image = networks
    errs = pooled_errors(*equivariant, pool, image, torch.Generator().manual_seed(2))
    plain_errs = pooled_errors(*plain, pool, image, torch.Generator().manual_seed(2))
    print("ReResNet+ReFPN rel. error per level P2..P6:", [f"{e:.2e}" for e in errs])
    print("ResNet+FPN     rel. error per level P2..P6:", [f"{e:.2e}" for e in plain_errs])
    # P5, P6: no upsampling in their path, exact; P2-P4: nearest upsampling between odd sizes
    assert max(errs[3:]) < 1e-4
    assert max(errs) < 0.5
    assert all(e < 0.5 * p for e, p in zip(errs[:3], plain_errs[:3]))
    assert all(e < 1e-3 * p for e, p in zip(errs[3:], plain_errs[3:]))
    return errs


def test_promise_with_riroi_reference(networks):
    _check_promise(networks, _riroi_reference)


def test_symmetric_upsampling_makes_every_level_exact(networks):
    # bilinear with align_corners=True is symmetric between odd sizes: then only float error remains
    (backbone, _), _, image = networks
    neck = ReFPN(IN_CHANNELS, OUT_CHANNELS, num_outs=5,
                 upsample_cfg=dict(mode="bilinear", align_corners=True)).eval()
    errs = pooled_errors(backbone, neck, _riroi_reference, image, torch.Generator().manual_seed(2))
    print("ReResNet+ReFPN(bilinear, align_corners) rel. error P2..P6:", [f"{e:.2e}" for e in errs])
    assert max(errs) < 1e-4


def test_wrong_spatial_convention_breaks_the_promise(networks):
    # clockwise=False turns the sampling grid the other way: the test tells the conventions apart
    equivariant, _, image = networks
    errs = pooled_errors(*equivariant, lambda f, r, o, s: _riroi_reference(f, r, o, s, clockwise=False),
                         image, torch.Generator().manual_seed(2))
    assert min(errs[3:]) > 0.1


@pytest.mark.skipif(not hasattr(redet_plugin.ops, "riroi_align_rotated"),
                    reason="redet_plugin.ops.riroi_align_rotated not built yet")
def test_promise_with_riroi_op(networks):
    _check_promise(networks, _riroi_op)
