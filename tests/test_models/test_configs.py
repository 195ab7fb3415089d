"""Every config parses, gets our custom_imports (declared once, where first needed), names only
registered types and builds."""
import glob
import os.path as osp
import re

import pytest
from mmdet.registry import (DATASETS, HOOKS, METRICS, MODEL_WRAPPERS, MODELS, OPTIM_WRAPPERS,
                            OPTIMIZERS, PARAM_SCHEDULERS, TASK_UTILS, TRANSFORMS, VISUALIZERS,
                            LOOPS, DATA_SAMPLERS, VISBACKENDS, LOG_PROCESSORS)
from mmengine.config import Config
from mmengine.registry import DefaultScope

import redet_plugin.mm  # noqa: F401  (registers the mm layer)

from tests._helpers import REPO

CONFIGS = sorted(glob.glob(osp.join(REPO, 'configs/redet/*.py')))
CUSTOM_IMPORTS = dict(imports=['redet_plugin.mm'], allow_failed_imports=False)
# the only configs that declare it: the model base (which every configs/redet config inherits)
# and the configs built on mmdet's or mmrotate's own bases
DECLARE_CUSTOM_IMPORTS = {'configs/_base_/models/redet-le90_re50_refpn.py',
                          'configs/mmrotate/redet-le90_re50_refpn_1x_dota_redet-ops.py',
                          'configs/faster_rcnn_roipool/faster-rcnn_r18_fpn_roipool_tiny-coco.py'}
REGISTRIES = (MODELS, TASK_UTILS, DATASETS, TRANSFORMS, METRICS, VISUALIZERS, HOOKS,
              OPTIM_WRAPPERS, OPTIMIZERS, PARAM_SCHEDULERS, LOOPS, DATA_SAMPLERS, VISBACKENDS,
              LOG_PROCESSORS, MODEL_WRAPPERS)
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
    cfg = Config.fromfile(path)
    assert cfg.custom_imports == CUSTOM_IMPORTS
    unknown = {t for t in types_in(cfg.to_dict()) if t not in MMCV_OPS and
               not any(r.get(t) is not None for r in REGISTRIES)}
    assert not unknown, f'{osp.basename(path)} names unregistered types {sorted(unknown)}'


def test_custom_imports_declared_where_first_needed():
    declaring = set()
    for path in glob.glob(osp.join(REPO, 'configs/**/*.py'), recursive=True):
        with open(path) as f:
            if re.search(r'^custom_imports\s*=', f.read(), re.MULTILINE):
                declaring.add(osp.relpath(path, REPO))
    assert declaring == DECLARE_CUSTOM_IMPORTS


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_config_builds(path):
    cfg = Config.fromfile(path)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        model = MODELS.build(cfg.model)
    assert type(model).__name__ == 'ReDet'


def test_published_setup():
    cfg = Config.fromfile(osp.join(REPO, 'configs/redet/redet-le90_re50_refpn_1x_dota.py'))
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.optim_wrapper.optimizer.lr == 0.005 and cfg.optim_wrapper.clip_grad.max_norm == 35
    assert cfg.train_cfg.max_epochs == 12
    assert cfg.param_scheduler[0].end == 500 and cfg.param_scheduler[1].milestones == [8, 11]
    stage2 = cfg.model.roi_head.bbox_roi_extractor[1].roi_layer
    assert (stage2.type, stage2.output_size, stage2.num_samples, stage2.num_orientations,
            stage2.clockwise) == ('RedetRiRoIAlignRotated', 7, 2, 8, True)
    assert cfg.model.test_cfg.rcnn.nms == dict(type='nms_rotated', iou_threshold=0.1)
    assert cfg.model.train_cfg.rcnn[1].assigner.iou_calculator.type == 'RedetRBboxOverlaps2D'


def extractors(name):
    cfg = Config.fromfile(osp.join(REPO, 'configs/redet', name))
    return [e.to_dict() for e in cfg.model.roi_head.bbox_roi_extractor]


def test_variants_change_only_what_they_state():
    """The variants take their extractors from the base and change one thing each."""
    horizontal, rotated = extractors('redet-le90_re50_refpn_1x_dota.py')
    assert horizontal['roi_layer'] == dict(type='RedetRoIPool', output_size=7)
    roialign = dict(horizontal, roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0))
    assert extractors('redet-le90_re50_refpn_roialign_1x_dota.py') == [roialign, rotated]
    legacy = dict(rotated, roi_layer=dict(rotated['roi_layer'], legacy_orientation=True))
    assert extractors('redet-le90_re50_refpn_mmrotate-compat_1x_dota.py') == [roialign, legacy]
    assert extractors('redet-le90_re18_refpn_tiny-synthetic.py') == [
        dict(horizontal, out_channels=32), dict(rotated, out_channels=32)]


@pytest.mark.parametrize('path', CONFIGS, ids=osp.basename)
def test_learning_rate_is_for_the_configs_own_batch_on_one_gpu(path):
    """tools/train.py --auto-scale-lr scales lr by the total batch over base_batch_size: the
    configs' learning rates are for their batch on one GPU."""
    cfg = Config.fromfile(path)
    assert cfg.auto_scale_lr == dict(enable=False,
                                     base_batch_size=cfg.train_dataloader.batch_size)
