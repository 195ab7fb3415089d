"""Another mm-project can use our RoIPool: mmdet's Faster R-CNN config, trained and tested with
mmdet's own tools/train.py and tools/test.py (shipped inside the mmdet package) on a tiny
COCO-format set."""
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import cv2
import mmdet
import numpy as np
import pytest
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from redet_plugin.ops import RoIPool

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/faster_rcnn_roipool/faster-rcnn_r18_fpn_roipool_tiny-coco.py"
MMDET_TOOLS = Path(mmdet.__file__).parent / ".mim" / "tools"


# ---- a tiny COCO-format detection set: filled rectangles and discs on noise ----------------------
COCO_CLASSES = ("box", "disc")


def _draw_image(rng: np.random.Generator, height: int, width: int):
    image = rng.integers(0, 60, size=(height, width, 3), dtype=np.uint8)
    annotations = []
    for category_id in (1, 2):
        w, h = (int(v) for v in rng.integers(20, 40, size=2))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        colour = tuple(int(c) for c in rng.integers(150, 255, size=3))
        if category_id == 1:
            cv2.rectangle(image, (x, y), (x + w - 1, y + h - 1), colour, thickness=-1)
        else:
            cv2.ellipse(image, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, colour, -1)
        annotations.append(dict(category_id=category_id, bbox=[x, y, w, h], area=w * h, iscrowd=0))
    return image, annotations


def write_tiny_coco(root: Path, num_train: int = 8, num_val: int = 2, height: int = 96,
                    width: int = 128, seed: int = 0) -> Path:
    """root/images/*.png, root/annotations/{train,val}.json; returns root."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(COCO_CLASSES)]
    next_ann_id = 1
    for split, count in (("train", num_train), ("val", num_val)):
        images, annotations = [], []
        for index in range(count):
            image_id = len(images) + 1
            file_name = f"{split}_{index:03d}.png"
            image, objects = _draw_image(rng, height, width)
            cv2.imwrite(str(root / "images" / file_name), image)
            images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
            for obj in objects:
                annotations.append(dict(obj, id=next_ann_id, image_id=image_id))
                next_ann_id += 1
        with open(root / "annotations" / f"{split}.json", "w") as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
    return root


def _run_mmdet_tool(script: str, args, cwd: Path) -> str:
    python_path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=python_path)
    result = subprocess.run([sys.executable, str(MMDET_TOOLS / script), *map(str, args)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script} failed:\n{output[-4000:]}"
    return output


def test_config_pools_rois_with_our_roipool():
    cfg = Config.fromfile(str(CONFIG))  # runs custom_imports = ['redet_plugin.mm']
    init_default_scope("mmdet")
    model = MODELS.build(cfg.model)
    layers = model.roi_head.bbox_roi_extractor.roi_layers
    assert len(layers) == 4 and all(type(layer) is RoIPool for layer in layers)
    assert [layer.spatial_scale for layer in layers] == [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def test_mmdet_train_and_test_tools_run_the_config(tmp_path):
    write_tiny_coco(tmp_path / "data" / "tiny_coco", num_train=8, num_val=2)
    work_dir = tmp_path / "work"
    # Relative data paths in the config resolve against cwd; validation is left to test.py.
    train_log = _run_mmdet_tool("train.py", [CONFIG, "--work-dir", work_dir,
                                             "--cfg-options", "train_cfg.val_interval=2"], tmp_path)
    losses = [float(v) for v in re.findall(r"Epoch\(train\) \[1\]\[\d/4\].*? loss: ([0-9.naif]+)",
                                             train_log)]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses), train_log[-3000:]
    checkpoint = work_dir / "epoch_1.pth"
    assert checkpoint.is_file()

    # score_thr 0: a 4-iteration model must still hand boxes to the COCO metric
    test_log = _run_mmdet_tool("test.py", [CONFIG, checkpoint, "--work-dir", work_dir,
                                           "--cfg-options", "model.test_cfg.rcnn.score_thr=0.0"],
                               tmp_path)
    assert re.search(r"Epoch\(test\) \[2/2\].*coco/bbox_mAP: [0-9.]+", test_log), test_log[-3000:]


def _over_mmdet_faster_rcnn(tmp_path, roi_head: str) -> Config:
    """A user config over mmdet's own Faster R-CNN base (merged by mmengine as users get it)."""
    path = tmp_path / "faster-rcnn_r50_fpn_roipool-head.py"
    path.write_text("_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'\n"
                    "custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)\n"
                    f"model = dict(roi_head={roi_head})\n")
    return Config.fromfile(str(path))


def test_roipool_head_over_a_base_roi_head_is_an_error_not_80_classes(tmp_path):
    """The base's bbox_head (num_classes=80) survives the merge: the head must not silently
    train an 81-way classifier for a 3-class set."""
    cfg = _over_mmdet_faster_rcnn(tmp_path, "dict(type='RedetRoIPoolRoIHead', num_classes=3)")
    assert cfg.model.roi_head.bbox_head.num_classes == 80  # what the merge hands the head
    init_default_scope("mmdet")
    with pytest.raises(ValueError, match=r"num_classes=3 but bbox_head\.num_classes=80.*"
                                         r"roi_head=dict\(_delete_=True, type='RedetRoIPoolRoIHead'"):
        MODELS.build(cfg.model)


def test_roipool_head_over_a_base_roi_head_with_delete(tmp_path):
    cfg = _over_mmdet_faster_rcnn(
        tmp_path, "dict(_delete_=True, type='RedetRoIPoolRoIHead', num_classes=3)")
    init_default_scope("mmdet")
    model = MODELS.build(cfg.model)
    head = model.roi_head
    assert head.bbox_head.num_classes == 3 and head.bbox_head.fc_cls.out_features == 4
    assert all(type(layer) is RoIPool for layer in head.bbox_roi_extractor.roi_layers)
    assert head.train_cfg.sampler.num == 512  # the detector still hands the base's rcnn cfg on


def test_roipool_head_over_a_base_roi_head_warns_when_it_would_not_pool_with_roipool(tmp_path):
    cfg = _over_mmdet_faster_rcnn(tmp_path, "dict(type='RedetRoIPoolRoIHead')")  # 80 classes: no conflict
    init_default_scope("mmdet")
    with pytest.warns(UserWarning, match=r"\(SingleRoIExtractor\) pools with mmcv\.ops\.roi_align"
                                         r"\.RoIAlign, not redet_plugin's RoIPool.*_delete_=True"):
        MODELS.build(cfg.model.roi_head)
