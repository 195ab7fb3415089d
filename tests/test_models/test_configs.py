"""Every config parses, starts with our custom_imports, and names only registered types."""
import glob
import os.path as osp

import pytest
from mmdet.registry import (DATASETS, HOOKS, METRICS, MODELS, OPTIM_WRAPPERS, OPTIMIZERS,
                            PARAM_SCHEDULERS, TASK_UTILS, TRANSFORMS, VISUALIZERS, LOOPS,
                            DATA_SAMPLERS, VISBACKENDS, LOG_PROCESSORS)
from mmengine.config import Config

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs/redet/*.py')))
REGISTRIES = (MODELS, TASK_UTILS, DATASETS, TRANSFORMS, METRICS, VISUALIZERS, HOOKS,
              OPTIM_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS, LOOPS, DATA_SAMPLERS, VISBACKENDS,
              LOG_PROCESSORS)
# roi layers that mmdet's extractors find in mmcv.ops rather than in a registry
MMCV_OPS = {'RoIAlign', 'nms', 'nms_rotated'}


def types_in(node):
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            yield node['type']
        for value in node.values():
            yield from types_in(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from types_in(value)


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_parses_and_names_registered_types(path):
    with open(path) as f:
        assert "custom_imports = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)" \
            in f.read()
    cfg = Config.fromfile(path)
    unknown = {t for t in types_in(cfg.to_dict()) if t not in MMCV_OPS and
               not any(r.get(t) is not None for r in REGISTRIES)}
    assert not unknown, f'{osp.basename(path)} names unregistered types {sorted(unknown)}'


def test_published_setup():
    cfg = Config.fromfile(osp.join(ROOT, 'configs/redet/redet_re50_refpn_1x_dota.py'))
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.optim_wrapper.optimizer.lr == 0.005 and cfg.optim_wrapper.clip_grad.max_norm == 35
    assert cfg.train_cfg.max_epochs == 12
    assert cfg.param_scheduler[0].end == 500 and cfg.param_scheduler[1].milestones == [8, 11]
    stage2 = cfg.model.roi_head.bbox_roi_extractor[1].roi_layer
    assert (stage2.type, stage2.output_size, stage2.num_samples, stage2.num_orientations,
            stage2.clockwise) == ('RedetRiRoIAlignRotated', 7, 2, 8, True)
    assert cfg.model.test_cfg.rcnn.nms == dict(type='nms_rotated', iou_threshold=0.1)
    assert cfg.model.train_cfg.rcnn[1].assigner.iou_calculator.type == 'RedetRBboxOverlaps2D'


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_learning_rate_is_for_the_configs_own_batch_on_one_gpu(path):
    """tools/train.py --auto-scale-lr scales lr by the total batch over base_batch_size: the
    configs' learning rates are for their batch on one GPU."""
    cfg = Config.fromfile(path)
    assert cfg.auto_scale_lr == dict(enable=False,
                                     base_batch_size=cfg.train_dataloader.batch_size)
