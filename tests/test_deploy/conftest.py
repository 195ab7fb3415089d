"""Shared by the deploy tests: a tiny ReDet checkpoint that gives real detections, images, and
the packages exported from it (each made once per session: an export takes seconds, a
compile minutes)."""
import cv2
import numpy as np
import pytest
import torch

from tests._helpers import once_per_run

CONFIG = 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py'
CLASSES = ('plane', 'ship', 'storage-tank', 'small-vehicle', 'tennis-court')
IMAGE_SIZE = (128, 160)  # (H, W): not square, and W not a multiple of 32 (the padded input)


@pytest.fixture(scope='session')
def tiny_checkpoint(tmp_path_factory):
    """The tiny config's model from seed 0, its classifiers' weights scaled so that the random
    features give scores spread far apart (an untrained model scores every class near 1/6)."""
    return once_per_run(tmp_path_factory, 'tiny_checkpoint', lambda: _save_tiny_checkpoint(
        str(tmp_path_factory.mktemp('ckpt') / 'tiny.pth')))


def _save_tiny_checkpoint(path):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    import redet_plugin.mm  # noqa: F401
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(CONFIG).model)
    model.init_weights()
    state = model.state_dict()
    for stage in (0, 1):
        state[f'roi_head.bbox_head.{stage}.fc_cls.weight'] *= 100.0
    torch.save(dict(state_dict=state, meta=dict(dataset_meta=dict(classes=CLASSES))), path)
    return path


@pytest.fixture(scope='session')
def images():
    """Three BGR uint8 images of IMAGE_SIZE: blurred noise with bright rotated bars."""
    found = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        image = cv2.GaussianBlur(rng.integers(0, 256, (*IMAGE_SIZE, 3)).astype(np.uint8), (0, 0), 2)
        for _ in range(4):
            centre = rng.uniform(20, min(IMAGE_SIZE) - 20, 2)
            box = ((float(centre[0]), float(centre[1])), tuple(rng.uniform(10, 40, 2)),
                   float(rng.uniform(0, 180)))
            corners = cv2.boxPoints(box).astype(np.int32)
            cv2.fillPoly(image, [corners], tuple(int(v) for v in rng.integers(150, 256, 3)))
        found.append(image)
    return found


@pytest.fixture(scope='session')
def program_package(tiny_checkpoint, tmp_path_factory):
    from redet_plugin.inference.export import export_detector
    return once_per_run(tmp_path_factory, 'program_package', lambda: export_detector(
        CONFIG, tiny_checkpoint, str(tmp_path_factory.mktemp('program') / 'tiny.pt2'),
        image_size=IMAGE_SIZE))


@pytest.fixture(scope='session')
def compiled_package(tiny_checkpoint, tmp_path_factory):
    """The AOTInductor-compiled package (about 2 minutes on a 2-core CPU); the compile's
    seconds are printed (pytest -s shows them)."""
    import time
    from redet_plugin.inference.export import export_detector

    def compile_package():
        out = str(tmp_path_factory.mktemp('compiled') / 'tiny_compiled.pt2')
        start = time.perf_counter()
        path = export_detector(CONFIG, tiny_checkpoint, out, image_size=IMAGE_SIZE, compile=True)
        print(f'\nexport + AOTInductor compile of the tiny ReDet ({IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}, '
              f'CPU): {time.perf_counter() - start:.0f} s')
        return path
    return once_per_run(tmp_path_factory, 'compiled_package', compile_package)
