"""tools/train.py with model.cuda_graph_step on the tiny synthetic config, with mmengine's EMAHook,
a checkpoint and a validation after each epoch, then a resume: the EMA model follows the
parameters the steps produce, the checkpoints hold both, and the resumed run trains on.

On a GPU the steps are captured (and captured again after the resume: the loaded state replaces
the tensors a graph reads); on the CPU they run eagerly with one line saying why, which checks
the same plumbing."""
import copy
import glob
import os.path as osp
import sys

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

import redet_plugin.mm  # noqa: F401  (registers the mm layer)
from tests.test_engine.test_train_logs import ROOT, TINY, _options

EMA = dict(type='EMAHook', ema_type='ExpMomentumEMA', momentum=0.01, update_buffers=True,
           priority=49)


@HOOKS.register_module(force=True)
class RecordedStates(Hook):
    """The model's state before training and after every iteration (on the CPU)."""

    priority = 'LOWEST'
    states = []

    @staticmethod
    def _state(runner):
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def before_train(self, runner):
        type(self).states = [self._state(runner)]

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.states.append(self._state(runner))


def _config(tmp_path):
    path = tmp_path / 'captured.py'
    path.write_text(
        f"_base_ = [{TINY!r}]\n"
        "model = dict(cuda_graph_features=False,\n"
        "             cuda_graph_step=dict(warmup_iters=1, min_gt_capacity=16))\n"
        f"custom_hooks = [{EMA!r}, dict(type='RecordedStates')]\n"
        "train_cfg = dict(max_epochs=2, val_interval=1)\n")  # (3 iterations an epoch)
    return str(path)


def _train(config, work_dir, data_root, *extra):
    sys.path.insert(0, ROOT)
    from tools.train import main
    options = [o for o in _options(data_root) if not o.startswith('train_cfg.max_epochs')]
    main([config, '--work-dir', str(work_dir), *extra, '--cfg-options', *options])
    log_file, = glob.glob(osp.join(work_dir, '*', '*.log'))
    with open(log_file) as f:
        return f.read()


def _expected_step_line():
    return ('cuda_graph_step: captured a training step' if torch.cuda.is_available() else
            'cuda_graph_step: eager: the inputs are not on a CUDA device')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp('captured_training')
    config = _config(base)
    log = _train(config, base / 'work', base / 'data')
    return config, base, log, list(RecordedStates.states)


def test_training_with_ema_validation_and_checkpoints(run):
    _, base, log, states = run
    assert _expected_step_line() in log
    assert len(states) == 1 + 6  # (3 iterations per epoch)
    assert all(torch.isfinite(v).all() for k, v in states[-1].items() if v.is_floating_point())
    assert any(not torch.equal(states[0][k], v) for k, v in states[-1].items())  # it trained
    # the EMA equals mmdet's ExpMomentumEMA fed with the parameters of every step
    from mmdet.models.layers import ExpMomentumEMA
    from mmdet.registry import MODELS
    from mmengine.config import Config
    cfg = Config.fromfile(_config(base))
    model = MODELS.build(cfg.model)
    model.load_state_dict(states[0])
    ema_args = {k: v for k, v in EMA.items() if k in ('momentum', 'update_buffers')}
    expected = ExpMomentumEMA(copy.deepcopy(model), **ema_args)
    for state in states[1:]:
        model.load_state_dict(state)
        expected.update_parameters(model)
    checkpoint = torch.load(base / 'work' / 'epoch_2.pth', map_location='cpu',
                            weights_only=False)
    # (EMAHook saves the EMA weights as the state_dict, the model's under ema_state_dict)
    for key, value in expected.module.state_dict().items():
        torch.testing.assert_close(checkpoint['state_dict'][key], value, rtol=1e-5, atol=1e-6,
                                   msg=key)
        torch.testing.assert_close(checkpoint['ema_state_dict'][f'module.{key}'],
                                   states[-1][key], rtol=0, atol=0, msg=key)


def test_a_resumed_run_trains_on(run, tmp_path):
    config, base, _, _ = run
    log = _train(config, tmp_path / 'resumed', base / 'data', '--resume',
                 str(base / 'work' / 'epoch_1.pth'))
    assert 'resumed epoch: 1, iter: 3' in log
    assert _expected_step_line() in log
    states = RecordedStates.states
    assert len(states) == 1 + 3  # epoch 2 only
    checkpoint = torch.load(tmp_path / 'resumed' / 'epoch_2.pth', map_location='cpu',
                            weights_only=False)
    assert int(checkpoint['ema_state_dict']['steps']) == 6  # the EMA resumed with the run
    assert all(torch.isfinite(v).all() for v in checkpoint['state_dict'].values()
               if v.is_floating_point())
