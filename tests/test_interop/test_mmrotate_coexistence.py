"""redet_plugin beside mmrotate-dev 1.0.1 in one process: either import order, both box types,
both DOTA pipelines, and our detector trained on mmrotate's RotatedBoxes."""
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mmdet.structures.bbox import get_box_type
from mmengine.registry import init_default_scope

from tests._helpers import MMROTATE_STAND_IN_CODE, register_mmrotate

REPO = Path(__file__).resolve().parents[2]

register_mmrotate()
import redet_plugin.mm  # noqa: E402,F401
from mmrotate.structures import RotatedBoxes as MMRotateRotatedBoxes  # noqa: E402
from redet_plugin.structures import RotatedBoxes  # noqa: E402

IMPORT_MMROTATE = MMROTATE_STAND_IN_CODE + """
from mmrotate.utils import register_all_modules
register_all_modules(init_default_scope=False)
"""
IMPORT_OURS = "import redet_plugin.mm\n"
CHECK = """
from mmdet.structures.bbox import get_box_type
from mmdet.registry import MODELS
from mmrotate.registry import MODELS as ROTATE_MODELS
assert get_box_type('rbox')[1].__module__.startswith('mmrotate.')
assert get_box_type('redet_rbox')[1].__module__.startswith('redet_plugin.')
assert MODELS.get('RedetRiRoIAlignRotated').__module__.startswith('redet_plugin.')
assert ROTATE_MODELS.get('ReResNet').__module__.startswith('mmrotate.')
assert ROTATE_MODELS.get('mmdet.RedetReResNet').__module__.startswith('redet_plugin.')
print('both registered')
"""


@pytest.mark.parametrize("order", ["mmrotate_first", "redet_plugin_first"])
def test_both_projects_import_and_register_in_either_order(order):
    first, second = ((IMPORT_MMROTATE, IMPORT_OURS) if order == "mmrotate_first"
                     else (IMPORT_OURS, IMPORT_MMROTATE))
    result = subprocess.run([sys.executable, "-c", first + second + textwrap.dedent(CHECK)],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "both registered" in result.stdout


def test_box_types_are_distinct_and_convert_alike():
    assert get_box_type('rbox')[1] is MMRotateRotatedBoxes
    assert get_box_type('redet_rbox')[1] is RotatedBoxes
    t = torch.tensor([[50.0, 40.0, 30.0, 10.0, 0.3], [20.0, 20.0, 8.0, 16.0, -1.2]])
    ours, theirs = RotatedBoxes(t), MMRotateRotatedBoxes(t)
    torch.testing.assert_close(ours.convert_to('hbox').tensor, theirs.convert_to('hbox').tensor)
    torch.testing.assert_close(ours.areas, theirs.areas)


def _write_dota(root: Path, objects) -> None:
    """One 128x128 image and its annotation, without the imagesource/gsd header (mmrotate's
    split tool writes none, and mmrotate's reader takes every line as an object)."""
    for sub in ("images", "annfiles"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(root / "images" / "P0001.png"), np.full((128, 128, 3), 90, np.uint8))
    lines = [" ".join(f"{v:.1f}" for v in poly) + f" {name} 0" for poly, name in objects]
    (root / "annfiles" / "P0001.txt").write_text("\n".join(lines) + "\n")


def test_both_dota_pipelines_side_by_side(tmp_path):
    objects = [((20, 20, 60, 20, 60, 40, 20, 40), "plane"),
               ((80, 70, 110, 100, 100, 110, 70, 80), "ship")]
    _write_dota(tmp_path, objects)
    from mmdet.registry import DATASETS
    from mmrotate.registry import DATASETS as ROTATE_DATASETS
    init_default_scope('mmrotate')
    theirs = ROTATE_DATASETS.build(dict(
        type='DOTADataset', data_root=str(tmp_path), ann_file='annfiles/',
        data_prefix=dict(img_path='images/'), test_mode=True,
        pipeline=[dict(type='mmdet.LoadImageFromFile'),
                  dict(type='mmdet.LoadAnnotations', with_bbox=True, box_type='qbox'),
                  dict(type='ConvertBoxType', box_type_mapping=dict(gt_bboxes='rbox'))]))
    init_default_scope('mmdet')
    ours = DATASETS.build(dict(
        type='RedetDOTADataset', data_root=str(tmp_path), ann_file='annfiles/',
        data_prefix=dict(img_path='images/'), metainfo=dict(classes=('plane', 'ship')),
        test_mode=True,
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations', with_bbox=True, box_type='redet_rbox')]))
    a, b = theirs[0], ours[0]
    assert isinstance(a['gt_bboxes'], MMRotateRotatedBoxes)
    assert isinstance(b['gt_bboxes'], RotatedBoxes)
    # the same rectangles (le90 both: the angle may differ by pi for the same box)
    torch.testing.assert_close(a['gt_bboxes'].areas, b['gt_bboxes'].areas, atol=1e-2, rtol=1e-3)
    torch.testing.assert_close(a['gt_bboxes'].centers, b['gt_bboxes'].centers, atol=1e-3, rtol=0)
    assert [theirs.metainfo['classes'][i] for i in a['gt_bboxes_labels']] == ['plane', 'ship']
    assert [ours.metainfo['classes'][i] for i in b['gt_bboxes_labels']] == ['plane', 'ship']


def test_our_detector_trains_on_mmrotate_boxes():
    from mmdet.registry import MODELS
    from tests._helpers import make_samples, tiny_model_cfg
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(tiny_model_cfg())
    model.init_weights()
    samples = make_samples()
    for sample in samples:
        sample.gt_instances.bboxes = MMRotateRotatedBoxes(sample.gt_instances.bboxes)
    losses = model.loss(torch.randn(2, 3, 128, 128), samples)
    total = sum(v.sum() if isinstance(v, torch.Tensor) else sum(v) for k, v in losses.items()
                if 'loss' in k)
    assert torch.isfinite(total)
    total.backward()


def test_our_rotate90_transform_keeps_mmrotate_boxes():
    from mmdet.registry import TRANSFORMS
    init_default_scope('mmdet')
    rotate = TRANSFORMS.build(dict(type='RedetRandomRotate90', prob=1.0, turns=(1,)))
    boxes = MMRotateRotatedBoxes(torch.tensor([[30.0, 20.0, 20.0, 10.0, 0.0]]))
    out = rotate(dict(img=np.zeros((64, 96, 3), np.uint8), gt_bboxes=boxes,
                      gt_bboxes_labels=np.array([0]), gt_ignore_flags=np.array([False])))
    assert isinstance(out['gt_bboxes'], MMRotateRotatedBoxes)
    cx, cy, w, h, theta = out['gt_bboxes'].tensor[0].tolist()
    assert (cx, cy, w, h) == pytest.approx((64 - 20.0, 30.0, 20.0, 10.0))
    assert abs(abs(theta) - math.pi / 2) < 1e-6
