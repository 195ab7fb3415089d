"""Our ReDet box coders against mmrotate-dev 1.0.1's, each built from its project's R50 config:
the same deltas (training targets) and the same decoded boxes (mmrotate clamps stage-2 centres
into the image when given max_shape; so do we)."""
import math
import os.path as osp

import pytest
import torch
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.config import Config
from mmengine.registry import DefaultScope

from tests._helpers import REPO, register_mmrotate

register_mmrotate()
import mmrotate  # noqa: E402
import redet_plugin.mm  # noqa: E402,F401
from mmrotate.registry import TASK_UTILS as MMROTATE_TASK_UTILS  # noqa: E402
from mmrotate.structures import RotatedBoxes  # noqa: E402

OUR_MODEL = osp.join(REPO, 'configs/_base_/models/redet-le90_re50_refpn.py')
MMROTATE_CONFIG = osp.join(osp.dirname(mmrotate.__file__),
                           '.mim/configs/redet/redet-le90_re50_refpn_1x_dota.py')
IMAGE_SHAPE = (200, 300)


def coders(stage: int):
    ours = Config.fromfile(OUR_MODEL).model.roi_head.bbox_head[stage].bbox_coder
    theirs = Config.fromfile(MMROTATE_CONFIG).model.roi_head.bbox_head[stage].bbox_coder
    theirs.use_box_type = False  # plain tensors out, as ours
    with DefaultScope.overwrite_default_scope('mmrotate'):  # names are looked up there first
        theirs = MMROTATE_TASK_UTILS.build(theirs)
    with DefaultScope.overwrite_default_scope('mmdet'):
        return TASK_UTILS.build(ours), theirs


def random_rboxes(n: int, g: torch.Generator) -> torch.Tensor:
    """Centres partly outside the image; angles over the whole le90 range and beyond."""
    centres = torch.rand(n, 2, generator=g) * torch.tensor([340.0, 240.0]) - 20
    sizes = 4 + torch.rand(n, 2, generator=g) * 120
    angles = (torch.rand(n, 1, generator=g) - 0.5) * 2 * math.pi
    return torch.cat([centres, sizes, angles], 1)


def corners(rboxes: torch.Tensor) -> torch.Tensor:
    """(x1, y1, x2, y2) horizontal priors of the rboxes' centres and sizes."""
    return torch.cat([rboxes[:, :2] - rboxes[:, 2:4] / 2, rboxes[:, :2] + rboxes[:, 2:4] / 2], 1)


def assert_same_rboxes(a: torch.Tensor, b: torch.Tensor):
    """Same le90 boxes; the angles may differ by pi where rounding lands on either end."""
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-3, rtol=1e-5)
    turn = torch.remainder(a[:, 4] - b[:, 4] + math.pi / 2, math.pi) - math.pi / 2
    assert turn.abs().max() < 1e-5


@pytest.mark.parametrize('stage', [0, 1])
def test_encode_like_mmrotate(stage):
    ours, theirs = coders(stage)
    g = torch.Generator().manual_seed(stage)
    gts = random_rboxes(500, g)
    priors = random_rboxes(500, g)
    if stage == 0:  # horizontal priors (x1, y1, x2, y2)
        priors = corners(priors)
        expected = theirs.encode(HorizontalBoxes(priors), RotatedBoxes(gts))
    else:
        expected = theirs.encode(RotatedBoxes(priors), RotatedBoxes(gts))
    torch.testing.assert_close(ours.encode(priors, gts), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('stage', [0, 1])
@pytest.mark.parametrize('max_shape', [None, IMAGE_SHAPE])
def test_decode_like_mmrotate(stage, max_shape):
    ours, theirs = coders(stage)
    g = torch.Generator().manual_seed(10 + stage)
    priors = random_rboxes(500, g)
    if stage == 0:
        priors = corners(priors)
    deltas = torch.randn(500, 5, generator=g) * 2
    found = ours.decode(priors, deltas, max_shape=max_shape)
    assert_same_rboxes(found, theirs.decode(priors, deltas, max_shape=max_shape))
    if stage == 1 and max_shape is not None:  # the clamp is in use here
        unclamped = ours.decode(priors, deltas)
        assert ((unclamped[:, 0] < 0) | (unclamped[:, 0] > IMAGE_SHAPE[1] - 1)).any()
        assert found[:, 0].min() >= 0 and found[:, 0].max() <= IMAGE_SHAPE[1] - 1
        assert found[:, 1].min() >= 0 and found[:, 1].max() <= IMAGE_SHAPE[0] - 1
