"""ReDet's rotation invariance: rotation-invariant RoI features from equivariant features.

An image rotated by 90 degrees, its ReResNet + ReFPN features pooled by RiRoIAlign (clockwise=True,
le90 angles) with the correspondingly rotated RoIs, gives (nearly) the features of the original.
This pins down that e2cnn's orientation-channel direction and RiRoIAlign's angle convention agree.

Set-up. torch.rot90(image, 1, (2, 3)) turns the image counter-clockwise on screen about its centre
c = (S - 1) / 2: pixel (x, y) goes to (y, S - 1 - x), a box's x axis (cos t, sin t) to
(sin t, -cos t), so a RoI (cx, cy, w, h, t) becomes (cy, S - 1 - cx, w, h, t - pi/2). Rotating about
the image centre is rotating about a RoI's centre followed by a translation; with S = 2**k + 1 every
stride-2 layer samples a grid symmetric about the centre, so the backbone is exactly equivariant
and the only inexact step is the FPN's nearest upsampling between odd sizes (P2-P4; P5, P6 exact).
A plain ResNet + FPN of the same sizes is the yardstick. Pooling runs through the op
(redet_plugin.ops.riroi_align_rotated, when built) and through its plain reference.
"""
import math

import pytest
import torch
from mmdet.models.backbones import ResNet
from mmdet.models.necks import FPN

import redet_plugin.ops
from redet_plugin.models.backbones import ReResNet
from redet_plugin.models.necks import ReFPN
from tests.test_ops._reference import riroi_align_rotated_reference

SIZE = 129  # 2**7 + 1: symmetric strided grids down to stride 64
IN_CHANNELS = [16, 32, 64, 128]
OUT_CHANNELS = 32  # 4 fields x 8 orientations
STRIDES = [4, 8, 16, 32, 64]


HAVE_OP = hasattr(redet_plugin.ops, "riroi_align_rotated")
POOLS = ["reference", pytest.param("op", marks=pytest.mark.skipif(
    not HAVE_OP, reason="redet_plugin.ops.riroi_align_rotated not built yet"))]


def make_pool(kind, clockwise=True):
    """RiRoIAlign as in ReDet's stage 2 (3x3 here, 2 samples, nO 8) by the op or the reference."""
    def pool(features, rois, out_size, spatial_scale):
        if kind == "op":
            return redet_plugin.ops.riroi_align_rotated(
                features, rois, out_size, spatial_scale=spatial_scale, num_samples=2,
                num_orientations=8, clockwise=clockwise)
        return riroi_align_rotated_reference(features, rois, (out_size, out_size), spatial_scale,
                                             num_samples=2, num_orientations=8,
                                             clockwise=clockwise).float()
    return pool


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


@pytest.mark.parametrize("kind", POOLS)
def test_rotated_image_gives_the_same_roi_features(networks, kind):
    equivariant, plain, image = networks
    pool = make_pool(kind)
    errs = pooled_errors(*equivariant, pool, image, torch.Generator().manual_seed(2))
    plain_errs = pooled_errors(*plain, pool, image, torch.Generator().manual_seed(2))
    print(f"[{kind}] ReResNet+ReFPN rel. error per level P2..P6:", [f"{e:.2e}" for e in errs])
    print(f"[{kind}] ResNet+FPN     rel. error per level P2..P6:", [f"{e:.2e}" for e in plain_errs])
    # P5, P6: no upsampling in their path, exact; P2-P4: nearest upsampling between odd sizes
    assert max(errs[3:]) < 1e-4
    assert max(errs) < 0.5
    assert all(e < 0.5 * p for e, p in zip(errs[:3], plain_errs[:3]))
    assert all(e < 1e-3 * p for e, p in zip(errs[3:], plain_errs[3:]))


@pytest.mark.parametrize("kind", POOLS)
def test_symmetric_upsampling_makes_every_level_exact(networks, kind):
    # bilinear with align_corners=True is symmetric between odd sizes: then only float error remains
    (backbone, _), _, image = networks
    neck = ReFPN(IN_CHANNELS, OUT_CHANNELS, num_outs=5,
                 upsample_cfg=dict(mode="bilinear", align_corners=True)).eval()
    errs = pooled_errors(backbone, neck, make_pool(kind), image, torch.Generator().manual_seed(2))
    print(f"[{kind}] ReResNet+ReFPN(bilinear, align_corners) rel. error P2..P6:",
          [f"{e:.2e}" for e in errs])
    assert max(errs) < 1e-4


@pytest.mark.parametrize("kind", POOLS)
def test_wrong_spatial_convention_breaks_invariance(networks, kind):
    # clockwise=False turns the sampling grid the other way: the test tells the conventions apart
    equivariant, _, image = networks
    errs = pooled_errors(*equivariant, make_pool(kind, clockwise=False), image,
                         torch.Generator().manual_seed(2))
    assert min(errs[3:]) > 0.1


@pytest.mark.parametrize("kind", POOLS)
def test_opposite_orientation_direction_breaks_invariance(networks, kind):
    # features whose orientation channels cycle the other way (o -> -o within each field: a +2
    # shift becomes -2) are no longer compensated by RiRoIAlign's shift
    equivariant, _, image = networks
    pool = make_pool(kind)

    def pool_reversed(features, rois, out_size, spatial_scale):
        b, c, h, w = features.shape
        order = (-torch.arange(8)) % 8
        flipped = features.reshape(b, c // 8, 8, h, w)[:, :, order].reshape(b, c, h, w)
        return pool(flipped, rois, out_size, spatial_scale)

    errs = pooled_errors(*equivariant, pool_reversed, image, torch.Generator().manual_seed(2))
    assert min(errs[3:]) > 0.1
