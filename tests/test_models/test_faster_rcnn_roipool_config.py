"""Another mm-project can use our RoIPool: mmdet's Faster R-CNN config, trained and tested with
mmdet's own tools/train.py and tools/test.py (shipped inside the mmdet package) on a tiny
COCO-format set."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import mmdet
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope

from redet_plugin.ops import RoIPool

from ._tiny_coco import write_tiny_coco

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs/faster_rcnn_roipool/faster-rcnn_r18_fpn_roipool_tiny-coco.py"
MMDET_TOOLS = Path(mmdet.__file__).parent / ".mim" / "tools"


def _run_mmdet_tool(script: str, args, cwd: Path) -> str:
    python_path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=python_path)
    result = subprocess.run([sys.executable, str(MMDET_TOOLS / script), *map(str, args)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{script} failed:\n{output[-4000:]}"
    return output


def test_config_pools_rois_with_our_roipool():
    cfg = Config.fromfile(str(CONFIG))  # runs custom_imports = ['redet_plugin']
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
