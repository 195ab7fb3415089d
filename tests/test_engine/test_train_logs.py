"""tools/train.py on the tiny synthetic config (RedetRuntimeInfoHook, RedetOptimWrapper) still
logs the losses and the gradient norm: at the LoggerHook's interval, the window's mean of what the
checkpoint's message hub holds for every iteration."""
import glob
import json
import os.path as osp
import sys
import uuid

import numpy as np
import pytest
import torch

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from tests._helpers import own_logger

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY = osp.join(ROOT, 'configs/redet/redet-le90_re18_refpn_tiny-synthetic.py')


def _options(data_root):
    """3 iterations of 2 images (96 px), a log after the 2nd, one epoch and a 2-image val; a
    visualizer and a logger of their own (mmengine keeps one instance per name in the process,
    and names a run's logger after its config and the second it started: a second run with the
    config's names would write its scalars and its log into the first run's folder)."""
    synthetic = ('num_train=6', 'num_val=2', 'image_size=96')
    per_loader = [f'{loader}.{key}' for loader in ('train_dataloader', 'val_dataloader')
                  for key in (f'dataset.data_root={data_root}/', 'num_workers=0',
                              'persistent_workers=False', 'batch_size=2',
                              *(f'dataset.synthetic.{s}' for s in synthetic))]
    return per_loader + ['train_cfg.max_epochs=1', 'default_hooks.logger.interval=2',
                         'randomness.seed=0', f'visualizer.name=train-logs-{uuid.uuid4().hex}',
                         own_logger('train-logs')]


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    sys.path.insert(0, ROOT)
    from tools.train import main
    base = tmp_path_factory.mktemp('train_logs')
    work_dir = str(base / 'work')
    main([TINY, '--work-dir', work_dir, '--cfg-options', *_options(base / 'data')])
    return work_dir


def test_the_log_line_has_the_losses_and_the_gradient_norm(tiny_run):
    log_file, = glob.glob(osp.join(tiny_run, '*', '*.log'))
    with open(log_file) as f:
        lines = [line for line in f if 'Epoch(train)' in line]
    assert len(lines) == 1 and '[2/3]' in lines[0], lines  # (interval 2 of 3 iterations)
    for key in ('grad_norm: ', ' loss: ', 'loss_rpn_cls: ', 'time: '):
        assert key in lines[0], key


def test_the_logged_values_are_the_means_of_every_iterations_values(tiny_run):
    scalars_file, = glob.glob(osp.join(tiny_run, '*', 'vis_data', 'scalars.json'))
    with open(scalars_file) as f:
        logged = [json.loads(line) for line in f]
    step2, = [entry for entry in logged if entry.get('step') == 2 and 'loss' in entry]
    hub = torch.load(osp.join(tiny_run, 'epoch_1.pth'), weights_only=False)['message_hub']
    for key in ('loss', 'grad_norm', 's1.loss_bbox'):
        history = hub['log_scalars'][f'train/{key}'].data[0]
        assert len(history) == 3, key  # every iteration's value, flushed before the checkpoint
        assert np.all(np.isfinite(history)) and np.all(history > 0), key
        assert step2[key] == pytest.approx(history[:2].mean(), rel=1e-4, abs=1e-4), key


@pytest.mark.parametrize('config', [TINY, 'configs/redet/redet-le90_re50_refpn_1x_dota.py'])
def test_the_configs_log_without_waiting(config):
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(ROOT, config))
    assert cfg.default_hooks.runtime_info.type == 'RedetRuntimeInfoHook'
    assert cfg.optim_wrapper.type == 'RedetOptimWrapper'
    assert cfg.model.data_preprocessor.non_blocking is True
