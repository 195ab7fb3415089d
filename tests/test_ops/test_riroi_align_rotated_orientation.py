"""RiRoIAlignRotated's orientation: the output is continuous across orientation boundaries (the
peer's legacy_orientation jumps), and the pooled features of a rotated image equal those of the
image for the RoI turned with it, with clockwise=True."""
import math

import pytest
import torch

from tests._helpers import riroi_call, riroi_case, riroi_rois


# ------------------------------------ orientation: continuity ------------------------------------
def _outputs_around_boundaries(legacy, nO=8, eps=1e-4):
    """Largest change of the output when theta crosses k * 2pi / nO by +-eps, k = -nO..nO."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1, 2 * nO, 24, 24, generator=g, dtype=torch.float64)
    thetas = [k * 2 * math.pi / nO for k in range(-nO, nO + 1)]
    worst = 0.0
    for theta in thetas:
        below, above = (torch.tensor([[0, 12.0, 12.0, 10.0, 7.0, theta + d]], dtype=torch.float64)
                        for d in (-eps, eps))
        change = (riroi_call(x, below, 3, 1.0, nO=nO, legacy=legacy)
                  - riroi_call(x, above, 3, 1.0, nO=nO, legacy=legacy)).abs().max().item()
        worst = max(worst, change)
    return worst, x.abs().max().item()


def test_output_is_continuous_across_orientation_boundaries():
    worst, _ = _outputs_around_boundaries(legacy=False)
    assert worst < 100 * 1e-4  # O(eps): the spatial grid turns by 2e-4 rad, nothing jumps


def test_legacy_orientation_jumps_like_the_peer():
    worst, _ = _outputs_around_boundaries(legacy=True)
    assert worst > 0.3  # jumps by two channels' difference


def test_default_equals_legacy_where_the_neighbour_weight_is_zero():
    x, _ = riroi_case(9)
    step = 2 * math.pi / 8
    rois = torch.tensor([[0, 10.0, 12.0, 9.0, 14.0, k * step] for k in range(-3, 4)],
                        dtype=torch.float64)
    torch.testing.assert_close(riroi_call(x, rois), riroi_call(x, rois, legacy=True), rtol=0, atol=1e-9)


# ---------------------------------- orientation: rotation invariance ----------------------------------
def _equivariant_pair(seed, fields=3, size=21):
    """Features F of an image and F' of the image rotated by 90 degrees (torch.rot90, k=1) about
    the map centre, exactly equivariant for nO = 4: F' = rot90 of F with every field's channels
    cycled by one (F'[c*4 + o] = rot90(F[c*4 + o - 1]))."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(1, fields * 4, size, size, generator=g, dtype=torch.float64)
    rotated = torch.rot90(f.view(1, fields, 4, size, size).roll(1, dims=2), 1, dims=(-2, -1))
    return f, rotated.reshape(f.shape)


def _rotate_roi(roi, size):
    """roi (cx, cy, w, h, theta) after torch.rot90(k=1) of a size x size map: the centre moves to
    (cy, size - 1 - cx); the RoI turns by -pi/2 in the op's angle convention when clockwise=True."""
    b, cx, cy, w, h, theta = roi
    return [b, cy, size - 1 - cx, w, h, theta - math.pi / 2]


@pytest.mark.parametrize("legacy", [False, True])
def test_rotation_invariance_holds_with_clockwise_true(legacy):
    size = 21
    f, f_rotated = _equivariant_pair(10, size=size)
    g = torch.Generator().manual_seed(11)
    rois = riroi_rois(20, 1, size, 1.0, g).tolist()
    rotated = torch.tensor([_rotate_roi(r, size) for r in rois], dtype=torch.float64)
    rois = torch.tensor(rois, dtype=torch.float64)
    ours = riroi_call(f, rois, 3, 1.0, nO=4, clockwise=True, legacy=legacy)
    theirs = riroi_call(f_rotated, rotated, 3, 1.0, nO=4, clockwise=True, legacy=legacy)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-9)


def test_rotation_invariance_fails_with_clockwise_false():
    """With clockwise=False the RoI would have to turn by +pi/2, and the output comes out cycled
    by two channels: the convention matters."""
    size = 21
    f, f_rotated = _equivariant_pair(12, size=size)
    roi = [0, 10.0, 10.0, 9.0, 5.0, 0.3]
    turned = [0, 10.0, 10.0, 9.0, 5.0, 0.3 + math.pi / 2]
    ours = riroi_call(f, torch.tensor([roi], dtype=torch.float64), 3, 1.0, nO=4)
    theirs = riroi_call(f_rotated, torch.tensor([turned], dtype=torch.float64), 3, 1.0, nO=4)
    assert (ours - theirs).abs().max() > 0.1
    cycled = ours.view(1, 3, 4, 3, 3).roll(-2, dims=2).reshape(ours.shape)
    torch.testing.assert_close(cycled, theirs, rtol=0, atol=1e-9)
